"""Wire level: the provision function fanning out creates against a GKE emulator with GKE's limits.

The emulator serves every request on its own thread, holds creates for a latency, runs operations for
minutes and answers GKE's 429 beyond a per-cluster operation limit. Assertions count requests and
answers as the emulator saw them, never wall time.
"""

from __future__ import annotations

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.app import entry
from shared.core import labels
from shared.events import entries as logentries
from shared.provisioning.services import Services
from tests.conftest import CLUSTER_ID

pytestmark = pytest.mark.integration


def submit(world, replicas):
    jobset = tpu_jobset("wide", "team-a", replicas=replicas, topology="2x2", chips_per_vm=4)
    return world.kube.submit_jobset(jobset)[1]


def pending_event(pod):
    meta = pod["metadata"]
    return logentries.pod_event_entry(
        CLUSTER_ID,
        meta["namespace"],
        meta["name"],
        meta.get("uid", ""),
        controller=("JobSet", meta["labels"][labels.JOBSET_NAME]),
    )


def configure(world, **overrides):
    entry.reset_runtime(world.settings.with_overrides(**overrides))
    return FunctionClient("provision")


def managed(world):
    return [
        p
        for p in world.gke.pools(world.settings.cluster_path)
        if p["config"].get("labels", {}).get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
    ]


@pytest.mark.parametrize(("widest", "in_flight"), [(64, 6), (4, 4)])
def test_creates_of_a_group_go_in_rounds_from_the_setting_doubling_while_gke_accepts(
    world, widest, in_flight
):
    fn = configure(world, create_concurrency=3, create_concurrency_max=widest)
    pods = submit(world, replicas=9)
    world.gke.set_latency(0.2, ("create",))
    response = fn.post_entry(pending_event(pods[0]))
    assert response.status_code == 200, response.data
    assert world.gke.answered("create", 200) == 9
    # Three, then six (every create of the first round accepted), never wider than the maximum.
    assert world.gke.max_in_flight("create") == in_flight
    assert len(managed(world)) == 9


def test_first_too_many_operations_stops_the_delivery_then_finished_operations_resume(world):
    fn = configure(world, create_concurrency=4)
    pods = submit(world, replicas=16)
    world.gke.set_operation_limit(4)
    world.gke.set_op_durations(600)  # TPU pools take minutes: nothing frees a slot by itself
    world.gke.set_latency(0.05, ("create",))

    response = fn.post_entry(pending_event(pods[0]))
    assert response.status_code == 503  # Pub/Sub redelivers
    assert world.gke.answered("create", 200) == 4
    too_many = world.gke.answered("create", 429)
    # The first round (four) filled GKE's four slots; the second, twice as wide since every create
    # was accepted, meets the 429. Only creates already in flight when the first 429 came back can
    # still meet one; without the stop, every one of the remaining twelve would have been refused.
    assert 1 <= too_many <= 8
    assert world.gke.count("create") == 4 + too_many

    # The 429 named the quota. The redelivery finds the four operations over: it sends four more and
    # acknowledges the rest, which waits for a free slot instead of Pub/Sub's backoff (and its
    # dead-letter topic, for a multislice that needs hours of waves).
    world.gke.finish_operations()
    response = fn.post_entry(pending_event(pods[0]))
    assert response.status_code == 200
    assert world.gke.answered("create", 200) == 8

    # Each finished operation's audit entry (sinks/nodepool-operations.filter) resumes at once.
    resumes = 0
    while world.gke.answered("create", 200) < 16 and resumes < 10:
        world.gke.finish_operations()
        done = logentries.nodepool_operation_entry(CLUSTER_ID, managed(world)[0]["name"])
        assert fn.post_entry(done).status_code == 200
        resumes += 1
    assert resumes == 2  # four per wave under a quota of four
    assert world.gke.answered("create", 200) == 16
    assert world.gke.answered("create", 409) == 0
    assert world.gke.answered("create", 429) == too_many  # no call wasted after the first wave
    assert len(managed(world)) == 16


def test_a_concurrency_refusal_shrinks_the_fan_out_and_later_waves_regrow_it(world):
    fn = configure(world, create_concurrency=2)
    pods = submit(world, replicas=12)
    world.gke.set_operation_limit(4)
    world.gke.set_op_durations(600)  # nothing frees a slot by itself
    world.gke.set_latency(0.05, ("create",))
    # GKE refuses one create of the first round for a conflicting operation, naming no limit.
    world.gke.fail_next("create", 400, "Cluster is running incompatible operation operation-123.")

    assert fn.post_entry(pending_event(pods[0])).status_code == 503  # redelivered
    accepted = [world.gke.answered("create", 200)]
    # GKE ran one operation when it refused: the redelivery sends one create beyond that (the probe)
    # and acknowledges the rest, which waits for a finished operation.
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    accepted.append(world.gke.answered("create", 200))
    # Each wave of finished operations resumes the group, probing one create wider each time GKE
    # accepted the last, until GKE's 429 names its limit (four); from then on no create is refused.
    while accepted[-1] < 12 and len(accepted) < 8:
        world.gke.finish_operations()
        done = logentries.nodepool_operation_entry(CLUSTER_ID, managed(world)[0]["name"])
        fn.post_entry(done)
        accepted.append(world.gke.answered("create", 200))
    waves = [b - a for a, b in zip([0, *accepted], accepted, strict=False)]
    assert waves == [1, 1, 4, 4, 2]
    assert world.gke.answered("create", 400) == 1  # the one conflict
    assert world.gke.answered("create", 429) == 1  # the probe that found GKE's stated limit
    assert len(managed(world)) == 12


def test_deadline_stops_new_creates_before_the_service_timeout(world):
    fn = configure(world, create_concurrency=1, request_deadline_seconds=1)
    pods = submit(world, replicas=12)
    world.gke.set_latency(0.4, ("create",))
    response = fn.post_entry(pending_event(pods[0]))
    assert response.status_code == 503
    sent = world.gke.count("create")
    # Rounds of one, two and four at 0.4 s each: the third starts before the one-second budget ends,
    # a fourth never does, so never all twelve.
    assert 1 <= sent <= 7
    assert world.gke.answered("create", 200) == sent


def test_reconcile_pages_its_lists_and_asks_only_for_pending_pods(world):
    from shared.cloud.gke import GkeNodePoolAPI
    from shared.cloud.kube import KubeClient
    from shared.provisioning.reconciler import Reconciler

    pods = submit(world, replicas=5)
    for pod in pods[:2]:  # two pods already run somewhere
        world.kube.patch_status("v1", "pods", "team-a", pod["metadata"]["name"], {"phase": "Running"})
    world.kube.clear_requests()
    kube = KubeClient(world.kube.api_client("reconcile"), page_size=2)
    summary = Reconciler(Services(world.settings, GkeNodePoolAPI(world.gke.url), kube)).sweep()
    assert summary.requested == 5  # the first pending pod's replicated job, all five slices
    lists = [path for method, path in world.kube.requests if method == "GET" and "limit=2" in path]
    pod_pages = [p for p in lists if p.startswith("/api/v1/pods")]
    assert pod_pages and all("fieldSelector=status.phase%3DPending" in p for p in pod_pages)
    assert len(pod_pages) == 2  # three pending pods, two per page
    assert any("/jobsets" in p for p in lists)
