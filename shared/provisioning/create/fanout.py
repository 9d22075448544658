"""Send a group of GKE mutations concurrently: bounded, stopping at GKE's operation limit or the deadline.

A JobSet of 64 slices needs 64 CreateNodePool calls, each taking around a second at GKE; sent one
after another they outlast the delivery. Sent ``concurrency`` at a time they take a fraction of it.
Two things stop the fan-out early, and in both cases the items not sent are handed back so the
caller can record what was accepted and let Pub/Sub redeliver the rest:

* GKE answers that the cluster runs too many (or conflicting) operations (``OperationLimitError``):
  every further call would collect the same refusal until operations finish;
* the delivery's time budget is spent: a call is never started after the deadline.

The Google client is synchronous, so this uses threads; they are created only when more than one
call is to be made, which keeps the usual one-pool delivery on the caller's thread.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from shared.cloud.retry import Budget
from shared.core.errors import OperationLimitError, TpuProvError

T = TypeVar("T")


@dataclasses.dataclass
class FanOut(Generic[T]):
    """What happened to each item: sent (with the error it raised, None when accepted) or not sent."""

    sent: list[tuple[T, TpuProvError | None]]
    unsent: list[T]
    stopped: str = ""  # why the fan-out stopped early ("" when every item was sent)


def fan_out(items: Sequence[T], call: Callable[[T], None], concurrency: int, budget: Budget) -> FanOut[T]:
    """Run ``call`` on every item, at most ``concurrency`` at a time, in order of ``items``.

    ``call`` raises the product's errors (``TpuProvError``) for refusals; they are collected per item.
    The first ``OperationLimitError`` and the end of ``budget`` both stop new calls; calls already
    running finish. Anything else ``call`` raises is a bug and propagates after the running calls end.
    """
    results: dict[int, TpuProvError | None] = {}
    unsent: set[int] = set()
    stop = threading.Event()
    lock = threading.Lock()
    why: list[str] = []

    def halt(reason: str) -> None:
        with lock:
            if not why:
                why.append(reason)
        stop.set()

    def one(index: int) -> None:
        if stop.is_set() or budget.remaining() <= 0:
            if not stop.is_set():
                halt("the delivery's time budget is spent")
            with lock:
                unsent.add(index)
            return
        error: TpuProvError | None = None
        try:
            call(items[index])
        except OperationLimitError as exc:
            halt(exc.why)
            error = exc
        except TpuProvError as exc:
            error = exc
        with lock:
            results[index] = error

    if concurrency <= 1 or len(items) <= 1:
        for index in range(len(items)):
            one(index)
    else:
        from concurrent.futures import ThreadPoolExecutor

        workers = min(concurrency, len(items))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tpuprov-fanout") as pool:
            # Each call runs in a copy of the caller's context, so log lines keep the delivery's fields.
            futures = [pool.submit(contextvars.copy_context().run, one, i) for i in range(len(items))]
        for future in futures:
            future.result()  # re-raise a bug from a worker here, on the caller's thread
    return FanOut(
        sent=[(items[i], results[i]) for i in sorted(results)],
        unsent=[items[i] for i in sorted(unsent)],
        stopped=why[0] if why else "",
    )
