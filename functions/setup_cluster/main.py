"""Cloud Run entrypoint: a message on the setup topic -> JobSet and Kueue installed on the named cluster."""

from typing import Any

import functions_framework

from shared.app import entry, setup_handlers

entry.guard_boundary("setup_cluster")


@functions_framework.cloud_event
def setup_cluster(cloud_event: Any) -> None:
    """Eventarc delivery from the setup topic; returns to ack, raises to redeliver."""
    runtime = entry.runtime()
    entry.handle("setup_cluster", cloud_event, lambda: setup_handlers.setup_cluster(runtime, cloud_event))
