"""Offline checks of infra/monitoring.tf, infra/dashboard.json.tftpl and the Eventarc delivery option.

The log-based metrics count the functions' decision lines, so they silently read zero the day an
event or a field is renamed. These tests collect what the code actually writes (an AST scan of
``shared/`` for ``logs.decision(...)`` calls and ``extra={"fields": {...}}`` log calls, plus the
fields bound with ``logs.bound``) and fail when a metric, label or value extractor names anything
else. Filters are parsed and evaluated with the sandbox's Cloud Logging evaluator against lines
produced by ``shared.core.logs`` itself.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import itertools
import json
import logging
import re
import re._parser as sre_parse  # the regex parser behind re (Python >= 3.11)
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.logging.filter import parse_filter, render_template
from shared.core import logs
from tests.infra.hcl import INFRA, ROOT, WIRING, first, module

SHARED = ROOT / "shared"
LOGS_MODULE = SHARED / "core" / "logs.py"
PREFIX = "tpuprov"
SERVICES = {name: f"{PREFIX}-{name.replace('_', '-')}" for name in WIRING}
DEAD_LETTER_SUBSCRIPTIONS = {f"{PREFIX}-{topic}-dead-letter-pull" for _, topic in WIRING.values()}

# Events a metric may name before the code writes them, with the work that will write them.
ANNOUNCED_EVENTS: dict[str, str] = {}
# Keys Cloud Logging lifts out of a structured line into the LogEntry itself (they are not
# jsonPayload fields): https://cloud.google.com/logging/docs/structured-logging
LIFTED_KEYS = {"severity", "time", "timestamp"}
# Wording that comes from GKE / Compute Engine status messages, not from this repository.
EXTERNAL_TEXT = {
    "does not have enough resources",
    "stockout",
    "resource_pool_exhausted",
    "quota",
    "exceeded",
    "insufficient quota",
    "quota_exceeded",
    "resource_exhausted",
}
STANDARD_METRICS = {
    "run.googleapis.com/request_count",
    "run.googleapis.com/request_latencies",
    "pubsub.googleapis.com/subscription/num_undelivered_messages",
}
USER_METRIC = "logging.googleapis.com/user/"


# --- what the code writes ----------------------------------------------------------------------


@dataclasses.dataclass
class Written:
    """Every decision event the code logs, the fields written with it, and the code's own wording."""

    events: dict[str, set[str]]
    common: set[str]  # on every line: the formatter's keys and the fields bound with logs.bound
    texts: list[str]  # every string constant (and f-string literal part) under shared/
    unresolved: list[str]  # event expressions the scan could not reduce to strings

    def fields(self, event: str) -> set[str]:
        return self.events.get(event, set()) | self.common


class _Source:
    """One parsed module with the lookups the resolver needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.constants = {
            node.targets[0].id: node.value.value
            for node in self.tree.body
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        }
        self.classes = {n.name: n for n in ast.walk(self.tree) if isinstance(n, ast.ClassDef)}
        self.module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        # Names this module imports from the library (`from shared.x import NAME`): name -> module.
        self.imported = {
            alias.asname or alias.name: node.module
            for node in self.tree.body
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shared.")
            for alias in node.names
        }

    def home(self, name: str) -> _Source:
        """The module that defines ``name`` as seen from here (this one unless it is imported)."""
        origin = self.imported.get(name)
        return next((s for s in _ALL if s.module == origin), self) if origin else self

    def users(self, name: str) -> list[tuple[_Source, str]]:
        """This module (defining ``name``) and every module that imports it, with the local name."""
        found = [(self, name)]
        for other in _ALL:
            for local, origin in other.imported.items():
                if origin == self.module and local == name and other is not self:
                    found.append((other, local))
        return found

    def where(self, node: ast.AST) -> str:
        return f"{self.path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def calls_to(self, name: str) -> list[ast.Call]:
        return [
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == name)
                or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
            )
        ]


def _argument(call: ast.Call, index: int, name: str) -> ast.expr | None:
    """The argument a call passes for parameter ``name`` at position ``index``."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if 0 <= index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return call.args[index]
    return None


def _positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return names[1:] if names and names[0] in ("self", "cls") else names


