"""The sandbox's pieces on their own: infra parity, the Eventarc relay, scheduling and node rules.

Nothing here starts an emulator or a function process; only the relay tests start small loopback
HTTP servers (marked ``integration``). The parity tests parse the Terraform so that the sandbox
cannot drift from what production deploys.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cloudevents.http import from_http

from sandbox.emulators.eventarc import EventarcRelay
from sandbox.emulators.sockets import ephemeral_range, free_ports, listener_is_ours
from sandbox.kube.nodes import node_manifests, pool_from_gke
from sandbox.realstack.demo_cli import is_routine
from sandbox.stack.timeline import Timeline, TimelineEntry
from shared.app.deployment import (
    FUNCTIONS,
    INFRA_MAX_DELIVERY_ATTEMPTS,
    INFRA_RETRY_POLICY,
    SINKS,
    TOPIC_PREFIX,
)
from shared.core import labels
from shared.events import entries as logentries
from shared.events.entries import pod_event_entry, pubsub_message
from shared.events.envelope import ClusterId, PodUnschedulable, decode_cloud_event
from tests.infra.hcl import module


def _seconds(duration: str) -> int:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return int(match.group(1))


# -- parity with infra/ ---------------------------------------------------------------------------


def test_retry_and_dead_letter_policy_match_the_terraform() -> None:
    push = module("modules/function").resource("google_pubsub_subscription", "push")
    retry = push["retry_policy"][0]
    assert _seconds(retry["minimum_backoff"]) == INFRA_RETRY_POLICY.minimum_backoff_seconds
    assert _seconds(retry["maximum_backoff"]) == INFRA_RETRY_POLICY.maximum_backoff_seconds
    assert push["dead_letter_policy"][0]["max_delivery_attempts"] == "${var.max_delivery_attempts}"
    assert module().variables["max_delivery_attempts"]["default"] == INFRA_MAX_DELIVERY_ATTEMPTS
    assert push["ack_deadline_seconds"] == "${min(600, var.timeout_seconds)}"  # FunctionWiring.ack_deadline
    assert push["name"] == "${var.name}-push"
    # The relay is addressed the way infra addresses Cloud Run: <service>/projects/P/topics/T.
    assert push["push_config"][0]["push_endpoint"].endswith(
        "/projects/${var.project_id}/topics/${var.topic_name}"
    )


def test_topics_subscriptions_and_timeouts_match_the_terraform() -> None:
    main = module()
    functions = main.locals["functions"]
    assert {f.function: (f.topic_suffix, f.timeout_seconds) for f in FUNCTIONS} == {
        name: (spec["topic"], spec["timeout_seconds"]) for name, spec in functions.items()
    }
    assert dict(SINKS) == main.locals["sinks"]
    assert main.variables["topic_prefix"]["default"] == TOPIC_PREFIX
    modules = main.modules
    assert modules["pubsub"]["topic_name"] == "${var.topic_prefix}-${each.value.topic}"
    assert modules["function"]["name"] == '${var.topic_prefix}-${replace(each.key, "_", "-")}'
    dead_letter = module("modules/pubsub").resource("google_pubsub_topic", "dead_letter")
    assert dead_letter["name"] == "${var.topic_name}-dead-letter"
    provision = next(f for f in FUNCTIONS if f.function == "provision")
    assert provision.topic() == "tpuprov-pending-pods"
    assert provision.dead_letter_topic() == "tpuprov-pending-pods-dead-letter"
    assert provision.subscription() == "tpuprov-provision-push"
    assert (
        next(f for f in FUNCTIONS if f.function == "setup_cluster").subscription()
        == "tpuprov-setup-cluster-push"
    )
    assert provision.ack_deadline_seconds == 60


# -- the relay ------------------------------------------------------------------------------------


class _Function:
    """A stand-in Cloud Run service: records each request and answers the next queued status."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((dict(self.headers.items()), body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def function() -> Iterator[_Function]:
    fn = _Function()
    fn.thread.start()
    try:
        yield fn
    finally:
        fn.server.shutdown()
        fn.server.server_close()
        fn.thread.join(timeout=5)


