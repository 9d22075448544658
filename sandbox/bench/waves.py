"""The benchmark's virtual-time part: S slices through GKE's operation limit, against ceil(S/C) x D.

Runs ``sandbox.sim.scenario`` for each S in ``SLICES`` and C in ``LIMITS`` (D = 5 minutes) with the
finished-operation events on, as deployed, plus one run without them to show what they are worth.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sandbox.sim.scenario import SimConfig, SimResult, run

SLICES = (8, 64, 256)
LIMITS = (5, 20)
RATIO_MAX = 1.15  # makespan over the lower bound, for S = 64 and 256


def _resume(provisioner: Any) -> Any:
    return provisioner.resume()


def run_all(op_minutes: float = 5.0, seed: int = 1) -> tuple[list[SimResult], SimResult]:
    """Every (S, C) with finished-operation events, and S=64 C=5 without them."""
    results = [
        run(SimConfig(slices=s, op_limit=c, op_minutes=op_minutes, seed=seed), resume=_resume)
        for s in SLICES
        for c in LIMITS
    ]
    without = run(SimConfig(slices=64, op_limit=5, op_minutes=op_minutes, seed=seed, finished_ops=False))
    return results, without


def as_dict(result: SimResult) -> dict[str, Any]:
    """A JSON-safe row."""
    return {
        "config": dataclasses.asdict(result.config),
        "makespan_s": result.makespan,
        "lower_bound_s": result.lower_bound,
        "ratio": None if result.ratio is None else round(result.ratio, 4),
        "waves": result.waves,
        "creates_accepted": result.creates_accepted,
        "wasted": result.wasted,
        "dead_lettered": result.dead_lettered,
        "deliveries": result.deliveries,
        "longest_delivery_s": round(result.longest_delivery, 2),
    }
