"""Cloud Run entrypoint: a JobSet finished or was deleted -> delete its TPU node pools."""

from typing import Any

import functions_framework

from shared.app import entry, handlers

entry.guard_boundary("release")


@functions_framework.cloud_event
def release(cloud_event: Any) -> None:
    """Eventarc delivery from the JobSet-lifecycle topic; returns to ack, raises to redeliver."""
    runtime = entry.runtime()
    entry.handle("release", cloud_event, lambda: handlers.release(runtime, cloud_event))