@pytest.fixture
def relay(function: _Function) -> Iterator[EventarcRelay]:
    with EventarcRelay("proj", {"tpuprov-pending-pods": ("provision", function.url)}) as running:
        yield running


def _push(relay: EventarcRelay, message: dict[str, Any], topic: str = "tpuprov-pending-pods") -> int:
    import urllib.error
    import urllib.request

    body = json.dumps(
        {"message": message, "subscription": "projects/proj/subscriptions/tpuprov-provision-push"}
    )
    request = urllib.request.Request(
        relay.push_endpoint(topic), data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.mark.integration  # loopback HTTP servers
def test_relay_turns_a_push_into_the_binary_cloudevent_eventarc_sends(
    relay: EventarcRelay, function: _Function
) -> None:
    cluster = ClusterId("proj", "us-east5-b", "c")
    entry = pod_event_entry(cluster, "ns", "pod-0", "", controller=("JobSet", "js"))
    message = pubsub_message(entry, message_id="4242")
    # The emulator's push carries the message in camelCase only; the relay must not need more.
    message.pop("message_id", None)

    assert _push(relay, message) == 200

    headers, body = function.requests[0]
    expected = logentries.binary_cloudevent_headers(message, "projects/proj/topics/tpuprov-pending-pods")
    assert {k.lower(): v for k, v in headers.items() if k.lower() in expected} == expected
    assert json.loads(body) == logentries.eventarc_body(
        message, "projects/proj/subscriptions/tpuprov-provision-push"
    )
    # What functions-framework builds from that request decodes to the pending pod.
    decoded = decode_cloud_event(from_http(headers, body))
    assert isinstance(decoded.event, PodUnschedulable) and decoded.event.pod == "pod-0"
    assert decoded.delivery is not None and decoded.delivery.message_id == "4242"


@pytest.mark.integration  # loopback HTTP servers
@pytest.mark.parametrize(
    ("answers", "pushed_status", "acked"),
    [
        ([200], 200, True),
        ([204], 204, True),
        ([503], 503, False),
        ([500], 500, False),
    ],
    ids=["ok", "no-content", "redeliver-503", "bug-500"],
)
def test_relay_passes_the_function_status_back(
    relay: EventarcRelay, function: _Function, answers: list[int], pushed_status: int, acked: bool
) -> None:
    function.statuses = list(answers)
    message = pubsub_message({"timestamp": "2025-01-01T00:00:00Z"}, message_id="7")
    assert _push(relay, message) == pushed_status
    assert [(d.message_id, d.status, d.acked, d.attempt) for d in relay.deliveries] == [
        ("7", pushed_status, acked, 1)
    ]


@pytest.mark.integration  # loopback HTTP servers
def test_relay_counts_redeliveries_and_reports_an_unreachable_function(function: _Function) -> None:
    with EventarcRelay("proj", {"tpuprov-pending-pods": ("provision", "http://127.0.0.1:9")}) as relay:
        message = pubsub_message({"timestamp": "2025-01-01T00:00:00Z"}, message_id="8")
        assert _push(relay, message) == 502  # nothing listens on port 9: the emulator must retry
        relay.route("tpuprov-pending-pods", "provision", function.url)
        assert _push(relay, message) == 200
        assert [(d.status, d.attempt) for d in relay.deliveries] == [(599, 1), (200, 2)]
        assert _push(relay, message, topic="tpuprov-unknown") == 404


# -- scheduling and node rules --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "names", "topology", "chips"),
    [
        (
            {
                "name": "p1",
                "config": {"machineType": "ct6e-standard-4t", "labels": {"a": "b"}},
                "initialNodeCount": 1,
            },
            ["gke-c-p1-0"],
            "2x2",
            "4",
        ),
        (
            {
                "name": "p4",
                "config": {"machineType": "ct6e-standard-4t"},
                "initialNodeCount": 4,
                "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
            },
            ["gke-c-p4-0", "gke-c-p4-1", "gke-c-p4-2", "gke-c-p4-3"],
            "4x4",
            "4",
        ),
        (
            {"name": "p8", "config": {"machineType": "ct5lp-hightpu-8t"}, "initialNodeCount": 1},
            ["gke-c-p8-0"],
            "2x4",
            "8",
        ),
    ],
    ids=["v6e-single-host", "v6e-multi-host", "v5e-8-chips"],
)
def test_nodes_of_a_tpu_pool(pool: dict[str, Any], names: list[str], topology: str, chips: str) -> None:
    nodes = node_manifests("c", pool_from_gke(pool))
    assert [n["metadata"]["name"] for n in nodes] == names
    for node in nodes:
        node_labels = node["metadata"]["labels"]
        assert node_labels[labels.NODEPOOL] == pool["name"]
        assert node_labels[labels.TPU_TOPOLOGY] == topology
        assert node["status"]["allocatable"][labels.TPU_RESOURCE] == chips
        for key, value in pool["config"].get("labels", {}).items():
            assert node_labels[key] == value


