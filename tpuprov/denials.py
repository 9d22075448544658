"""Permission denials the functions logged, for ``tpuprov why``: the one deployment error it can name.

A function refused by IAM logs ``permission.denied`` once per delivery with the missing ``permission``
and the ``role`` (function) to add it to (``shared.app.entry``). ``why`` reads those lines through the
``DenialLog`` port: production from Cloud Logging (the functions' stdout lines are ``jsonPayload``),
the sandbox from its function log files (``SANDBOX_LOG_DIR``, which ``tpuprov sandbox up`` exports).
Every JobSet depends on the event functions, so a denial of any of them is part of every answer until
the role is fixed.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from shared.core.errors import TransientError

EVENT = "permission.denied"
# The functions a JobSet's pools depend on (setup and Kueue denials are not about one JobSet).
JOBSET_FUNCTIONS = ("provision", "release", "reconcile")


@dataclasses.dataclass(frozen=True)
class Denial:
    """A function's role lacked a permission."""

    role: str  # the function whose role lacks it (its list in infra/roles.json)
    permission: str


class DenialLog(Protocol):
    """Where the functions' ``permission.denied`` lines can be read."""

    def denials(self) -> list[Denial]:
        """Recent denials, any order, duplicates allowed."""
        ...


def denial_from(payload: Mapping[str, Any]) -> Denial | None:
    """A decision line (or an entry's jsonPayload) as a ``Denial``; None for any other line."""
    if payload.get("event") != EVENT or not payload.get("permission") or not payload.get("role"):
        return None
    return Denial(str(payload["role"]), str(payload["permission"]))


def sentence(denials: Iterable[Denial]) -> str:
    """What ``why`` adds: one clause per distinct denial of a function JobSets depend on ("" if none)."""
    found = sorted({d for d in denials if d.role in JOBSET_FUNCTIONS}, key=lambda d: (d.role, d.permission))
    if not found:
        return ""
    clauses = [
        f"the {d.role} function's role lacks {d.permission}: add it to infra/roles.json" for d in found
    ]
    text = "; ".join(clauses)
    return (
        f"Deployment error: {text[0].upper()}{text[1:]} and apply infra/. Until then "
        f"{'its' if len({d.role for d in found}) == 1 else 'their'} deliveries are refused and redelivered "
        "(nothing is lost once the role holds it)."
    )


class DecisionDenials:
    """``DenialLog`` over decision lines already read (the sandbox stack's ``decisions()``)."""

    def __init__(self, lines: Sequence[Mapping[str, Any]]) -> None:
        self.lines = lines

    def denials(self) -> list[Denial]:
        return [d for d in (denial_from(line) for line in self.lines) if d is not None]


class LogFileDenials:
    """``DenialLog`` over the sandbox's function log files (``<function>.log``, one JSON line each)."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)

    def denials(self) -> list[Denial]:
        found = []
        for path in sorted(self.directory.glob("*.log")):
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                if EVENT not in line:
                    continue  # most lines; parse only the candidates
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                denial = denial_from(record) if isinstance(record, dict) else None
                if denial is not None:
                    found.append(denial)
        return found


def logging_filter(prefix: str, since: datetime.datetime) -> str:
    """The Cloud Logging query for the event functions' denial lines since ``since``."""
    services = " OR ".join(f'"{prefix}-{f}"' for f in JOBSET_FUNCTIONS)
    return (
        'resource.type="cloud_run_revision" '
        f"resource.labels.service_name=({services}) "
        f'jsonPayload.event="{EVENT}" '
        f'timestamp>="{since.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}"'
    )


class CloudLoggingDenials:
    """``DenialLog`` over Cloud Logging: one ``entries.list`` with a filter, newest first, bounded."""

    def __init__(self, project: str, prefix: str = "tpuprov", hours: float = 1.0, limit: int = 200) -> None:
        self.project, self.prefix, self.hours, self.limit = project, prefix, hours, limit

    def denials(self) -> list[Denial]:
        from google.cloud import logging as cloud_logging

        since = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(hours=self.hours)
        try:
            client = cloud_logging.Client(project=self.project)
            entries = client.list_entries(
                resource_names=[f"projects/{self.project}"],
                filter_=logging_filter(self.prefix, since),
                order_by=cloud_logging.DESCENDING,
                max_results=self.limit,
            )
            payloads = [e.payload for e in entries if isinstance(e.payload, Mapping)]
        except Exception as exc:  # no credentials, no logging.logEntries.list, API off
            raise TransientError(f"cannot read the functions' logs: {exc}") from None
        return [d for d in (denial_from(p) for p in payloads) if d is not None]
