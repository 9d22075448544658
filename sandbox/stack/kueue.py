"""Applying a Kueue queue configuration to a running sandbox, the way the product does it.

When the stack runs the ``apply_kueue`` function, the configuration is published to its topic
and the function applies it; otherwise the product's own ``KueueService`` applies it in-process
through the official Kubernetes client against the sandbox API (the same code path the function
runs, minus Pub/Sub). Either way the objects come from ``shared.kueue.render``.
"""

from __future__ import annotations

import time
from typing import Any

from sandbox.cluster.kueue_objects import KUEUE_API
from sandbox.stack.core import Stack
from sandbox.stack.wiring import TOPIC_PREFIX, wiring
from shared.cloud.objects import ApiClientObjects, Bounds
from shared.kueue.apply import KueueService
from shared.kueue.config import load_config, parse_config
from shared.kueue.render import render

FUNCTION = "apply_kueue"


def apply_kueue(stack: Stack, text: str | None = None, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Apply ``text`` (the packaged default when None); returns the rendered objects once applied."""
    config = parse_config(text) if text is not None else load_config()
    objects = render(config)
    if FUNCTION in stack.config.functions:
        topic = stack.publisher.topic_path(stack.config.project, wiring(FUNCTION).topic(TOPIC_PREFIX))
        stack.timeline.add("user", "published the Kueue configuration to the Kueue topic")
        stack.publisher.publish(topic, (text or "").encode()).result(timeout=30)
        queues = [str(o["metadata"]["name"]) for o in objects if o["kind"] == "ClusterQueue"]
        stack.wait_for(
            lambda: all(stack.kube.get(KUEUE_API, "clusterqueues", None, q) for q in queues),
            timeout,
            "the Kueue configuration to be applied",
        )
        return objects
    client = stack.kube.api_client(stack.admin_token)  # the operator applies it, as with kubectl
    started = time.monotonic()
    try:
        report = KueueService(
            ApiClientObjects(client), Bounds(total=timeout, webhook_retry=timeout / 2)
        ).apply(config)
    finally:
        client.close()
    stack.timeline.add(
        "user", f"applied the Kueue configuration: {report.summary()} in {time.monotonic() - started:.1f}s"
    )
    return objects
