"""Evaluate Cloud Logging queries against LogEntry dicts, for the subset of the language our sinks use.

The product's sink filters live in ``sinks/*.filter``; Terraform sends them to Cloud Logging and the
sandbox's log router evaluates them here, so both see the same text. Supported:

* boolean structure: implicit AND between terms (and lines), ``AND``, ``OR``, ``NOT`` and the ``-``
  prefix, parentheses. As in Cloud Logging, ``OR`` binds tighter than ``AND`` (``a OR b c`` is
  ``(a OR b) AND c``) and ``NOT`` binds tightest. Keywords must be upper case.
* comparisons ``path OP value`` with ``=``, ``!=``, ``:`` (has: case-insensitive substring for
  strings, a search through nested values for objects), ``=~`` / ``!~`` (regular expression search),
  ``<``, ``<=``, ``>``, ``>=`` (numbers numerically, ``severity`` by level, other strings in
  lexicographic order, which is chronological for RFC 3339 timestamps), and ``path:*`` (presence).
* paths with quoted segments (``labels."logging.gke.io/top_level_controller_type"``); a repeated
  field matches when any element does.
* values: quoted strings, bare words (``k8s_pod``, ``true``), numbers, and OR-lists
  ``path = ("a" OR "b")``.
* ``--`` comments to the end of a line.

Semantics this evaluator fixes where Cloud Logging leaves room: ``=`` on strings is exact (case
sensitive), and ``a != v`` is ``NOT a = v`` (so it also matches entries without ``a``). Anything
else (global text restrictions, functions such as ``SEARCH()``, lower-case keywords, ``AND`` inside
a value list) is rejected with a ValueError when the filter is loaded, never silently misread.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

_MISSING = object()

_SEVERITIES = {
    "DEFAULT": 0,
    "DEBUG": 100,
    "INFO": 200,
    "NOTICE": 300,
    "WARNING": 400,
    "ERROR": 500,
    "CRITICAL": 600,
    "ALERT": 700,
    "EMERGENCY": 800,
}

# Longest first so that "=~" is not read as "=" followed by a value starting with "~".
_OPERATORS = ("=~", "!~", "!=", ">=", "<=", "=", ">", "<", ":")
_IDENT = re.compile(r"[A-Za-z_@][A-Za-z0-9_@\-]*")
_BARE_VALUE = re.compile(r"[^\s()\"]+")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_TEMPLATE_TOKEN = re.compile(r"\$\$\{|%%\{|\$\{([^}]*)\}|%\{")
_TEMPLATE_NAME = re.compile(r"~?\s*([A-Za-z_][A-Za-z0-9_-]*)\s*~?")

Predicate = Callable[[Mapping[str, Any]], bool]


def render_template(text: str, substitutions: Mapping[str, str]) -> str:
    """Substitute ``${name}`` like Terraform's ``templatefile`` does for a template of plain references.

    ``$${`` and ``%%{`` are the escapes for a literal ``${`` / ``%{``. A reference to a name that is
    not in ``substitutions`` is an error (as in Terraform), and so is any template expression or
    ``%{`` directive beyond a bare name: the sink files must stay evaluable by both.
    """

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"
        if token == "%%{":
            return "%{"
        if token == "%{":
            raise ValueError("template directives (%{...}) are not supported in sink filters")
        inner = match.group(1)
        name_match = _TEMPLATE_NAME.fullmatch(inner)
        if name_match is None:
            raise ValueError(f"unsupported template expression ${{{inner}}}: only ${{name}} is allowed")
        name = name_match.group(1)
        if name not in substitutions:
            raise ValueError(f"template references ${{{name}}} but no value was given for {name!r}")
        return str(substitutions[name])

    return _TEMPLATE_TOKEN.sub(replace, text)


@dataclasses.dataclass(frozen=True)
class LogFilter:
    """A parsed filter: ``text`` is the query after substitution, ``matches`` evaluates it."""

    text: str
    _predicate: Predicate = dataclasses.field(repr=False, compare=False)

    def matches(self, entry: Mapping[str, Any]) -> bool:
        """True when the LogEntry dict is selected by this filter (what the sink would export)."""
        return bool(self._predicate(entry))


def parse_filter(text: str) -> LogFilter:
    """Parse a Logging query; raises ValueError (with the position) for syntax outside the subset."""
    return LogFilter(text=text, _predicate=_Parser(text).parse())


def load_filter(path: Path, substitutions: Mapping[str, str]) -> LogFilter:
    """Read a ``sinks/*.filter`` file, substitute its ``${...}`` placeholders and parse it."""
    raw = Path(path).read_text(encoding="utf-8")
    try:
        return parse_filter(render_template(raw, substitutions))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


# --- evaluation helpers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Literal:
    text: str
    quoted: bool


def _resolve(entry: Any, segments: tuple[str, ...]) -> list[Any]:
    """All values at ``segments`` (fanning out over lists); empty when the path is absent."""
    found: list[Any] = []

    def walk(node: Any, depth: int) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, depth)
            return
        if depth == len(segments):
            if node is not None:
                found.append(node)
            return
        if isinstance(node, Mapping):
            child = node.get(segments[depth], _MISSING)
            if child is not _MISSING:
                walk(child, depth + 1)

    walk(entry, 0)
    return found


def _scalars(node: Any) -> Iterator[Any]:
    if isinstance(node, Mapping):
        for value in node.values():
            yield from _scalars(value)
    elif isinstance(node, list):
        for value in node:
            yield from _scalars(value)
    elif node is not None:
        yield node


def _as_number(text: str) -> float | None:
    return float(text) if _NUMBER.fullmatch(text) else None


def _equals(value: Any, literal: _Literal) -> bool:
    if isinstance(value, bool):
        return literal.text.lower() == ("true" if value else "false")
    if isinstance(value, int | float):
        number = _as_number(literal.text)
        return number is not None and float(value) == number
    if isinstance(value, str):
        return value == literal.text
    return False


def _has(value: Any, literal: _Literal) -> bool:
    if isinstance(value, Mapping | list):
        return any(_has(item, literal) for item in _scalars(value))
    if isinstance(value, bool | int | float):
        return _equals(value, literal)
    return isinstance(value, str) and literal.text.lower() in value.lower()


def _order_key(path: tuple[str, ...], value: Any, literal: _Literal) -> tuple[float, float] | None:
    if path == ("severity",) and isinstance(value, str):
        left, right = _SEVERITIES.get(value.upper()), _SEVERITIES.get(literal.text.upper())
        return None if left is None or right is None else (float(left), float(right))
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = _as_number(literal.text)
        return None if number is None else (float(value), number)
    return None


def _compare(op: str, path: tuple[str, ...], value: Any, literal: _Literal) -> bool:
    key = _order_key(path, value, literal)
    if key is not None:
        return _ordered(op, key[0], key[1])
    if isinstance(value, str):
        return _ordered(op, value, literal.text)
    return False


def _ordered(op: str, left: Any, right: Any) -> bool:
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _comparison(path: tuple[str, ...], op: str, literals: list[_Literal]) -> Predicate:
    if op in ("=~", "!~"):
        patterns = [re.compile(lit.text) for lit in literals]

        def regex(entry: Mapping[str, Any]) -> bool:
            values = [v for v in _resolve(entry, path) if isinstance(v, str)]
            hit = any(p.search(v) for p in patterns for v in values)
            return hit if op == "=~" else not hit

        return regex

    def compare(entry: Mapping[str, Any]) -> bool:
        values = _resolve(entry, path)
        if op in ("=", "!="):
            hit = any(_equals(v, lit) for v in values for lit in literals)
            return hit if op == "=" else not hit
        if op == ":":
            return any(_has(v, lit) for v in values for lit in literals)
        return any(_compare(op, path, v, lit) for v in values for lit in literals)

    return compare


# --- parser -------------------------------------------------------------------------------------


class _Parser:
    """Scannerless recursive descent over the query text (values and paths need context to lex)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, why: str) -> ValueError:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return ValueError(f"line {line} column {column}: {why}")

    def skip(self) -> None:
        while self.pos < len(self.text):
            if self.text[self.pos].isspace():
                self.pos += 1
            elif self.text.startswith("--", self.pos):
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                return

    def peek_keyword(self, word: str) -> bool:
        self.skip()
        end = self.pos + len(word)
        if not self.text.startswith(word, self.pos):
            return False
        return end == len(self.text) or self.text[end].isspace() or self.text[end] == "("

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def parse(self) -> Predicate:
        if self.at_end():
            raise self.fail("empty filter (it would match every log entry)")
        predicate = self.expression()
        if not self.at_end():
            raise self.fail(f"unexpected {self.text[self.pos]!r}")
        return predicate

    def expression(self) -> Predicate:
        parts = [self.sequence()]
        while self.peek_keyword("AND"):
            self.pos += 3
            parts.append(self.sequence())
        return _all(parts)

    def sequence(self) -> Predicate:
        parts = [self.factor()]
        while not self.at_end() and self.text[self.pos] != ")" and not self.peek_keyword("AND"):
            parts.append(self.factor())
        return _all(parts)

    def factor(self) -> Predicate:
        parts = [self.term()]
        while self.peek_keyword("OR"):
            self.pos += 2
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else _any(parts)

    def term(self) -> Predicate:
        self.skip()
        if self.peek_keyword("NOT"):
            self.pos += 3
            return _not(self.term())
        if self.text.startswith("-", self.pos):
            self.pos += 1
            if self.pos >= len(self.text) or self.text[self.pos].isspace():
                raise self.fail("'-' must be followed directly by the term it negates")
            return _not(self.term())
        if self.text.startswith("(", self.pos):
            self.pos += 1
            inner = self.expression()
            self.expect(")")
            return inner
        return self.comparison()

    def expect(self, char: str) -> None:
        self.skip()
        if not self.text.startswith(char, self.pos):
            found = repr(self.text[self.pos]) if self.pos < len(self.text) else "end of filter"
            raise self.fail(f"expected {char!r}, found {found}")
        self.pos += 1

    def comparison(self) -> Predicate:
        start = self.pos
        if self.pos >= len(self.text):
            raise self.fail("expected a comparison, found end of filter")
        if self.text[self.pos] == '"' or not _IDENT.match(self.text, self.pos):
            raise self.fail("global restrictions (a bare value without a field) are not supported")
        path = self.path()
        if path[0] in ("AND", "OR", "NOT") and len(path) == 1:
            raise self.fail(f"{path[0]} without an operand")
        if self.text.startswith("(", self.pos):
            raise self.fail(f"functions ({'.'.join(path)}(...)) are not supported")
        self.skip()
        op = next((o for o in _OPERATORS if self.text.startswith(o, self.pos)), None)
        if op is None:
            self.pos = start
            raise self.fail(f"global restriction {path[-1]!r} is not supported (is it a lower-case keyword?)")
        self.pos += len(op)
        self.skip()
        if op == ":" and self.text.startswith("*", self.pos):
            self.pos += 1
            return lambda entry: bool(_resolve(entry, path))
        literals = self.values()
        if op in ("=~", "!~"):
            for lit in literals:
                try:
                    re.compile(lit.text)
                except re.error as err:
                    raise self.fail(f"invalid regular expression {lit.text!r}: {err}") from None
        return _comparison(path, op, literals)

    def path(self) -> tuple[str, ...]:
        segments: list[str] = []
        while True:
            if self.text.startswith('"', self.pos):
                segments.append(self.string())
            else:
                match = _IDENT.match(self.text, self.pos)
                if match is None:
                    raise self.fail("expected a field name")
                segments.append(match.group(0))
                self.pos = match.end()
            if not self.text.startswith(".", self.pos):
                return tuple(segments)
            self.pos += 1

    def values(self) -> list[_Literal]:
        if not self.text.startswith("(", self.pos):
            return [self.value()]
        self.pos += 1
        found = [self.value()]
        while True:
            self.skip()
            if self.text.startswith(")", self.pos):
                self.pos += 1
                return found
            if self.peek_keyword("OR"):
                self.pos += 2
                found.append(self.value())
                continue
            raise self.fail("only OR is supported inside a value list")

    def value(self) -> _Literal:
        self.skip()
        if self.text.startswith('"', self.pos):
            return _Literal(self.string(), quoted=True)
        match = _BARE_VALUE.match(self.text, self.pos)
        if match is None:
            raise self.fail("expected a value")
        word = match.group(0)
        if word in ("AND", "OR", "NOT"):
            raise self.fail(f"expected a value, found keyword {word}")
        if any(ch in word for ch in "=<>!:"):
            raise self.fail(f"unquoted value {word!r} contains an operator character; quote it")
        self.pos = match.end()
        return _Literal(word, quoted=False)

    def string(self) -> str:
        out: list[str] = []
        self.pos += 1  # opening quote
        escapes = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                return "".join(out)
            if char == "\\" and self.pos + 1 < len(self.text):
                nxt = self.text[self.pos + 1]
                # Unknown escapes keep their backslash so that regular expressions like "\d" survive.
                out.append(escapes.get(nxt, "\\" + nxt))
                self.pos += 2
                continue
            out.append(char)
            self.pos += 1
        raise self.fail("unterminated string")


def _all(parts: list[Predicate]) -> Predicate:
    if len(parts) == 1:
        return parts[0]
    return lambda entry: all(part(entry) for part in parts)


def _any(parts: list[Predicate]) -> Predicate:
    return lambda entry: any(part(entry) for part in parts)


def _not(part: Predicate) -> Predicate:
    return lambda entry: not part(entry)