def _resolve(expr: ast.expr, src: _Source, depth: int = 0) -> set[str] | None:
    """Every string ``expr`` can take, following constants, call sites and dataclass fields."""
    if depth > 6:
        return None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        branches = [_resolve(b, src, depth + 1) for b in (expr.body, expr.orelse)]
        return None if None in branches else set().union(*(b for b in branches if b is not None))
    if isinstance(expr, ast.JoinedStr):
        parts: list[set[str]] = []
        for value in expr.values:
            part = _resolve(value.value if isinstance(value, ast.FormattedValue) else value, src, depth + 1)
            if part is None:
                return None
            parts.append(part)
        return {"".join(combo) for combo in itertools.product(*parts)}
    fn = src.function_of(expr)
    if isinstance(expr, ast.Name):
        home = src.home(expr.id)
        if expr.id in home.constants:
            return {home.constants[expr.id]}
        if fn is not None and expr.id in _positional(fn) + [a.arg for a in fn.args.kwonlyargs]:
            positional = _positional(fn)
            index = positional.index(expr.id) if expr.id in positional else -1
            return _union(_argument(call, index, expr.id) for call in _calls(src, fn.name))
        return None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and fn is not None:
        # `outcome.result` where `outcome: Outcome` is a dataclass of this module.
        params = {a.arg: a.annotation for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
        annotation = params.get(expr.value.id)
        cls_name = annotation.id if isinstance(annotation, ast.Name) else ""
        owner = src.home(cls_name)
        cls = owner.classes.get(cls_name)
        if cls is None:
            return None
        fields = [
            n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        ]
        if expr.attr not in fields:
            return None
        index = fields.index(expr.attr)
        return _union(_argument(call, index, expr.attr) for call in _calls(owner, cls.name))
    return None


def _calls(src: _Source, name: str) -> list[ast.Call]:
    """Calls of ``name`` (defined in ``src``) in its module and in every module that imports it.

    Elsewhere only plain calls of the imported name count: ``x.logged()`` is not ``logged()``.
    """
    found = src.calls_to(name)
    for other, local in src.users(name)[1:]:
        found += [c for c in other.calls_to(local) if isinstance(c.func, ast.Name)]
    return found


def _union(arguments: Iterator[ast.expr | None]) -> set[str] | None:
    found: set[str] = set()
    seen = False
    for argument in arguments:
        seen = True
        if argument is None:
            return None
        # The argument is resolved in its own module (its names are that module's or its imports').
        values = _resolve(argument, _SOURCE_OF[id(argument)], 1)
        if values is None:
            return None
        found |= values
    return found if seen else None


_SOURCE_OF: dict[int, _Source] = {}
_ALL: list[_Source] = []  # every module of the library, for names imported across modules


def _dict_keys(expr: ast.expr, src: _Source, sources: list[_Source]) -> set[str]:
    """The string keys of the dict(s) ``**expr`` can expand to."""

    def literal_keys(node: ast.AST) -> set[str]:
        return {
            key.value
            for d in ast.walk(node)
            if isinstance(d, ast.Dict)
            for key in d.keys
            if isinstance(key, ast.Constant) and isinstance(key.value, str)
        }

    if isinstance(expr, (ast.Dict, ast.IfExp)):
        return literal_keys(expr)
    fn = src.function_of(expr)
    if isinstance(expr, ast.Name) and fn is not None:
        if fn.args.kwarg is not None and fn.args.kwarg.arg == expr.id:
            # **fields of the enclosing function: whatever its callers pass by keyword.
            keys: set[str] = set()
            for call in _calls(src, fn.name):
                for keyword in call.keywords:
                    keys |= {keyword.arg} if keyword.arg else _dict_keys(keyword.value, src, sources)
            return keys
        return {
            key
            for node in ast.walk(fn)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)
            for key in literal_keys(node.value)
        }
    if isinstance(expr, ast.Call):
        name = expr.func.id if isinstance(expr.func, ast.Name) else getattr(expr.func, "attr", "")
        return {
            key
            for other in sources
            for node in ast.walk(other.tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
            for ret in ast.walk(node)
            if isinstance(ret, ast.Return) and ret.value is not None
            for key in literal_keys(ret.value)
        }
    return set()


def _keywords(call: ast.Call, src: _Source, sources: list[_Source]) -> set[str]:
    names: set[str] = set()
    for keyword in call.keywords:
        names |= {keyword.arg} if keyword.arg else _dict_keys(keyword.value, src, sources)
    return names


@cache
def written() -> Written:
    sources = [_Source(path) for path in sorted(SHARED.rglob("*.py"))]
    _ALL[:] = sources
    for src in sources:
        for node in ast.walk(src.tree):
            _SOURCE_OF[id(node)] = src
    result = Written({}, set(), [], [])

    def record(event_expr: ast.expr, fields: set[str], src: _Source) -> None:
        names = _resolve(event_expr, src)
        if names is None:
            result.unresolved.append(f"{src.where(event_expr)}: {ast.unparse(event_expr)}")
            return
        for name in names:
            result.events.setdefault(name, set()).update(fields)

    for src in sources:
        for node in ast.walk(src.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                result.texts.append(node.value)
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "decision":
                event = _argument(node, 1, "event")
                assert event is not None, f"{src.where(node)}: decision() without an event"
                record(event, _keywords(node, src, sources) - {"event"}, src)
            elif called in ("bound", "annotate"):  # both put their fields on the delivery's lines
                result.common |= _keywords(node, src, sources)
            for keyword in node.keywords:
                # logger.info(..., extra={"fields": {"event": "...", ...}})
                if keyword.arg != "extra" or not isinstance(keyword.value, ast.Dict):
                    continue
                if src.path == LOGS_MODULE and getattr(src.function_of(node), "name", "") == "decision":
                    continue  # decision() itself: its calls are recorded above
                for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "fields"
                        and isinstance(value, ast.Dict)
                    ):
                        keys = {
                            k.value: v
                            for k, v in zip(value.keys, value.values, strict=True)
                            if isinstance(k, ast.Constant) and isinstance(k.value, str)
                        }
                        if "event" in keys:
                            record(keys["event"], set(keys) - {"event"}, src)

    # The formatter's own keys (shared/core/logs.py JsonFormatter.format), minus what it pops.
    formatter = next(s for s in sources if s.path == LOGS_MODULE)
    fmt = next(n for n in ast.walk(formatter.tree) if isinstance(n, ast.FunctionDef) and n.name == "format")
    for node in ast.walk(fmt):
        if isinstance(node, ast.Dict):
            result.common |= {
                k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            result.common.add(node.slice.value)
    popped = {
        n.args[0].value
        for n in ast.walk(fmt)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "pop"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }
    result.common -= popped | LIFTED_KEYS
    result.common = {f for f in result.common if not f.startswith("logging.googleapis.com/")}
    return result


def test_the_scan_finds_the_decision_events() -> None:
    found = written()
    assert found.unresolved == [], "event names the scan cannot resolve; write them as literals"
    # A few the product cannot do without; if one disappears the scan (or the code) broke.
    for event in (
        "provision.created",
        "provision.refused",
        "release.deleted",
        "reconcile.summary",
        "delivery.retry",
    ):
        assert event in found.events, event
    assert {"pool", "slice"} <= found.fields("provision.created")
    assert {"function", "message_id", "message"} <= found.common
    assert not (set(ANNOUNCED_EVENTS) & set(found.events)), (
        "an announced event is written now: drop it from ANNOUNCED_EVENTS"
    )


# --- HCL helpers -------------------------------------------------------------------------------

_INTERPOLATION = re.compile(r'\$\{((?:[^{}"]|"[^"]*")*)\}')


def hcl_string(raw: str) -> str:
    """An HCL quoted string's text as Terraform sees it (python-hcl2 keeps the escapes)."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), raw)


def metrics() -> dict[str, dict[str, Any]]:
    """Each metric as Terraform makes it: its own labels and the cluster label every metric has."""
    table: dict[str, dict[str, Any]] = module().locals["log_metrics"]
    cluster = module().locals["cluster_label"]
    return {key: {**body, "labels": {**body["labels"], **cluster}} for key, body in table.items()}


def render(raw: str) -> str:
    """Evaluate the few interpolations monitoring.tf uses, with the default topic prefix."""
    root = module()

    def value(expr: str) -> str:
        expr = expr.strip()
        if expr == "var.topic_prefix":
            return PREFIX
        if expr in ("local.services_regex", "local.dead_letter_regex"):
            return _regex_locals()[expr.removeprefix("local.")]
        match = re.fullmatch(r'google_logging_metric\.this\["([a-z_]+)"\]\.name', expr)
        if match:
            assert match.group(1) in metrics(), f"{expr}: no such log metric"
            return f"{PREFIX}/{match.group(1)}"
        match = re.fullmatch(r'module\.function\["([a-z_]+)"\]\.service_name', expr)
        if match:
            return SERVICES[match.group(1)]
        match = re.fullmatch(r"local\.([a-z_]+)", expr)
        if match and isinstance(root.locals.get(match.group(1)), (str, int, float)):
            return render(str(root.locals[match.group(1)]))
        raise AssertionError(f"render: unsupported interpolation ${{{expr}}}")

    return _INTERPOLATION.sub(lambda m: value(m.group(1)), hcl_string(raw))


def _regex_locals() -> dict[str, str]:
    root = module()
    assert root.locals["services_regex"] == '(${join("|", [for fn in module.function : fn.service_name])})'
    assert root.locals["dead_letter_regex"] == (
        '(${join("|", [for topics in module.pubsub : topics.dead_letter_subscription_name])})'
    )
    assert (
        module("modules/function").outputs["service_name"]["value"]
        == "${google_cloud_run_v2_service.this.name}"
    )
    assert module().modules["function"]["name"] == '${var.topic_prefix}-${replace(each.key, "_", "-")}'
    assert module("modules/pubsub").outputs["dead_letter_subscription_name"]["value"] == (
        "${google_pubsub_subscription.dead_letter.name}"
    )
    return {
        "services_regex": "(" + "|".join(sorted(SERVICES.values())) + ")",
        "dead_letter_regex": "(" + "|".join(sorted(DEAD_LETTER_SUBSCRIPTIONS)) + ")",
    }


def metric_filter(key: str) -> str:
    """The filter Terraform sends for log metric ``key``."""
    resource = module().resource("google_logging_metric", "this")
    assert resource["filter"] == "${local.metric_scope} AND (${each.value.filter})"
    return f"{render(module().locals['metric_scope'])} AND ({render(metrics()[key]['filter'])})"


def extractors(key: str) -> list[str]:
    body = metrics()[key]
    found = [hcl_string(label["extractor"]) for label in body["labels"].values()]
    if body["value_extractor"]:
        found.append(hcl_string(body["value_extractor"]))
    return found


_EVENT_TERM = re.compile(r'jsonPayload\.event\s*(=|:|!=|=~)\s*(\("[^)]*\)|"[^"]*")')
_FIELD = re.compile(r"jsonPayload\.([A-Za-z_][A-Za-z0-9_]*)")
_EXTRACTOR = re.compile(r'^(?:EXTRACT\(([\w.]+)\)|REGEXP_EXTRACT\(([\w.]+), "(.*)"\))$')


def events_of(filter_text: str) -> set[str]:
    events: set[str] = set()
    for op, value in _EVENT_TERM.findall(filter_text):
        assert op == "=", f"match jsonPayload.event exactly, not with {op!r}: {filter_text}"
        events |= set(re.findall(r'"([^"]*)"', value))
    return events


def text_conditions(filter_text: str) -> list[str]:
    """Regexes that text conditions on message/why stand for (``:`` is a substring, ``=~`` a regex)."""
    found = [re.escape(v) for v in re.findall(r'jsonPayload\.(?:message|why)\s*:\s*"([^"]*)"', filter_text)]
    found += re.findall(r'jsonPayload\.(?:message|why)\s*=~\s*"([^"]*)"', filter_text)
    return found


# --- log-based metrics -------------------------------------------------------------------------


def test_every_metric_filter_parses_and_names_written_events() -> None:
    assert metrics(), "no log metrics"
    for key in metrics():
        text = metric_filter(key)
        parse_filter(text)  # raises on anything the evaluator cannot read
        assert 'resource.type="cloud_run_revision"' in text, key
        events = events_of(text)
        assert events, f"{key}: the filter names no jsonPayload.event"
        for event in events:
            assert event in written().events or event in ANNOUNCED_EVENTS, (
                f"{key}: the code writes no {event!r} event"
            )


def test_fields_used_by_filters_and_extractors_are_written_with_the_events() -> None:
    for key in metrics():
        text = metric_filter(key)
        events = events_of(text)
        available = set().union(*(written().fields(e) for e in events if e not in ANNOUNCED_EVENTS))
        used = set(_FIELD.findall(text)) | {f for x in extractors(key) for f in _FIELD.findall(x)}
        used.discard("event")
        if all(e in ANNOUNCED_EVENTS for e in events):
            assert not used, f"{key}: counts an announced event; it may use no fields yet"
            continue
        missing = used - available
        assert not missing, f"{key}: {sorted(missing)} are not written with {sorted(events)}"


def test_extractors_are_well_formed() -> None:
    for key, body in metrics().items():
        assert body["value_type"] in ("INT64", "DISTRIBUTION"), key
        assert (body["value_type"] == "DISTRIBUTION") == bool(body["value_extractor"]), key
        assert len(body["description"]) > 20, key
        for label, spec in body["labels"].items():
            assert re.fullmatch(r"[a-z_]+", label) and len(spec["description"]) > 10, (key, label)
        for extractor in extractors(key):
            match = _EXTRACTOR.match(extractor)
            assert match, f"{key}: {extractor}"
            if match.group(3) is not None:
                assert "\\" not in match.group(3), f"{key}: keep backslashes out of extractor regexes"
                assert re.compile(match.group(3)).groups == 1, f"{key}: REGEXP_EXTRACT needs one group"
    resource = module().resource("google_logging_metric", "this")
    assert resource["for_each"] == "${local.log_metrics}"
    assert resource["name"] == "${var.topic_prefix}/${each.key}"
    descriptor = first(resource["metric_descriptor"])
    assert descriptor["metric_kind"] == "DELTA"
    assert resource["label_extractors"] == (
        "${{for key, label in merge(each.value.labels, local.cluster_label) : key => label.extractor}}"
    )
    assert first(first(resource["metric_descriptor"])["dynamic"])["labels"]["for_each"] == (
        "${merge(each.value.labels, local.cluster_label)}"
    )


def _literal_runs(pattern: str) -> list[str]:
    """Literal text a regex requires (runs of plain characters, per alternative)."""
    runs: list[str] = []

    def walk(parsed: Any) -> None:
        run = ""
        for op, arg in parsed:
            if op is sre_parse.LITERAL:
                run += chr(arg)
                continue
            runs.append(run)
            run = ""
            if op is sre_parse.SUBPATTERN:
                walk(arg[3])
            elif op is sre_parse.BRANCH:
                for branch in arg[1]:
                    walk(branch)
            elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT):
                walk(arg[2])
        runs.append(run)

    walk(sre_parse.parse(pattern))
    return [r.strip() for r in runs if len(r.strip()) >= 4]


def _text_patterns() -> dict[str, list[str]]:
    patterns: dict[str, list[str]] = {}
    for key in metrics():
        found = text_conditions(metric_filter(key))
        for extractor in extractors(key):
            match = _EXTRACTOR.match(extractor)
            if match and match.group(3) is not None:
                found.append(match.group(3))
        patterns[key] = found
    return patterns


def test_message_wording_the_metrics_rely_on_is_the_codes() -> None:
    """Regexes over message/why must quote the code's wording (or GKE's): rewording breaks them."""
    corpus = "\n".join(written().texts).lower()
    external_used: set[str] = set()
    for key, patterns in _text_patterns().items():
        for pattern in patterns:
            for run in _literal_runs(pattern):
                if run.lower() in EXTERNAL_TEXT:
                    external_used.add(run.lower())
                    continue
                assert run.lower() in corpus, f"{key}: {run!r} appears in no string under shared/"
    assert external_used == EXTERNAL_TEXT, f"unused EXTERNAL_TEXT: {EXTERNAL_TEXT - external_used}"


# Lines as the functions write them: (metric, service, event, message, fields, level, labels/value).
# Messages follow the f-strings in shared/ (tests above tie the wording the metrics use to them).
@dataclasses.dataclass
class Line:
    service: str
    event: str
    message: str
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    level: int = logging.INFO
    via_extra: bool = False  # logged like shared/cloud/gke.py does (logger.info(..., extra=...))


WHY = "team-a/train workers[0] pending: 4 x ct5lp-hightpu-4t (tpu-v5-lite-podslice 4x4, 16 chips)"
STOCKOUT = (
    "deleting tpu-train-workers-0-1a2b3c4d: GKE could not provision it: The zone "
    "'projects/p/zones/us-central2-b' does not have enough resources available to fulfill the request. "
    "(reconcile sweep)"
)
POOL = {"pool": "tpu-train-workers-0-1a2b3c4d", "jobset": "team-a/train"}
FAILED_ATTEMPT = (
    "pool tpu-train-workers-0-1a2b3c4d failed (attempt 1): ZONE_RESOURCE_POOL_EXHAUSTED: The zone "
    "'us-central2-b' does not have enough resources available to fulfill the request."
)
MATCHES: list[tuple[str, Line, dict[str, str]]] = [
    (
        "permission_denials",
        Line(
            "release",
            "permission.denied",
            "will be redelivered: the release function's role lacks container.nodes.update; add it to "
            '"release" in infra/roles.json and apply. x: PATCH /api/v1/nodes/n: HTTP 403 ...',
            {"permission": "container.nodes.update", "role": "release"},
            logging.ERROR,
        ),
        {"role": "release", "permission": "container.nodes.update"},
    ),
    (
        "pools_requested",
        Line(
            "provision",
            "gke.create_node_pool",
            f"creating node pool x in c: {WHY}",
            {"pool": "x", "cluster": "c", "why": WHY},
            via_extra=True,
        ),
        {"shape": "tpu-v5-lite-podslice 4x4"},
    ),
    (
        "chips_requested",
        Line("reconcile", "gke.create_node_pool", "creating", {"why": WHY}, via_extra=True),
        {"": "16"},
    ),
    (
        "pools_created",
        Line("provision", "provision.created", WHY, {"pool": "x", "slice": "s"}),
        {"shape": "tpu-v5-lite-podslice 4x4"},
    ),
    (
        "pools_deleted",
        Line(
            "release", "release.deleted", "deleting x: JobSet team-a/train completed (JobSet completed)", POOL
        ),
        {},
    ),
    ("pools_handed_over", Line("release", "release.adopted", "adopted by team-a/next", POOL), {}),
    (
        "admission_checks",
        Line(
            "provision",
            "admission.retry",
            "Workload team-a/jobset-train-x: pools ready 3/4; could not provision p (GCE_STOCKOUT); "
            "retry in 300s",
            {"workload": "team-a/jobset-train-x", "check": "tpu-slices", "requeue_after": 300},
            logging.WARNING,
        ),
        {"state": "admission.retry"},
    ),
    (
        "admission_checks",
        Line("reconcile", "admission.ready", "Workload team-a/w: pools ready 4/4", {"check": "tpu-slices"}),
        {"state": "admission.ready"},
    ),
    (
        "provision_refusals",
        Line(
            "provision",
            "provision.refused",
            "namespace 'team-c' is not in NAMESPACE_ALLOWLIST",
            {"pool": "", "slice": ""},
            logging.WARNING,
        ),
        {"reason": "NAMESPACE_ALLOWLIST"},
    ),
    (
        "provision_refusals",
        Line(
            "provision",
            "provision.refused",
            "chip budget exceeded: 1016 chips in managed pools + 16 requested > CHIP_BUDGET 1024",
            {},
            logging.WARNING,
        ),
        {"reason": "chip budget"},
    ),
    (
        "provision_refusals",
        Line("provision", "provision.refused", "JobSet train is suspended", {}, logging.WARNING),
        {"reason": "JobSet"},
    ),
    (
        "gke_rejections",
        Line(
            "provision",
            "provision.failed",
            "GKE rejected pool x: GKE create node pool x in c: bad request",
            {"pool": "x"},
            logging.ERROR,
        ),
        {"event": "provision.failed"},
    ),
    (
        "gke_rejections",
        Line(
            "release",
            "release.rejected",
            "GKE refused to delete x: GKE delete node pool: no",
            POOL,
            logging.ERROR,
        ),
        {"event": "release.rejected"},
    ),
    (
        "gke_stockouts",
        Line(
            "reconcile",
            "backoff.failed",
            FAILED_ATTEMPT,
            {**POOL, "option": "spot@us-central2-b", "next": ""},
        ),
        {"jobset": "team-a/train", "zone": "us-central2-b", "capacity": "spot"},
    ),
    (
        "capacity_fallbacks",
        Line(
            "provision",
            "backoff.failed",
            FAILED_ATTEMPT,
            {**POOL, "option": "spot@us-central2-b", "next": "on-demand@us-central2-b"},
        ),
        {"to": "on-demand@us-central2-b"},
    ),
    (
        "gke_quota_errors",
        Line(
            "provision",
            "delivery.retry",
            "will be redelivered: GKE create node pool x in c: Quota exceeded for quota metric 'Requests'",
            {},
            logging.ERROR,
        ),
        {"event": "delivery.retry"},
    ),
    (
        "gke_quota_errors",
        Line(
            "reconcile",
            "release.deleted",
            "deleting x: GKE could not provision it: Insufficient quota to satisfy the request (reconcile)",
            POOL,
        ),
        {"event": "release.deleted"},
    ),
    (
        "redeliveries",
        Line("release", "delivery.retry", "will be redelivered: delete x must be retried", {}, logging.ERROR),
        {},
    ),
    (
        "reconcile_sweeps",
        Line(
            "reconcile",
            "reconcile.summary",
            "pools seen 3, deleted 1, healed 0, requested 0, kept 2",
            {"pools_seen": 3},
            logging.WARNING,
        ),
        {"severity": "WARNING"},
    ),
    ("managed_pools", Line("reconcile", "reconcile.summary", "pools seen 3", {"pools_seen": 3}), {"": "3"}),
    ("managed_chips", Line("reconcile", "reconcile.summary", "pools seen 3", {"chips": 24}), {"": "24"}),
    (
        "pending_to_create_seconds",
        Line("provision", "provision.created", "default/t slice[0] pending", {"pending_seconds": 41.5}),
        {"": "41.5"},
    ),
    (
        "reconcile_orphans",
        Line(
            "reconcile",
            "release.deleted",
            "deleting x: JobSet team-a/failed-run no longer exists (reconcile sweep)",
            {"pool": "tpu-failed-run-0-1", "jobset": "team-a/failed-run"},
        ),
        {"jobset": "team-a/failed-run", "verdict": "no longer exists"},
    ),
]
MISSES: list[tuple[str, Line]] = [
    # A Workload the check leaves alone is not a transition.
    ("admission_checks", Line("provision", "admission.skipped", "Workload a/b: check is Ready already")),
    # Another service's lines never count, even with the same event.
    ("pools_created", Line("other-service", "provision.created", WHY)),
    ("pools_created", Line("provision", "provision.exists", "pool x already exists (RUNNING)")),
    # A pool the sweep recycled after a stockout is not a leak, and release's own deletes are not either.
    ("reconcile_orphans", Line("reconcile", "release.deleted", STOCKOUT, POOL)),
    (
        "reconcile_orphans",
        Line(
            "release", "release.deleted", "deleting x: JobSet team-a/train completed (JobSet completed)", POOL
        ),
    ),
    (
        "gke_stockouts",
        Line(
            "reconcile",
            "release.deleted",
            "deleting x: JobSet team-a/train completed (reconcile sweep)",
            POOL,
        ),
    ),
    (
        "gke_stockouts",
        Line(
            "reconcile",
            "backoff.failed",
            "pool x failed (attempt 2): Insufficient quota to satisfy the request",
            {**POOL, "option": "on-demand@us-central2-b", "next": ""},
        ),
    ),
    # The sweep's delete of a failed pool is not a second stockout: the attempt was counted once.
    ("gke_stockouts", Line("reconcile", "release.deleted", STOCKOUT, POOL)),
    (
        "capacity_fallbacks",
        Line(
            "reconcile",
            "backoff.failed",
            FAILED_ATTEMPT,
            {**POOL, "option": "spot@us-central2-b", "next": ""},
        ),
    ),
    (
        "gke_quota_errors",
        Line(
            "release",
            "release.deleted",
            "deleting tpu-quota-test-0-1: JobSet team-a/quota-test completed",
            POOL,
        ),
    ),
    ("redeliveries", Line("provision", "delivery.acked", "acknowledged without effect: bad event")),
]


SAMPLE_CLUSTER = "projects/p1/locations/us-central2-b/clusters/c1"


def log_entry(line: Line) -> dict[str, Any]:
    """The LogEntry Cloud Logging stores for one line the product writes (shared.core.logs)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("p1"))
    logger = logging.getLogger(f"tests.monitoring.{line.service}")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    with logs.bound(function=line.service, message_id="1", trace="", cluster=SAMPLE_CLUSTER):
        if line.via_extra:
            logger.log(line.level, line.message, extra={"fields": {"event": line.event, **line.fields}})
        else:
            logs.decision(logger, line.event, line.message, line.level, **line.fields)
    payload = json.loads(stream.getvalue())
    severity = payload.pop("severity")
    for key in LIFTED_KEYS:
        payload.pop(key, None)
    return {
        "resource": {"type": "cloud_run_revision", "labels": {"service_name": f"{PREFIX}-{line.service}"}},
        "severity": severity,
        "jsonPayload": payload,
    }


