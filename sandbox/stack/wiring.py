"""The sandbox's Pub/Sub wiring: the same topics, push subscriptions and delivery policy as infra/.

The facts (topics, subscriptions, retry and dead-letter policy) are the deployment's own,
``shared.app.deployment``, which ``tpuprov doctor`` checks a live deployment against; this module
creates them on the Pub/Sub emulator.

Clients are built on an explicit insecure channel to the emulator instead of through the
``PUBSUB_EMULATOR_HOST`` variable, so that starting a sandbox never changes the process environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.app.deployment import (
    DEAD_LETTER_ACK_DEADLINE_SECONDS,
    FUNCTIONS,
    INFRA_MAX_DELIVERY_ATTEMPTS,
    INFRA_RETRY_POLICY,
    TOPIC_PREFIX,
    RetryPolicy,
)


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
