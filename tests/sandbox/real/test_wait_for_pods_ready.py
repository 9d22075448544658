"""Kueue v0.19's waitForPodsReady (on by default) on the pending-pod path, on the real components.

Kueue v0.19.2 turns waitForPodsReady on with a 30 min timeout when the config leaves it out
(apis/config/v1beta2/defaults.go: ``cfg.WaitForPodsReady = cmp.Or(cfg.WaitForPodsReady,
&WaitForPodsReady{})``, DefaultWaitForPodsReadyTimeout). A Workload admitted whose pods are not all
Ready within the timeout is evicted with reason PodsReadyTimeout and requeued after a backoff of
about ``backoffBaseSeconds * 2^(n-1)`` (``requeueState.requeueAt``); once ``backoffLimitCount``
requeues are spent it is deactivated instead (RequeuingLimitExceeded) and never comes back
(pkg/controller/core/workload_controller.go: reconcileNotReadyTimeout, triggerDeactivation;
pkg/workload/workload.go: UpdateRequeueState).

On the pending-pod path a new pool takes longer than a short timeout: here the operator shortens
it in the release's ConfigMap (``kueue-manager-config``) and restarts the Deployment, which is how
the sandbox configures Kueue too (``sandbox.kube.addons`` starts the controller from that ConfigMap;
``ReleaseWiring`` restarts it when the Deployment's pod template changes). What the product does
with the pools: Kueue's eviction suspends the JobSet, and a suspended JobSet's pools are kept for
SUSPEND_GRACE_SECONDS. A Workload requeued within it gets its pool back (no second create); one
that never returns (deactivated) has its pool released once the grace has passed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sandbox.kube.api import ApiError
from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.app.deployment import RetryPolicy
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT = 8  # seconds; Kueue's default is 30 min
BACKOFF_BASE = 15  # the first requeue comes about this long after the eviction
SUSPEND_GRACE = 40  # longer than the backoff: the requeued Workload finds its pool
POOL_SECONDS = 20  # a pool create takes longer than the timeout...
SLOWER_POOL_SECONDS = 60  # ...and this one longer than the timeout twice over plus the backoff
CONFIG_MAP = "/api/v1/namespaces/kueue-system/configmaps/kueue-manager-config"
DEPLOYMENT = "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads"
CONFIG = StackConfig(
    functions=ALL_FUNCTIONS,
    function_env={"SUSPEND_GRACE_SECONDS": str(SUSPEND_GRACE)},
    gke_op_delay=POOL_SECONDS,
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
)


def _workload(stack: RealStack, name: str) -> dict[str, Any] | None:
    try:
        listed = stack.kube_cluster.client().list(WORKLOADS)
    except ApiError as exc:
        if exc.status != 429:  # "storage is (re)initializing": a CRD was just written
            raise
        return None
    for found in listed:
        if any(o.get("name") == name for o in found["metadata"].get("ownerReferences") or []):
            return found
    return None


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    return {}


def _creates(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return [d for d in stack.decisions("provision.created") if f"default/{name} " in str(d.get("slice"))]


def _owned(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in stack.managed_pools()
        if ((p.get("config") or {}).get("labels") or {}).get(labels.OWNER_NAME) == name
    ]


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(CONFIG) as running:
        running.setup(timeout=300)
        api = running.kube_cluster.client()
        # The operator's edit: a short timeout, a short backoff, one requeue at most.
        config_map = api.get(CONFIG_MAP)
        assert config_map is not None
        key = "controller_manager_config.yaml"
        config = yaml.safe_load(config_map["data"][key])
        assert "waitForPodsReady" not in config  # the release leaves it out: v0.19's default applies
        config["waitForPodsReady"] = {
            "timeout": f"{TIMEOUT}s",
            "requeuingStrategy": {"backoffBaseSeconds": BACKOFF_BASE, "backoffLimitCount": 1},
        }
        api.patch(CONFIG_MAP, {"data": {key: yaml.safe_dump(config, sort_keys=False)}})
        # kubectl rollout restart: a new pod template, so a new controller reads the new config.
        restarted = {"kubectl.kubernetes.io/restartedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        api.patch(DEPLOYMENT, {"spec": {"template": {"metadata": {"annotations": restarted}}}})
        assert running.releases is not None
        releases = running.releases
        running.wait_for(
            lambda: (
                any(r.startswith("kueue") for r in releases.restarts) and releases.wait_ready("kueue", 0.1)
            ),
            180,
            "Kueue restarted with the operator's config",
        )
        running.wait_for(releases.admits_jobsets, 120, "the webhooks after the restart")
        demo.apply_default_queues(running, 120)
        yield running


def test_a_workload_requeued_after_the_timeout_gets_its_pool_back_and_runs(stack: RealStack) -> None:
    name = "slow-pool"
    stack.submit(demo.queued_jobset(name, 1, run_seconds=5))
    # Kueue evicts it while its pool is still being created...
    stack.wait_for(
        lambda: _condition(_workload(stack, name), "Evicted").get("reason") == "PodsReadyTimeout",
        120,
        "Kueue to evict it for PodsReadyTimeout",
    )
    evicted = _condition(_workload(stack, name), "Evicted")
    assert "Exceeded the PodsReady timeout" in evicted["message"]
    requeue = (_workload(stack, name) or {})["status"].get("requeueState") or {}
    assert requeue.get("count") == 1 and requeue.get("requeueAt")
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Suspended", 60, "the JobSet suspended")
    # ...requeues it after the backoff, and it runs on the pool created for its first admission.
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 240, f"{name} to complete")
    assert len(_creates(stack, name)) == 1  # the pool was kept for the requeued Workload
    assert _condition(_workload(stack, name), "Finished").get("status") == "True"
    stack.wait_for(lambda: not _owned(stack, name), 180, "its pool to be released once it completed")
    summary = stack.summary()
    assert summary.pods_killed == 0 and summary.pools_leaked == []


def test_a_workload_that_never_returns_has_its_pool_released_after_the_grace(stack: RealStack) -> None:
    name = "never-back"
    stack.gke.set_op_delay(SLOWER_POOL_SECONDS)
    try:
        stack.submit(demo.queued_jobset(name, 1, run_seconds=5))

        # Timed out twice (the second time after its one requeue): Kueue deactivates it for good. It
        # turns spec.active false first and writes the Evicted condition's new reason in a later
        # reconcile, so the wait is for both, as asserted below.
        def deactivated() -> dict[str, Any] | None:
            found = _workload(stack, name) or {}
            reason = str(_condition(found, "Evicted").get("reason", ""))
            done = found.get("spec", {}).get("active") is False and reason.startswith("Deactivated")
            return found if done else None

        workload = stack.wait_for(deactivated, 240, "Kueue to deactivate it (Evicted: Deactivated...)")
    finally:
        stack.gke.set_op_delay(POOL_SECONDS)
    evicted = _condition(workload, "Evicted")
    assert evicted.get("reason", "").startswith("Deactivated"), evicted
    assert "RequeuingLimitExceeded" in evicted.get("reason", "") + str(_condition(workload, "Requeued"))
    # Kueue stops the job of a deactivated Workload: the JobSet is suspended and stays so.
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Suspended", 60, "the JobSet suspended")
    assert len(_creates(stack, name)) == 1
    # Its pool is kept for the grace, then released (the reconcile sweep looks again).

    def released() -> bool:
        stack.trigger_reconcile()
        return bool(_creates(stack, name)) and not _owned(stack, name)

    stack.wait_for(released, SLOWER_POOL_SECONDS + SUSPEND_GRACE + 120, "its pool to be released", interval=5)
    deletes = [
        d
        for d in stack.decisions()
        if str(d.get("event", "")).startswith("release") and name in str(d.get("message", ""))
    ]
    assert any("suspended for" in str(d.get("message")) for d in deletes), deletes
    summary = stack.summary()
    assert summary.pods_killed == 0 and summary.pools_leaked == []