def extract(extractor: str, entry: Mapping[str, Any]) -> str:
    match = _EXTRACTOR.match(extractor)
    assert match, extractor
    path = (match.group(1) or match.group(2)).split(".")
    node: Any = entry
    for part in path:
        node = node.get(part, "") if isinstance(node, Mapping) else ""
    text = str(node)
    if match.group(3) is None:
        return text
    found = re.search(match.group(3), text)
    return found.group(1) if found else ""


def test_every_metric_has_a_sample_line() -> None:
    assert {key for key, _, _ in MATCHES} == set(metrics())


@pytest.mark.parametrize(
    ("key", "line", "expected"), MATCHES, ids=[f"{key}-{line.event}" for key, line, _ in MATCHES]
)
def test_metrics_count_the_lines_the_code_writes(key: str, line: Line, expected: dict[str, str]) -> None:
    entry = log_entry(line)
    assert parse_filter(metric_filter(key)).matches(entry), (key, entry)
    body = metrics()[key]
    got = {label: extract(hcl_string(spec["extractor"]), entry) for label, spec in body["labels"].items()}
    if body["value_extractor"]:
        got[""] = extract(hcl_string(body["value_extractor"]), entry)
    # The delivery's cluster, or the one a line names itself (the GKE adapter's calls do).
    assert got == {**expected, "cluster": line.fields.get("cluster", SAMPLE_CLUSTER)}


