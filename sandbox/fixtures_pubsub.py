"""pytest fixtures around the real Pub/Sub emulator (the lead registers this module in tests/conftest.py).

``pubsub_emulator`` starts one emulator per test module (startup takes seconds); ``pubsub`` points
the current test's environment at it and gives a small admin helper for topics, subscriptions and
pulls. Both skip, with the reason, where gcloud, Java or the emulator component is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.pubsub_emulator import PubsubEmulator, unavailable_reason

EMULATOR_PROJECT = "test-proj"
_names = itertools.count(1)


class PubsubAdmin:
    """Create topics and pull subscriptions on the emulator and pull what arrived."""

    def __init__(self, emulator: PubsubEmulator) -> None:
        from google.cloud import pubsub_v1

        self.emulator = emulator
        self.project = emulator.project
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()

    def unique(self, stem: str) -> str:
        """A name not used before in this test session (tests share one emulator per module)."""
        return f"{stem}{next(_names)}"

    def create_topic(self, name: str) -> str:
        """Create ``name`` and return its path."""
        path = self.publisher.topic_path(self.project, name)
        self.publisher.create_topic(name=path)
        return str(path)

    def create_subscription(self, topic_path: str, name: str) -> str:
        """Create a pull subscription on ``topic_path`` and return its path."""
        path = self.subscriber.subscription_path(self.project, name)
        self.subscriber.create_subscription(name=path, topic=topic_path)
        return str(path)

    def pull(self, subscription_path: str, max_messages: int = 10, timeout: float = 10.0) -> list[Any]:
        """Pull and acknowledge up to ``max_messages`` (``PubsubMessage`` objects)."""
        response = self.subscriber.pull(
            subscription=subscription_path, max_messages=max_messages, timeout=timeout
        )
        received = list(response.received_messages)
        if received:
            self.subscriber.acknowledge(subscription=subscription_path, ack_ids=[m.ack_id for m in received])
        return [m.message for m in received]

    def close(self) -> None:
        """Release the clients' channels and threads."""
        self.publisher.stop()
        self.subscriber.close()


@pytest.fixture(scope="module")
def pubsub_emulator() -> Iterator[PubsubEmulator]:
    """A running emulator shared by the tests of one module; stopped (with its Java child) after."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"Pub/Sub emulator unavailable: {reason}")
    emulator = PubsubEmulator(project=EMULATOR_PROJECT)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def pubsub(pubsub_emulator: PubsubEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[PubsubAdmin]:
    """This test's environment pointed at the emulator, plus an admin helper for it."""
    for key, value in pubsub_emulator.env().items():
        monkeypatch.setenv(key, value)
    admin = PubsubAdmin(pubsub_emulator)
    try:
        yield admin
    finally:
        admin.close()
