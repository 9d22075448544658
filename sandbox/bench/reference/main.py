"""Benchmark reference: the naive design, importing all six client libraries eagerly at module load.

It handles events exactly like ``functions/provision/main.py`` (same handler), so the cold-start
difference the benchmark reports is the cost of eager imports and nothing else.
"""

from typing import Any

import cloudevents  # noqa: F401  # imported for its import cost, as the naive design does
import functions_framework
import google.cloud.container_v1
import google.cloud.logging
import google.cloud.pubsub_v1  # noqa: F401
import kubernetes  # noqa: F401

from shared.app import entry, handlers


@functions_framework.cloud_event
def reference(cloud_event: Any) -> None:
    """Same delivery contract as ``provision``; only the imports above differ."""
    runtime = entry.runtime()
    entry.handle("provision", cloud_event, lambda: handlers.provision(runtime, cloud_event))