@pytest.mark.parametrize(("key", "line"), MISSES, ids=[f"{key}-{line.event}" for key, line in MISSES])
def test_metrics_ignore_other_lines(key: str, line: Line) -> None:
    assert not parse_filter(metric_filter(key)).matches(log_entry(line))


# --- dashboard ---------------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    call = module().resource("google_monitoring_dashboard", "operations")["dashboard_json"]
    assert call.startswith('${templatefile("${path.module}/dashboard.json.tftpl", {')
    text = (INFRA / "dashboard.json.tftpl").read_text()
    variables = {m.group(1) for m in re.finditer(r"(?<!\$)\$\{([a-z_]+)\}", text)}
    passed = set(re.findall(r"([a-z_]+) = ", call))
    assert variables == passed, f"template variables {variables} but templatefile passes {passed}"
    values = {
        "title": f"tpu-provisioner ({PREFIX})",
        "metric_prefix": f"{USER_METRIC}{PREFIX}/",
        **_regex_locals(),
    }
    assert f'metric_prefix = "{USER_METRIC}${{var.topic_prefix}}/"' in call
    result: dict[str, Any] = json.loads(render_template(text, values))
    return result


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_dashboard_charts_defined_metrics_next_to_cloud_run_and_dead_letters() -> None:
    board = dashboard()
    assert board["displayName"] and board["mosaicLayout"]["tiles"]
    filters = [value for key, value in _walk(board) if key == "filter"]
    types = [t for f in filters for t in re.findall(r'metric\.type="([^"]+)"', f)]
    assert len(types) == len(filters), "every chart selects exactly one metric type"
    defined = {f"{USER_METRIC}{PREFIX}/{key}" for key in metrics()}
    for metric_type in types:
        assert metric_type in defined | STANDARD_METRICS, metric_type
    assert set(types) == defined | STANDARD_METRICS, "chart every log metric and the standard ones"
    for f in filters:
        if "pubsub.googleapis.com" in f:
            regex = re.search(r'subscription_id=monitoring\.regex\.full_match\("([^"]+)"\)', f)
            assert regex, f
            assert {
                s for s in DEAD_LETTER_SUBSCRIPTIONS if re.fullmatch(regex.group(1), s)
            } == DEAD_LETTER_SUBSCRIPTIONS
            assert not re.fullmatch(regex.group(1), f"{PREFIX}-pending-pods-push")
        if "run.googleapis.com" in f:
            regex = re.search(r'service_name=monitoring\.regex\.full_match\("([^"]+)"\)', f)
            assert regex and all(re.fullmatch(regex.group(1), s) for s in SERVICES.values()), f
    for tile in board["mosaicLayout"]["tiles"]:
        assert tile["xPos"] + tile["width"] <= board["mosaicLayout"]["columns"], tile
    # The chart legends are Monitoring's ${...} templates, escaped from templatefile as $${...}.
    legends = [value for key, value in _walk(board) if key == "legendTemplate"]
    assert any("${resource.labels.service_name}" in legend for legend in legends)