def test_cpu_pool_nodes_have_no_tpu() -> None:
    cpu = {"name": "default-pool", "config": {"machineType": "e2-standard-4"}, "initialNodeCount": 1}
    (node,) = node_manifests("c", pool_from_gke(cpu))
    assert labels.TPU_ACCELERATOR not in node["metadata"]["labels"]
    assert labels.TPU_RESOURCE not in node["status"]["allocatable"]


# -- timeline and demo output ---------------------------------------------------------------------


def test_timeline_filters_and_notifies() -> None:
    timeline = Timeline()
    seen: list[TimelineEntry] = []
    timeline.listen(seen.append)
    timeline.add("relay", "provision <- message 1: HTTP 200 in 3 ms")
    timeline.add("provision", "provision.created: slice[0]")
    assert [e.source for e in seen] == ["relay", "provision"]
    assert timeline.entries(contains="created")[0].source == "provision"
    assert [is_routine(e) for e in seen] == [True, False]
    assert not is_routine(TimelineEntry(0.0, "relay", "provision <- message 1: HTTP 503 in 3 ms"))


# -- child-process ports --------------------------------------------------------------------------


def test_port_ownership_tells_our_listener_from_a_stranger() -> None:
    import os
    import socket

    ports = free_ports(5)
    assert len(set(ports)) == 5
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listener_is_ours(port, os.getpgid(0))
        assert not listener_is_ours(port, 1)  # init's group does not own it
    assert not listener_is_ours(port, os.getpgid(0))  # nobody listens any more


def test_child_ports_come_from_below_the_ephemeral_range() -> None:
    # Outgoing connections and bind(0) draw from the ephemeral range; a child told its port there
    # can find it taken by the time it binds.
    low, _ = ephemeral_range()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(port < low for port in ports), (low, ports)


# -- command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "command", "extra"),
    [
        (["demo"], "demo", {"topology": "2x2", "slices": 2}),
        (["demo", "--topology", "4x4", "--slices", "3"], "demo", {"topology": "4x4", "slices": 3}),
        (["sandbox", "demo", "--verbose"], "demo", {"verbose": True}),
        (["sandbox", "up", "--quiet"], "up", {"quiet": True}),
    ],
    ids=["demo", "demo-options", "sandbox-demo", "sandbox-up"],
)
def test_cli_parses_the_sandbox_commands(argv: list[str], command: str, extra: dict[str, Any]) -> None:
    from sandbox.cli import sandbox as cli_sandbox
    from tpuprov import main as cli

    args = cli.build_parser().parse_args(argv)
    assert args.func is cli_sandbox.run
    assert args.sandbox_command == command
    for key, value in extra.items():
        assert getattr(args, key) == value


def test_cli_refuses_a_demo_without_slices(capsys: pytest.CaptureFixture[str]) -> None:
    from tpuprov import main as cli

    assert cli.main(["demo", "--slices", "0"]) == 2
    assert "--slices must be at least 1" in capsys.readouterr().out
