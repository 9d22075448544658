"""Capacity fallback through the real services: a stockout or quota failure moves the slice to the
policy's next option at once; only when every option failed does the slice back off."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.clock import FakeClock
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.errors import TransientError
from shared.provisioning.outcomes import CREATED, EXISTS, SKIPPED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from tests.unit.provisioning.stockouts import (
    CLUSTER,
    SETTINGS,
    STOCKOUT,
    T0,
    failed_events,
    pending,
    record,
    stock_out,
)

B, A = "us-east5-b", "us-east5-a"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


POLICY = SETTINGS.with_overrides(node_locations=(B, A), capacity_policy=f"spot@{B}, spot@{A}, on-demand@{B}")


def submit(
    cluster: FakeKube, selectors: dict[str, str] | None = None, **annotations: str
) -> list[dict[str, Any]]:
    jobset = tpu_jobset("a", "team-a", replicas=1, selectors=selectors, annotations=annotations or None)
    cluster.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        cluster.add_pod(pod)
    return pods


class Recorder:
    """FakeGke keeps only the latest spec per pool; record each accepted create as it happens."""

    def __init__(self, fake: FakeGke) -> None:
        self.seen: list[str] = []
        original = fake.create_node_pool

        def create(cluster: str, spec: Any, why: str) -> str:
            result = original(cluster, spec, why)
            kind = "spot" if spec.spot else "flex-start" if spec.flex_start else "on-demand"
            self.seen.append(f"{kind}@{spec.node_locations[0]}")
            return result

        fake.create_node_pool = create  # type: ignore[method-assign]


def test_a_stockout_falls_back_to_the_next_option_at_once_and_only_then_backs_off(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    created = Recorder(gke)
    pods = submit(kube)
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))

    assert pending(provision, pods[0]) == CREATED
    stock_out(gke)
    # The next sighting records attempt 1 and deletes the failed pool to make room for attempt 2.
    assert pending(provision, pods[0]) == EXISTS
    assert gke.managed_names(CLUSTER) == []
    assert record(kube)[next(iter(record(kube)))]["next"] == f"spot@{A}"
    assert pending(provision, pods[0]) == CREATED  # no wait: another option is left
    stock_out(gke)
    pending(provision, pods[0])
    assert pending(provision, pods[0]) == CREATED
    assert created.seen == [f"spot@{B}", f"spot@{A}", f"on-demand@{B}"]
    messages = [e["message"] for e in failed_events(kube)]
    assert any(f"falling back to spot@{A} now" in m for m in messages)
    assert any(f"falling back to on-demand@{B} now" in m for m in messages)

    stock_out(gke)  # the whole policy failed: one round, backoff before starting over
    assert pending(provision, pods[0]) == EXISTS
    [entry] = record(kube).values()
    assert (entry["attempts"], entry["rounds"], entry.get("next")) == (3, 1, None)
    assert gke.managed_names(CLUSTER) != []  # kept in ERROR (no nodes, no cost) while backing off


def test_a_pod_that_selects_spot_never_falls_back_to_on_demand(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    created = Recorder(gke)
    pods = submit(kube, {labels.SPOT: "true", labels.ZONE: B})
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    pending(provision, pods[0])
    [entry] = record(kube).values()
    assert (entry["option"], entry.get("next"), entry["rounds"]) == (f"spot@{B}", None, 1)
    assert created.seen == [f"spot@{B}"] and gke.managed_names(CLUSTER)  # waits, in ERROR


def test_a_quota_refusal_falls_back_by_redelivery(gke: FakeGke, kube: FakeKube, clock: FakeClock) -> None:
    created = Recorder(gke)
    pods = submit(kube)
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    gke.fail("create", "quota")
    with pytest.raises(TransientError, match=f"falling back to spot@{A}"):
        pending(provision, pods[0])
    assert pending(provision, pods[0]) == CREATED  # the redelivery, seconds later
    assert created.seen == [f"spot@{A}"]


def test_the_jobset_annotation_chooses_the_policy(gke: FakeGke, kube: FakeKube, clock: FakeClock) -> None:
    created = Recorder(gke)
    pods = submit(kube, **{labels.CAPACITY_POLICY: f"on-demand@{A}"})
    pending(Provisioner(Services(POLICY, gke, kube, wall_clock=clock)), pods[0])
    assert created.seen == [f"on-demand@{A}"]


def test_a_bad_annotation_is_refused_on_the_pod_and_nothing_is_created(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube, **{labels.CAPACITY_POLICY: "cheapest"})
    assert pending(Provisioner(Services(POLICY, gke, kube, wall_clock=clock)), pods[0]) == "refused"
    assert gke.count("create") == 0
    assert any(
        "kind must be one of" in e["message"] for e in kube.events if e["reason"] == labels.REASON_REFUSED
    )


def test_reconcile_recycles_a_failed_pool_at_once_when_the_policy_has_another_option(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    created = Recorder(gke)
    pods = submit(kube)
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    reconciler = Reconciler(Services(POLICY, gke, kube, wall_clock=clock))
    summary = reconciler.sweep()
    assert summary.backing_off == 0 and gke.managed_names(CLUSTER) == []
    reconciler.sweep()  # the next sweep requests the slice on its next option
    assert created.seen == [f"spot@{B}", f"spot@{A}"]
    assert STOCKOUT in " ".join(e["message"] for e in failed_events(kube))


def test_after_a_failed_round_the_slice_waits_then_starts_over_with_the_first_option(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    created = Recorder(gke)
    settings = POLICY.with_overrides(capacity_policy="spot, on-demand")
    pods = submit(kube)
    provision = Provisioner(Services(settings, gke, kube, wall_clock=clock))
    for _ in range(2):  # spot fails, on-demand fails
        pending(provision, pods[0])
        stock_out(gke)
        pending(provision, pods[0])
    assert created.seen == [f"spot@{B}", f"on-demand@{B}"]
    reconciler = Reconciler(Services(settings, gke, kube, wall_clock=clock))
    reconciler.sweep()
    assert gke.managed_names(CLUSTER)  # backing off: the failed pool stays
    clock.now += 300
    reconciler.sweep()  # recycled once the backoff is over
    reconciler.sweep()
    assert created.seen[-1] == f"spot@{B}"  # a new round starts at the top of the policy
    assert pending(provision, pods[0]) in (EXISTS, SKIPPED)


@pytest.mark.parametrize("answer", ["reservation-full", "reservation-missing"])
def test_a_reservation_gke_cannot_use_falls_back_to_the_next_option(
    gke: FakeGke, kube: FakeKube, clock: FakeClock, answer: str
) -> None:
    created = Recorder(gke)
    settings = POLICY.with_overrides(capacity_policy="reservation:tpu-res, on-demand")
    pods = submit(kube)
    provision = Provisioner(Services(settings, gke, kube, wall_clock=clock))
    gke.fail("create", answer)
    with pytest.raises(TransientError, match=f"falling back to on-demand@{B}"):
        pending(provision, pods[0])
    assert pending(provision, pods[0]) == CREATED
    assert created.seen == [f"on-demand@{B}"]
    [entry] = record(kube).values()
    assert entry["option"] == f"reservation:tpu-res@{B}"


def test_a_pod_selecting_a_full_reservation_backs_off_instead_of_retrying_forever(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube, {labels.RESERVATION_NAME: "tpu-res"})
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    gke.fail("create", "reservation-full", times=3)
    assert pending(provision, pods[0]) == "failed"  # acknowledged: no redelivery storm
    assert pending(provision, pods[0]) == SKIPPED  # backing off
    assert gke.count("create") == 1
    assert any("retrying in 5 min" in e["message"] for e in failed_events(kube))


def test_a_policy_broken_after_the_create_backs_off_instead_of_failing_the_delivery(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube, **{labels.CAPACITY_POLICY: "spot, on-demand"})
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    kube.jobsets[("team-a", "a")]["metadata"]["annotations"][labels.CAPACITY_POLICY] = "cheapest"
    assert pending(provision, pods[0]) == EXISTS
    [entry] = record(kube).values()
    assert (entry.get("next"), entry["rounds"]) == (None, 1)  # no fallback: back off
    assert gke.managed_names(CLUSTER)  # the failed pool waits out its backoff


@pytest.mark.parametrize("answer", ["429", "incompatible"])
def test_a_fallback_delete_gke_refuses_for_now_is_redelivered_and_then_done(
    gke: FakeGke, kube: FakeKube, clock: FakeClock, answer: str
) -> None:
    created = Recorder(gke)
    pods = submit(kube)
    provision = Provisioner(Services(POLICY, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    gke.fail("delete", answer)  # every operation slot taken, or another operation on the cluster
    with pytest.raises(TransientError):
        pending(provision, pods[0])
    assert gke.managed_names(CLUSTER)  # the failed pool is still there; nothing was created beside it
    assert pending(provision, pods[0]) == EXISTS  # the redelivery deletes it
    assert gke.managed_names(CLUSTER) == []
    assert pending(provision, pods[0]) == CREATED
    assert created.seen == [f"spot@{B}", f"spot@{A}"]
    [entry] = record(kube).values()
    assert entry["attempts"] == 1  # the refused delete did not count as another failed attempt
