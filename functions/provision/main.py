"""Cloud Run entrypoint: a pending TPU pod of a JobSet -> its slice's GKE node pool."""

from typing import Any

import functions_framework

from shared.app import entry, handlers

entry.guard_boundary("provision")


@functions_framework.cloud_event
def provision(cloud_event: Any) -> None:
    """Eventarc delivery from the pending-pods topic; returns to ack, raises to redeliver."""
    runtime = entry.runtime()
    entry.handle("provision", cloud_event, lambda: handlers.provision(runtime, cloud_event))
