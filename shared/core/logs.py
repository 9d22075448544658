"""Structured logging in the JSON shape Cloud Logging parses from a Cloud Run container's stdout.

Every decision the product makes is logged as one JSON line with a stable ``event`` field
(``pool.created``, ``pod.skipped``, ``pool.refused``...), the trace id of the delivery and the
JobSet identity, so that "why did (or didn't) my slice appear?" is one Logging query away.
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, TextIO

# Fields bound for the current delivery (function name, message id, trace); merged into every line.
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "tpuprov_log_context", default=_EMPTY
)

_SEVERITY = {
    logging.DEBUG: "DEBUG",
    logging.INFO: "INFO",
    logging.WARNING: "WARNING",
    logging.ERROR: "ERROR",
    logging.CRITICAL: "CRITICAL",
}

LOGGER_NAME = "tpuprov"


class JsonFormatter(logging.Formatter):
    """Render a record as one Cloud Logging structured-log JSON object."""

    def __init__(self, project_id: str = "") -> None:
        super().__init__()
        self.project_id = project_id

    def format(self, record: logging.LogRecord) -> str:
        """Serialize the record plus bound context; never raises on odd field values."""
        payload: dict[str, Any] = {
            "severity": _SEVERITY.get(record.levelno, "DEFAULT"),
            "message": record.getMessage(),
            "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(),
            "logger": record.name,
        }
        payload.update(_context.get())
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            payload.update(fields)
        trace = payload.pop("trace", "")
        if trace:
            # Cloud Logging links the line to the request trace only with the full resource path.
            payload["logging.googleapis.com/trace"] = (
                f"projects/{self.project_id}/traces/{trace}" if self.project_id else str(trace)
            )
        if record.exc_info and record.levelno >= logging.ERROR:
            payload["stack_trace"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, sort_keys=False)


def configure(project_id: str = "", stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Route the ``tpuprov`` logger to ``stream`` (stdout) as JSON lines; idempotent."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    logger.propagate = False
    target = stream if stream is not None else sys.stdout
    for handler in list(logger.handlers):
        if getattr(handler, "_tpuprov", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(target)
    handler.setFormatter(JsonFormatter(project_id))
    handler._tpuprov = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def get(name: str) -> logging.Logger:
    """A child logger of ``tpuprov`` (``tpuprov.<name>``)."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def decision(
    logger: logging.Logger, event: str, message: str, level: int = logging.INFO, /, **fields: Any
) -> None:
    """Log one decision line: ``event`` is the stable machine-readable name, ``fields`` its details."""
    logger.log(level, message, extra={"fields": {"event": event, **fields}})


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Bind fields (function, message_id, trace...) to every log line emitted inside the block."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def annotate(**fields: Any) -> None:
    """Add fields to every later line of the enclosing ``bound`` block (a delivery's, in
    ``shared.app.entry.handle``), including the lines written after an error left the handler: the
    cluster a delivery is about is known only once its event is decoded, and its ``delivery.retry``
    line must name it too. The block's end drops them with everything else it bound."""
    _context.set({**_context.get(), **fields})
