"""What provision decided for one pending pod: the outcome names and the decision log line.

The names double as the stable ``event`` field of the decision log line (``provision.<result>``),
which the dashboard's metrics and the tests read.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from shared.core import logs

log = logs.get("provision")

CREATED = "created"
EXISTS = "exists"
SKIPPED = "skipped"
REFUSED = "refused"
FAILED = "failed"
WAITING = "waiting"  # every GKE operation slot is taken: a finished operation (or reconcile) resumes it
REPLACED = "replaced"  # the slice's pool no longer fit its pods: deleted, a later event builds it again


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the service decided for one pod, for logs, tests and the reconcile summary."""

    result: str
    why: str
    pool: str = ""
    slice: str = ""
    requested: tuple[str, ...] = ()  # every pool this call created (its own and its siblings')
    fallback: str = ""  # the capacity option a failed create falls back to at once (redelivery)


def logged(outcome: Outcome, level: int = logging.INFO, **fields: Any) -> Outcome:
    """Log ``outcome`` as provision's decision line and return it."""
    logs.decision(
        log,
        f"provision.{outcome.result}",
        outcome.why,
        level,
        pool=outcome.pool,
        slice=outcome.slice,
        **fields,
    )
    return outcome
