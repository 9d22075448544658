"""What the ``tpuprov publish`` tests share: a recording Pub/Sub publisher and the command's parser."""

from __future__ import annotations

import argparse
import base64
from collections.abc import Mapping
from typing import Any

from tpuprov.commands import publish as cli_publish


class RecordingPublisher:
    """A stateful fake Pub/Sub: keeps every message per topic and hands out increasing ids."""

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.topics: dict[str, list[dict[str, Any]]] = {}
        self.fail_with = fail_with

    def publish(self, topic_path: str, data: bytes, attributes: Mapping[str, str]) -> str:
        if self.fail_with is not None:
            raise self.fail_with
        message_id = str(1000 + sum(len(m) for m in self.topics.values()))
        self.topics.setdefault(topic_path, []).append(
            {
                "data": base64.b64encode(data).decode(),
                "attributes": dict(attributes),
                "messageId": message_id,
                "publishTime": "2026-05-01T12:00:00Z",
            }
        )
        return message_id

    def only_message(self) -> tuple[str, dict[str, Any]]:
        [(topic, [message])] = self.topics.items()
        return topic, message


def parse(argv: list[str]) -> argparse.Namespace:
    """``tpuprov publish <argv>`` parsed by the command's own parser."""
    parser = argparse.ArgumentParser(prog="tpuprov")
    cli_publish.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["publish", *argv])