def test_the_dashboard_narrows_to_one_fleet_cluster_and_each_alert_names_it() -> None:
    """A fleet's charts and incidents say which cluster: the dashboard's pinned filter on the log
    metrics' ``cluster`` label (Cloud Monitoring "Create and manage variables and pinned filters"),
    and every alert on a log metric opens one incident per cluster."""
    assert {"labelKey": "cluster", "filterType": "METRIC_LABEL"} in dashboard()["dashboardFilters"]
    assert "cluster" in module().locals["cluster_label"]
    policies = module().of_type("google_monitoring_alert_policy")
    # reconcile_missing watches for sweeps that stop altogether, whichever cluster they were of.
    for name in ALERTS - {"reconcile_missing"}:
        for condition in _conditions(policies[name]):
            if "logging.googleapis.com/user/" not in render(condition["filter"]):
                continue
            assert "metric.label.cluster" in first(condition["aggregations"])["group_by_fields"], name


# --- alert policies ----------------------------------------------------------------------------

ALERTS = {"dead_letters", "orphaned_pools", "stockouts", "errors", "reconcile_missing", "permission_denials"}


def _conditions(policy: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for condition in policy["conditions"]:
        for kind in ("condition_threshold", "condition_absent"):
            if kind in condition:
                yield first(condition[kind])


def test_alert_policies_use_defined_metrics_documentation_and_the_channel_variable() -> None:
    policies = module().of_type("google_monitoring_alert_policy")
    assert set(policies) == ALERTS
    variable = module().variables["alert_notification_channels"]
    assert (variable["type"], variable["default"]) == ("${list(string)}", [])
    for name, policy in policies.items():
        assert policy["notification_channels"] == "${var.alert_notification_channels}", name
        doc = first(policy["documentation"])
        assert doc["mime_type"] == "text/markdown", name
        assert len(doc["content"]) > 200 and "What to do" in doc["content"], name
        conditions = list(_conditions(policy))
        assert conditions and len(conditions) == len(policy["conditions"]), name
        for condition in conditions:
            for key in ("filter", "denominator_filter"):
                if key not in condition:
                    continue
                raw = condition[key]
                for metric in re.findall(r'google_logging_metric\.this\["([a-z_]+)"\]', raw):
                    assert metric in metrics(), (name, metric)
                text = render(raw)
                [metric_type] = re.findall(r'metric\.type="([^"]+)"', text)
                defined = {f"{USER_METRIC}{PREFIX}/{key}" for key in metrics()}
                assert metric_type in defined | STANDARD_METRICS, (name, metric_type)
                if metric_type.startswith(USER_METRIC):
                    # By resource reference, so that Terraform creates the metric first.
                    assert "${google_logging_metric.this[" in raw, (name, raw)


def test_each_alert_watches_what_it_says() -> None:
    policies = module().of_type("google_monitoring_alert_policy")

    def filters(name: str) -> list[str]:
        return [render(c["filter"]) for c in _conditions(policies[name])]

    [dead] = filters("dead_letters")
    regex = re.search(r'full_match\("([^"]+)"\)', dead)
    assert regex and all(re.fullmatch(regex.group(1), s) for s in DEAD_LETTER_SUBSCRIPTIONS)
    assert "num_undelivered_messages" in dead
    assert first(next(_conditions(policies["dead_letters"]))["aggregations"])["group_by_fields"] == [
        "resource.label.subscription_id"
    ]
    # The leak is the reconcile sweep deleting a pool whose owner is not live.
    [orphans] = filters("orphaned_pools")
    assert f"{PREFIX}/reconcile_orphans" in orphans
    assert events_of(metric_filter("reconcile_orphans")) == {"release.deleted"}
    assert 'jsonPayload.function="reconcile"' in metric_filter("reconcile_orphans")
    # ...which is the name the reconcile entrypoint binds to every line of its delivery.
    entrypoint = (ROOT / WIRING["reconcile"][0]).read_text()
    assert re.search(r'entry\.handle\(\s*"reconcile"', entrypoint), "reconcile binds another function name"
    [stockouts] = filters("stockouts")
    assert f"{PREFIX}/gke_stockouts" in stockouts
    assert (
        "metric.label.jobset"
        in first(next(_conditions(policies["stockouts"]))["aggregations"])["group_by_fields"]
    )
    [errors] = filters("errors")
    condition = next(_conditions(policies["errors"]))
    assert 'response_code_class="5xx"' in errors and "request_count" in render(
        condition["denominator_filter"]
    )
    assert first(condition["aggregations"])["group_by_fields"] == ["resource.label.service_name"]
    # Reconcile not running: no request, or no completed sweep, for longer than a few ticks.
    absent = [c for c in policies["reconcile_missing"]["conditions"] if "condition_absent" in c]
    assert len(absent) == 2
    texts = filters("reconcile_missing")
    assert any(f'service_name="{SERVICES["reconcile"]}"' in t and "request_count" in t for t in texts)
    assert any(f"{PREFIX}/reconcile_sweeps" in t for t in texts)
    assert events_of(metric_filter("reconcile_sweeps")) == {"reconcile.summary"}
    seconds = int(render(first(absent[0]["condition_absent"])["duration"]).rstrip("s"))
    assert module().variables["reconcile_schedule"]["default"] == "*/5 * * * *"
    assert 3 * 300 <= seconds <= 1800


# --- delivery: push (default) or eventarc --------------------------------------------------------

PUSH_RESOURCES = [
    ("google_service_account", "invoker"),
    ("google_cloud_run_v2_service_iam_member", "invoker"),
    ("google_service_account_iam_member", "token_creator"),
    ("google_pubsub_subscription", "push"),
    ("google_pubsub_subscription_iam_member", "dead_letter_subscriber"),
]
EVENTARC_RESOURCES = [
    ("google_service_account", "trigger"),
    ("google_cloud_run_v2_service_iam_member", "trigger"),
    ("google_service_account_iam_member", "trigger_token_creator"),
    ("google_eventarc_trigger", "this"),
]


def _count(expr: str, delivery: str) -> int:
    locals_ = {"push": delivery == "push", "eventarc": delivery == "eventarc"}
    match = re.fullmatch(r"\$\{local\.(push|eventarc) \? 1 : 0\}", str(expr))
    assert match, f"count must be gated on the delivery: {expr!r}"
    return 1 if locals_[match.group(1)] else 0


def test_delivery_is_validated_and_passed_to_every_function() -> None:
    for directory in ("", "modules/function"):
        variable = module(directory).variables["delivery"]
        assert variable["type"] == "string"
        assert 'contains(["push", "eventarc"], var.delivery)' in first(variable["validation"])["condition"]
    assert module().variables["delivery"]["default"] == "push"
    assert module().modules["function"]["delivery"] == "${var.delivery}"
    fn = module("modules/function")
    assert fn.locals == {"push": '${var.delivery == "push"}', "eventarc": '${var.delivery == "eventarc"}'}
    apis = module().resource("google_project_service", "apis")["for_each"]
    assert '"monitoring.googleapis.com"' in apis
    assert 'var.delivery == "eventarc" ? ["eventarc.googleapis.com"] : []' in apis


@pytest.mark.parametrize("delivery", ["push", "eventarc"])
def test_exactly_one_delivery_path_exists(delivery: str) -> None:
    fn = module("modules/function")
    push = {_count(fn.resource(*r)["count"], delivery) for r in PUSH_RESOURCES}
    eventarc = {_count(fn.resource(*r)["count"], delivery) for r in EVENTARC_RESOURCES}
    assert push == {int(delivery == "push")}, f"push resources with delivery = {delivery!r}"
    assert eventarc == {int(delivery == "eventarc")}, f"eventarc resources with delivery = {delivery!r}"
    # Nothing else in the module subscribes to the topic or invokes the service.
    gated = set(PUSH_RESOURCES) | set(EVENTARC_RESOURCES)
    for type_ in (
        "google_pubsub_subscription",
        "google_eventarc_trigger",
        "google_cloud_run_v2_service_iam_member",
    ):
        assert set(fn.of_type(type_)) == {name for t, name in gated if t == type_}, type_


def test_eventarc_trigger_delivers_the_topic_to_its_own_service() -> None:
    fn = module("modules/function")
    trigger = fn.resource("google_eventarc_trigger", "this")
    assert first(trigger["matching_criteria"]) == {
        "attribute": "type",
        "value": "google.cloud.pubsub.topic.v1.messagePublished",
    }
    assert first(first(trigger["transport"])["pubsub"]) == {"topic": "${var.topic_id}"}
    assert first(first(trigger["destination"])["cloud_run_service"]) == {
        "service": "${google_cloud_run_v2_service.this.name}",
        "region": "${var.region}",
    }
    assert trigger["service_account"] == "${google_service_account.trigger[0].email}"
    assert (trigger["location"], trigger["project"]) == ("${var.region}", "${var.project_id}")


def test_trigger_account_may_invoke_its_own_service_only() -> None:
    fn = module("modules/function")
    account = "google_service_account.trigger[0]"
    grants = [
        (type_, name, body)
        for (type_, name), body in fn.resources.items()
        if account in json.dumps({k: v for k, v in body.items() if k not in ("depends_on",)})
        and type_ != "google_eventarc_trigger"
    ]
    assert sorted((t, n) for t, n, _ in grants) == [
        ("google_cloud_run_v2_service_iam_member", "trigger"),
        ("google_service_account_iam_member", "trigger_token_creator"),
    ]
    invoker = fn.resource("google_cloud_run_v2_service_iam_member", "trigger")
    assert (invoker["name"], invoker["role"], invoker["member"]) == (
        "${google_cloud_run_v2_service.this.name}",
        "roles/run.invoker",
        f"serviceAccount:${{{account}.email}}",
    )
    # The only grant *on* the account: the Pub/Sub service agent may mint its OIDC tokens.
    token = fn.resource("google_service_account_iam_member", "trigger_token_creator")
    assert (token["service_account_id"], token["role"], token["member"]) == (
        f"${{{account}.name}}",
        "roles/iam.serviceAccountTokenCreator",
        "${var.pubsub_service_agent}",
    )
    # Its own account per function, distinct from the push invoker, within the 30-character limit.
    call = module().modules["function"]
    assert call["trigger_account_id"] == "${var.topic_prefix}-${each.value.short}-trigger"
    assert call["invoker_account_id"] != call["trigger_account_id"]
    longest = max(len(f["short"]) for f in module().locals["functions"].values())
    assert 12 + 1 + longest + len("-trigger") <= 30
    # Nothing in the root grants the trigger accounts anything project-wide.
    assert "trigger" not in json.dumps(module().of_type("google_project_iam_member"))


def test_push_subscriptions_keep_their_state_across_the_delivery_change() -> None:
    """Existing deployments must not destroy and re-create their subscriptions (moved blocks)."""
    text = (INFRA / "modules" / "function" / "main.tf").read_text()
    for type_, name in PUSH_RESOURCES:
        assert re.search(rf"moved \{{\s*from = {type_}\.{name}\s*to\s*= {type_}\.{name}\[0\]\s*\}}", text), (
            type_,
            name,
        )


# --- documentation -----------------------------------------------------------------------------


def test_readme_documents_every_metric_alert_and_the_delivery_option() -> None:
    readme = (INFRA / "README.md").read_text()
    section = readme.split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    for key in metrics():
        assert f"`{key}`" in section, key
    for name in ALERTS:
        title = module().resource("google_monitoring_alert_policy", name)["display_name"].split(": ", 1)[1]
        assert title in section, title
    assert "release.adopted" in section
    assert 'delivery = "eventarc"' in readme and "gcloud pubsub subscriptions update" in readme
