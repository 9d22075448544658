"""Cloud Run entrypoint: a message on the Kueue topic -> the queue configuration applied and pruned."""

from typing import Any

import functions_framework

from shared.app import entry, setup_handlers

entry.guard_boundary("apply_kueue")


@functions_framework.cloud_event
def apply_kueue(cloud_event: Any) -> None:
    """Eventarc delivery from the Kueue topic; returns to ack, raises to redeliver."""
    runtime = entry.runtime()
    entry.handle("apply_kueue", cloud_event, lambda: setup_handlers.apply_kueue(runtime, cloud_event))
