"""The create fan-out over the stateful fakes: GKE's operation limit, the deadline, the chip budget.

Timing is never measured: a fake clock advanced by the fake GKE stands in for slow calls, and every
assertion counts calls, pools and outcomes.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.clock import FakeClock
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.cloud.retry import Budget
from shared.core import labels
from shared.core.errors import InvalidInputError, OperationLimitError, RejectedError, TransientError
from shared.core.settings import Settings
from shared.provisioning.create.fanout import fan_out
from shared.provisioning.create.known import KNOWN_POOL_TTL_SECONDS
from shared.provisioning.outcomes import CREATED, EXISTS
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolInfo

SETTINGS = Settings(
    unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c", create_concurrency=1
)
CLUSTER = SETTINGS.cluster_path


def submit(kube: FakeKube, replicas: int) -> list[dict]:
    jobset = tpu_jobset("train", "team-a", replicas=replicas, topology="2x2", chips_per_vm=4)
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def deliver(service: Provisioner, pod: dict) -> str:
    meta = pod["metadata"]
    # The event is as fresh as the delivery: a time read at import would age past MAX_EVENT_AGE_SECONDS
    # in a suite that runs longer than that before reaching this module.
    now = datetime.datetime.now(tz=datetime.UTC)
    return service.handle_pending_pod(meta["namespace"], meta["name"], now).result


def refuse_create_number(gke: FakeGke, number: int, error: Exception) -> None:
    """Make the ``number``-th create call (counting from 1) fail with ``error``."""

    def on_call(method: str, target: str) -> None:
        if method == "create" and gke.count("create") == number:
            raise error

    gke.on_call = on_call


@pytest.mark.parametrize(
    ("error", "limit", "listed"),
    [
        # GKE's 429 names its quota (5): with two pools provisioning, three slots are free.
        (
            OperationLimitError(
                '429 Too many operations: cluster "c" hits the concurrent operations quota 5', 5
            ),
            5,
            5,
        ),
        # A 400 names no number: GKE ran the two it accepted and no more, so the redelivery sends
        # one create beyond that (the probe); GKE accepts it and the learnt limit grows to three.
        (OperationLimitError("400 Cluster is running incompatible operation operation-7."), 3, 3),
    ],
    ids=["429-too-many-operations", "400-incompatible-operation"],
)
def test_fan_out_stops_at_the_operation_limit_and_redelivery_finishes_the_group(error, limit, listed):
    gke, kube = FakeGke(), FakeKube()
    pods = submit(kube, replicas=6)
    refuse_create_number(gke, 3, error)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=KNOWN_POOL_TTL_SECONDS))

    with pytest.raises(OperationLimitError, match=r"2 of 6 pools .* 4 left for redelivery"):
        deliver(service, pods[0])
    # Nothing was sent after GKE's refusal: two accepted, the refused third, no more.
    assert gke.count("create") == 3
    assert len(gke.managed_names(CLUSTER)) == 2
    # What GKE accepted is announced at once: one Event on the JobSet and one on the pod.
    assert kube.reasons().count(labels.REASON_REQUESTED) == 2

    gke.on_call = None
    assert deliver(service, pods[0]) == EXISTS  # the redelivery: its own pool exists, siblings follow
    # The rest waits for a finished operation instead of being refused again.
    assert service.operation_limit == limit
    assert len(gke.managed_names(CLUSTER)) == listed
    for name in gke.managed_names(CLUSTER):
        gke.mark(CLUSTER, name, "RUNNING")  # the operations end: their audit entries resume
    assert len(service.resume()) == 6 - listed
    assert len(gke.managed_names(CLUSTER)) == 6
    assert gke.count("create") == 3 + 4  # every pool accepted exactly once, no 409 round trips
    assert set(gke.managed_names(CLUSTER)) == set(requested_names(kube))


def requested_names(kube: FakeKube) -> list[str]:
    """Every pool named by a TPUSliceRequested Event."""
    names = []
    for event in kube.events:
        if event["reason"] == labels.REASON_REQUESTED:
            names += event["message"].removeprefix("requested node pools ").split(" for ")[0].split(", ")
    return names


def test_deadline_stops_new_creates_and_redelivery_continues():
    clock = FakeClock(1000.0)
    gke, kube = FakeGke(), FakeKube()
    pods = submit(kube, replicas=8)

    def slow_gke(method: str, target: str) -> None:
        if method == "create":
            clock.now += 4.0  # each create takes four seconds

    gke.on_call = slow_gke
    settings = SETTINGS.with_overrides(request_deadline_seconds=10)
    service = Provisioner(Services(settings, gke, kube, known_pool_ttl=KNOWN_POOL_TTL_SECONDS, clock=clock))

    with pytest.raises(TransientError, match="time budget") as caught:
        deliver(service, pods[0])
    assert not isinstance(caught.value, OperationLimitError)
    # Creates start at t=0, 4 and 8; at t=12 the 10 s budget is spent and no fourth one starts.
    assert gke.count("create") == 3
    with pytest.raises(TransientError, match="2 left for redelivery"):
        deliver(service, pods[0])  # the redelivery: three more within a fresh budget, two short
    assert gke.count("create") == 6
    assert deliver(service, pods[0]) == EXISTS  # the last two; the group is complete
    assert gke.count("create") == 8
    assert len(gke.managed_names(CLUSTER)) == 8


def test_another_instance_finishes_a_group_whose_requesting_pool_exists():
    # The redelivery may reach an instance that never saw the first attempt: the listing has the
    # requesting pod's pool, but its replicated job (per the pod's labels) has more slices.
    gke, kube = FakeGke(), FakeKube()
    pods = submit(kube, replicas=4)
    refuse_create_number(gke, 2, OperationLimitError("429 Too many operations"))
    with pytest.raises(OperationLimitError):
        deliver(Provisioner(Services(SETTINGS, gke, kube)), pods[0])
    assert len(gke.managed_names(CLUSTER)) == 1

    gke.on_call = None
    reads = kube.reads
    assert deliver(Provisioner(Services(SETTINGS, gke, kube)), pods[0]) == EXISTS
    assert len(gke.managed_names(CLUSTER)) == 4
    assert kube.reads - reads == 3  # the pod, its Job and the JobSet that decides
    # Once the group is complete, an event for an existing pool reads only the pod (and GKE's list).
    reads = kube.reads
    assert deliver(Provisioner(Services(SETTINGS, gke, kube)), pods[-1]) == EXISTS
    assert kube.reads - reads == 1
    assert gke.count("create") == 2 + 3


def test_chip_budget_is_reserved_before_concurrent_creates():
    gke, kube = FakeGke(), FakeKube()
    pods = submit(kube, replicas=4)
    settings = SETTINGS.with_overrides(create_concurrency=4, chip_budget=8)  # two slices of 4 chips
    assert deliver(Provisioner(Services(settings, gke, kube)), pods[0]) == CREATED
    assert gke.count("create") == 2
    # Both refusals say the same thing: one Event on the pod and one on its JobSet, each counted
    # twice (as Kubernetes' recorder aggregates).
    refused = [e for e in kube.events if e["reason"] == labels.REASON_REFUSED]
    assert sorted((e["kind"], e["count"]) for e in refused) == [("JobSet", 2), ("Pod", 2)]


def test_concurrent_fan_out_creates_each_pool_once_and_records_every_outcome():
    gke, kube = FakeGke(), FakeKube()
    pods = submit(kube, replicas=12)
    gke.add(CLUSTER, NodePoolInfo(name="unrelated", status="RUNNING"))
    gke.fail("create", "rejected")  # one of the twelve is refused for good
    service = Provisioner(Services(SETTINGS.with_overrides(create_concurrency=5), gke, kube))
    outcome = service.provision_pod(kube.get_pod("team-a", pods[0]["metadata"]["name"]))
    assert gke.count("create") == 12
    assert len(outcome.requested) == 11
    assert kube.reasons().count(labels.REASON_REQUESTED) == 2  # one per group: the JobSet and the pod
    assert set(outcome.requested) == set(requested_names(kube))
    assert kube.reasons().count(labels.REASON_FAILED) == 1


# --- fan_out itself ------------------------------------------------------------------------------


def test_fan_out_keeps_input_order_and_hands_back_what_was_not_sent():
    sent: list[int] = []

    def call(item: int) -> None:
        sent.append(item)
        if item == 2:
            raise OperationLimitError("429 Too many operations")
        if item == 1:
            raise RejectedError("400 bad", 400)

    result = fan_out([0, 1, 2, 3, 4], call, concurrency=1, budget=Budget(60))
    assert sent == [0, 1, 2]
    assert [(item, type(err).__name__ if err else None) for item, err in result.sent] == [
        (0, None),
        (1, "RejectedError"),
        (2, "OperationLimitError"),
    ]
    assert result.unsent == [3, 4]
    assert "Too many operations" in result.stopped


def test_fan_out_propagates_bugs_from_workers():
    def call(item: int) -> None:
        raise ZeroDivisionError(item)

    with pytest.raises(ZeroDivisionError):
        fan_out([1, 2, 3], call, concurrency=3, budget=Budget(60))


# --- settings ------------------------------------------------------------------------------------


def test_fan_out_settings_parse_and_validate():
    parsed = Settings.from_env(
        {"CREATE_CONCURRENCY": "4", "REQUEST_DEADLINE_SECONDS": "30", "KUBE_LIST_PAGE_SIZE": "250"}
    )
    assert (parsed.create_concurrency, parsed.request_deadline_seconds, parsed.kube_list_page_size) == (
        4,
        30,
        250,
    )
    defaults = Settings()
    assert (defaults.create_concurrency, defaults.request_deadline_seconds) == (8, 45)
    for name in ("CREATE_CONCURRENCY", "REQUEST_DEADLINE_SECONDS", "KUBE_LIST_PAGE_SIZE"):
        with pytest.raises(InvalidInputError, match=name):
            Settings.from_env({name: "0"})


class RacingKube(FakeKube):
    """Runs ``during_read`` once, the first time provision reads the JobSet (after it listed the pools)."""

    during_read: Callable[[], None] | None = None

    def get_jobset(self, namespace: str, name: str) -> dict:
        hook, self.during_read = self.during_read, None
        if hook is not None:
            hook()
        return super().get_jobset(namespace, name)


def test_a_resume_racing_a_pending_pods_event_sends_no_second_create():
    # A finished operation's resume lists the pools while a pending pod's event in the same instance
    # is between its own listing and its creates: both see the group missing.
    gke, kube = FakeGke(), RacingKube()
    pods = submit(kube, replicas=2)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=KNOWN_POOL_TTL_SECONDS))
    listed = threading.Event()
    resumed: list[list[str]] = []
    gke_list = gke.list_node_pools

    def list_then_signal(cluster: str) -> list[NodePoolInfo]:
        pools = gke_list(cluster)
        if threading.current_thread().name == "resume":
            listed.set()
        return pools

    gke.list_node_pools = list_then_signal  # type: ignore[method-assign]
    resume = threading.Thread(target=lambda: resumed.append(service.resume()), name="resume")

    def start_resume_and_wait_for_its_listing() -> None:
        resume.start()
        assert listed.wait(5)

    kube.during_read = start_resume_and_wait_for_its_listing
    assert deliver(service, pods[0]) == CREATED
    resume.join(5)

    # The resume waited for the event's decision and found both pools just created: nothing sent.
    assert resumed == [[]]
    assert gke.count("create") == 2
    assert len(gke.managed_names(CLUSTER)) == 2
