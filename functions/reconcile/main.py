"""Cloud Run entrypoint: the scheduled sweep that fixes whatever events missed."""

from typing import Any

import functions_framework

from shared.app import entry, handlers

entry.guard_boundary("reconcile")


@functions_framework.cloud_event
def reconcile(cloud_event: Any) -> None:
    """Cloud Scheduler tick via the reconcile topic; returns to ack, raises to redeliver."""
    runtime = entry.runtime()
    entry.handle("reconcile", cloud_event, lambda: handlers.reconcile(runtime, cloud_event))
