"""The product on each supported JobSet x Kueue pair (``make test-matrix``), on the real components.

Per pair (``sandbox.realstack.versions.MATRIX``: every supported JobSet and Kueue version at least
once), one ``RealStack`` whose ``setup_cluster`` installs that pair as an operator would make it
(JOBSET_VERSION / KUEUE_VERSION with the files' sha256), the controllers being that version's
binaries built from its own Go module (``sandbox.kube.build``). Then the tutorial flow on the
pending-pod path with its handovers (``sandbox.realstack.demo.run``), and the admission-check flow
(``examples/kueue/tpu-slices-check.yaml``, as ``test_admission_flow``), whose JobSets start on all
their slices without a pod ever waiting for one. Then, on a stack of its own so that its counts are
its own, the handover scenario (``sandbox.bench.handover``: same-shape JobSets through a queue that
admits two at a time cost two pools).

Opt-in (``TPUPROV_VERSION_MATRIX=1``, which ``make test-matrix`` sets): the first run builds four
more controllers, which takes long on a 2-core machine (docs/sandbox.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from sandbox.bench import handover
from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.realstack.versions import Pair, matrix
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from sandbox.testing.stack import REAL_FAST
from shared.app.deployment import RetryPolicy
from shared.core import labels
from shared.setup.manifests import VERSION_ANNOTATION
from shared.setup.support import support
from tests.paths import REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("TPUPROV_VERSION_MATRIX"),
        reason="the version matrix builds extra controllers: make test-matrix (TPUPROV_VERSION_MATRIX=1)",
    ),
]

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
CHECKED = (("checked-3", 3), ("checked-1", 1), ("checked-2", 2))
BASE = StackConfig(
    functions=ALL_FUNCTIONS,
    function_env={"SUSPEND_GRACE_SECONDS": "1"},
    gke_op_delay=1.0,
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
)
DEPLOYMENTS = {
    "jobset": "/apis/apps/v1/namespaces/jobset-system/deployments/jobset-controller-manager",
    "kueue": "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager",
}


@pytest.fixture(scope="module", params=matrix(), ids=str)
def pair(request: pytest.FixtureRequest) -> Pair:
    return request.param


@pytest.fixture(scope="module")
def stack(pair: Pair) -> Iterator[RealStack]:
    with RealStack(pair.config(BASE)) as running:
        yield running


@pytest.fixture(scope="module")
def tutorial(stack: RealStack) -> demo.Outcome:
    return demo.run(stack, run_seconds=5, timeout=480)


def test_setup_installs_the_pair_and_its_controllers_run(
    pair: Pair, stack: RealStack, tutorial: demo.Outcome
) -> None:
    api = stack.kube_cluster.client()
    wanted = {"jobset": pair.jobset, "kueue": pair.kueue}
    for name, path in DEPLOYMENTS.items():
        deployment = api.get(path)
        assert deployment is not None
        assert deployment["metadata"]["annotations"][VERSION_ANNOTATION] == wanted[name]
        assert support(name, wanted[name]).tested
    decisions = {d["component"]: d for d in stack.decisions("setup.component", function="setup_cluster")}
    assert {c: (d["action"], d["pinned"]) for c, d in decisions.items()} == {
        "jobset": ("installed", pair.jobset),
        "kueue": ("installed", pair.kueue),
    }
    assert stack.releases is not None
    assert {name: version for name, (version, _) in stack.releases.running.items()} == wanted
    assert stack.releases.errors == []


def test_the_tutorial_flow_runs_with_its_handovers(stack: RealStack, tutorial: demo.Outcome) -> None:
    assert tutorial.problems == []
    assert tutorial.states == {name: "Completed" for name, _ in demo.JOBSETS}
    summary = tutorial.summary
    assert summary.pools_created >= 3
    assert summary.pools_deleted == summary.pools_created
    assert summary.pools_leaked == [] and summary.pods_killed == 0
    assert summary.pools_adopted >= 1  # the 3-slice JobSet's pools handed to the next ones
    adopters = {e["involvedObject"]["name"] for e in stack.events(labels.REASON_ADOPTED, "default")}
    assert adopters and adopters <= {"multislice-1", "multislice-2"}, adopters
    print(f"\n{stack.config.function_env.get('KUEUE_VERSION')}: tutorial {tutorial.seconds}")


def test_the_admission_check_gives_every_jobset_all_its_slices_before_it_starts(
    stack: RealStack, tutorial: demo.Outcome
) -> None:
    started = time.monotonic()
    demo.apply_queues(stack, (REPO / "examples" / "kueue" / "tpu-slices-check.yaml").read_text(), 120)
    api = stack.kube_cluster.client()

    def queue_active() -> bool:
        queue = api.get(f"{KUEUE}/clusterqueues/cluster-queue") or {}
        spec = queue.get("spec") or {}
        checks = spec.get("admissionChecksStrategy") or spec.get("admissionChecks")
        conditions = (queue.get("status") or {}).get("conditions") or []
        active = any(c["type"] == "Active" and c["status"] == "True" for c in conditions)
        return bool(checks) and active

    stack.wait_for(queue_active, 120, "the ClusterQueue with the check, Active")
    for name, slices in CHECKED:
        stack.submit(demo.queued_jobset(name, slices, run_seconds=5))
    for name, _ in CHECKED:
        stack.wait_for(
            lambda n=name: stack.jobset_state(demo.NAMESPACE, n) in ("Completed", "Failed"),  # type: ignore[misc]
            420,
            f"JobSet {name} to finish",
        )
    stack.wait_for(lambda: not stack.managed_pools(), 240, "every TPU pool to be deleted")
    assert {n: stack.jobset_state(demo.NAMESPACE, n) for n, _ in CHECKED} == dict.fromkeys(
        (n for n, _ in CHECKED), "Completed"
    )
    # No pod of these JobSets was ever pending for a slice: the check made each Workload Ready first.
    pending = [
        e
        for e in stack.events("FailedScheduling")
        if any(e["involvedObject"]["name"].startswith(f"{n}-") for n, _ in CHECKED)
    ]
    assert pending == []
    # Each Workload made Ready by the check with all its slices (the tutorial phase had no check).
    ready = {d["message"].split(":")[0] for d in stack.decisions("admission.ready")}
    assert len(ready) == len(CHECKED)
    assert all("pools ready" in d["message"] for d in stack.decisions("admission.ready"))
    summary = stack.summary()
    assert summary.pools_leaked == [] and summary.pods_killed == 0
    print(f"\nadmission-check flow: {time.monotonic() - started:.0f}s")


def test_same_shape_jobsets_through_a_queue_hand_their_pools_on(pair: Pair) -> None:
    # The bench's handover part (as tests/sandbox/test_bench.py judges it on the pinned pair): Kueue
    # admits the next JobSet when one completes, and that version's JobSet controller brings its pods
    # onto the pool the finished one leaves, so 4 JobSets cost the 2 pools the queue runs at once.
    result = handover.run(
        handover.HandoverShape(jobsets=4, run_seconds=4.0, timeout=180), pair.config(REAL_FAST)
    )
    print(result.timeline)  # pytest shows it when the test failed
    assert result.problems == []
    assert result.completed == 4
    assert result.creates == result.pools_created == handover.CONCURRENT
    assert result.pools_deleted == handover.CONCURRENT and result.pools_leaked == []
    assert result.pods_killed == 0
    assert [t.handed_over for t in result.timings] == [False, False, True, True]
    print(f"\n{pair}: handover {result.seconds:.0f}s")
