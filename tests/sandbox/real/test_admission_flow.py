"""The tutorial flow with the admission check on, end to end on the real components (``RealStack``).

The product's ``setup_cluster`` installs the JobSet and Kueue releases; ``apply_kueue`` applies
``examples/kueue/tpu-slices-check.yaml`` (the tutorial's 24 chips of v5e 2x4 with ``tpuSlicesCheck``);
JobSets of 3, 1 and 2 slices are queued. Nothing here calls the product directly: Kueue's
``QuotaReserved`` Events reach ``provision`` through the ``workload-quota-reserved`` sink, finished
creates through ``nodepool-operations``, and real Kueue admits each JobSet once the check is Ready.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import JOBSETS, NAMESPACE, queued_jobset
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.app.deployment import TOPIC_PREFIX, RetryPolicy, wiring
from shared.core import labels
from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
CONFIG = StackConfig(
    functions=ALL_FUNCTIONS,
    gke_op_delay=1.0,
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
)


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(CONFIG) as running:
        running.setup(timeout=300)
        topic = running.publisher.topic_path(
            running.config.project, wiring("apply_kueue").topic(TOPIC_PREFIX)
        )
        config = (REPO / "examples" / "kueue" / "tpu-slices-check.yaml").read_bytes()
        running.publisher.publish(topic, config).result(timeout=30)
        api = running.kube_cluster.client()

        def queue_active() -> bool:
            queue = api.get(f"{KUEUE}/clusterqueues/cluster-queue") or {}
            conditions = (queue.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

        # apply_kueue marks the check Active, without which Kueue keeps the queue inactive.
        running.wait_for(queue_active, 120, "the ClusterQueue with the check Active")
        yield running


# The waits' bound stays under the test's own timeout, so a slow run fails with the stack's
# timeline (wait_for's explanation) rather than pytest-timeout's thread dump.
@pytest.mark.timeout(720)
def test_every_jobset_starts_with_all_its_slices_and_no_pod_ever_waits_for_one(stack: RealStack) -> None:
    started = time.monotonic()
    for name, slices in JOBSETS:
        stack.submit(queued_jobset(name, slices, run_seconds=5))

    def unfinished() -> list[str]:
        return [n for n, _ in JOBSETS if stack.jobset_state(NAMESPACE, n) not in ("Completed", "Failed")]

    stack.wait_for(lambda: not unfinished(), 420, "every JobSet to finish")
    # A pool kept idle for a queued JobSet that ran on pools of its own goes at the reconcile
    # sweep, after its handover window (seen in CI); every other pool at its release.
    stack.wait_pools_gone(240)
    assert {name: stack.jobset_state(NAMESPACE, name) for name, _ in JOBSETS} == {
        name: "Completed" for name, _ in JOBSETS
    }
    # No pod was ever pending for a slice: the scheduler never failed to place a JobSet pod.
    pending = [e for e in stack.events("FailedScheduling") if e["involvedObject"]["kind"] == "Pod"]
    assert pending == []
    # Each JobSet's Workload was made Ready by the check with all its slices.
    ready = {d["message"].split(":")[0] for d in stack.decisions("admission.ready")}
    assert len(ready) == len(JOBSETS)
    assert all("pools ready" in d["message"] for d in stack.decisions("admission.ready"))
    assert not stack.decisions("provision.created")  # the pending-pod path created nothing
    summary = stack.summary()
    assert summary.pools_leaked == [] and summary.pods_killed == 0
    # 6 slices in all: each either created by the check or handed over from a finished JobSet.
    assert summary.pools_created + summary.pools_adopted >= 6 - 0
    assert summary.pools_created <= 6
    print(
        f"\nadmission flow: {time.monotonic() - started:.0f}s; pools created {summary.pools_created}, "
        f"handed over {summary.pools_adopted}, deleted {summary.pools_deleted}, leaked 0, pods killed 0, "
        f"pods ever pending for a slice 0"
    )
    assert labels.MANAGED_BY  # the summary counts the product's pools by its managed-by label
