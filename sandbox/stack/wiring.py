"""The sandbox's Pub/Sub wiring: the same topics, push subscriptions and delivery policy as infra/.

``infra/main.tf`` and ``infra/modules/*`` declare one topic per function (``<prefix>-<suffix>``), a
dead-letter topic beside it, and a push subscription with a retry policy and a dead-letter policy.
The constants below restate those facts once for the sandbox; ``tests/sandbox/test_wiring.py``
parses the Terraform and fails when the two drift apart.

Clients are built on an explicit insecure channel to the emulator instead of through the
``PUBSUB_EMULATOR_HOST`` variable, so that starting a sandbox never changes the process environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

TOPIC_PREFIX = "tpuprov"


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """A push subscription's redelivery backoff (Pub/Sub doubles from the minimum up to the maximum)."""

    minimum_backoff_seconds: int
    maximum_backoff_seconds: int


@dataclasses.dataclass(frozen=True)
class FunctionWiring:
    """One event function as infra wires it: its source topic suffix and its request timeout."""

    function: str
    topic_suffix: str
    timeout_seconds: int

    def topic(self, prefix: str = TOPIC_PREFIX) -> str:
        """The function's source topic name."""
        return f"{prefix}-{self.topic_suffix}"

    def dead_letter_topic(self, prefix: str = TOPIC_PREFIX) -> str:
        """Where messages go after the last delivery attempt."""
        return f"{self.topic(prefix)}-dead-letter"

    def subscription(self, prefix: str = TOPIC_PREFIX) -> str:
        """The push subscription feeding the function (infra: ``<service name>-push``)."""
        return f"{prefix}-{self.function.replace('_', '-')}-push"

    def dead_letter_subscription(self, prefix: str = TOPIC_PREFIX) -> str:
        """The pull subscription that keeps dead letters for inspection."""
        return f"{self.dead_letter_topic(prefix)}-pull"

    @property
    def ack_deadline_seconds(self) -> int:
        """infra: ``min(600, timeout_seconds)``, so a slow call is not redelivered while it runs."""
        return min(600, self.timeout_seconds)


# --- The single sandbox copy of infra's delivery facts (checked against the Terraform by tests).
INFRA_RETRY_POLICY = RetryPolicy(minimum_backoff_seconds=10, maximum_backoff_seconds=600)
INFRA_MAX_DELIVERY_ATTEMPTS = 10
FUNCTIONS: tuple[FunctionWiring, ...] = (
    FunctionWiring("provision", "pending-pods", 60),
    FunctionWiring("release", "jobset-lifecycle", 120),
    FunctionWiring("reconcile", "reconcile", 300),
    FunctionWiring("setup_cluster", "setup", 540),
    FunctionWiring("apply_kueue", "kueue", 300),
)
# sinks/<name>.filter -> the function whose topic the sink fills.
SINKS: Mapping[str, str] = {
    "pending-tpu-pods": "provision",
    "nodepool-operations": "provision",
    "workload-quota-reserved": "provision",
    "jobset-lifecycle": "release",
    "cluster-created": "setup_cluster",
}
DEAD_LETTER_ACK_DEADLINE_SECONDS = 60


def wiring(function: str) -> FunctionWiring:
    """The wiring of one function by name; KeyError for an unknown one."""
    for item in FUNCTIONS:
        if item.function == function:
            return item
    raise KeyError(f"unknown function {function!r}; known: {', '.join(f.function for f in FUNCTIONS)}")


def clients(host: str) -> tuple[Any, Any]:
    """A (PublisherClient, SubscriberClient) pair talking plaintext gRPC to the emulator at ``host``."""
    import grpc
    from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient, types
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    publisher = PublisherClient(
        transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host)),
        # The router publishes one entry at a time and waits; batching would only add latency.
        batch_settings=types.BatchSettings(max_messages=1, max_latency=0.0),
    )
    subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host)))
    return publisher, subscriber


def create_wiring(
    host: str,
    project: str,
    push_endpoints: Mapping[str, str],
    retry: RetryPolicy = INFRA_RETRY_POLICY,
    max_delivery_attempts: int = INFRA_MAX_DELIVERY_ATTEMPTS,
    prefix: str = TOPIC_PREFIX,
) -> None:
    """Create every function's topics; push subscriptions for the functions in ``push_endpoints``.

    Topics of functions that do not run still exist (as in production), so that publishing to
    them succeeds; their messages simply wait.
    """
    from google.protobuf import duration_pb2

    publisher, subscriber = clients(host)
    try:
        for item in FUNCTIONS:
            topic = publisher.topic_path(project, item.topic(prefix))
            dead_letter = publisher.topic_path(project, item.dead_letter_topic(prefix))
            publisher.create_topic(name=topic)
            publisher.create_topic(name=dead_letter)
            subscriber.create_subscription(
                request={
                    "name": subscriber.subscription_path(project, item.dead_letter_subscription(prefix)),
                    "topic": dead_letter,
                    "ack_deadline_seconds": DEAD_LETTER_ACK_DEADLINE_SECONDS,
                }
            )
            endpoint = push_endpoints.get(item.function)
            if endpoint is None:
                continue
            subscriber.create_subscription(
                request={
                    "name": subscriber.subscription_path(project, item.subscription(prefix)),
                    "topic": topic,
                    "ack_deadline_seconds": item.ack_deadline_seconds,
                    "push_config": {"push_endpoint": endpoint},
                    "retry_policy": {
                        "minimum_backoff": duration_pb2.Duration(seconds=retry.minimum_backoff_seconds),
                        "maximum_backoff": duration_pb2.Duration(seconds=retry.maximum_backoff_seconds),
                    },
                    "dead_letter_policy": {
                        "dead_letter_topic": dead_letter,
                        "max_delivery_attempts": max_delivery_attempts,
                    },
                }
            )
    finally:
        publisher.transport.close()
        subscriber.close()
