"""GKE's operation slots: how many node-pool operations the cluster runs at once, and resuming when one frees.

GKE runs a limited number of node-pool operations per cluster at a time and answers the next one
with 429 "Too many operations: cluster "c" hits the concurrent operations quota N", naming N. The
provisioner sends no more creates than there are free slots (pools with a running operation hold
one each), so a large multislice costs at most one refused call per wave; the slices that must wait
are acknowledged, not redelivered (a wait of hours would exhaust Pub/Sub's delivery attempts). GKE's
audit entry of each finished operation reaches provision (``sinks/nodepool-operations.filter``) and
``resume`` requests the waiting slices at once; the reconcile sweep is the safety net.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from shared.core import labels, logs
from shared.core.errors import NotEligible, Refused
from shared.provisioning.known import group_of
from shared.provisioning.requests import pod_created_at
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_PROVISIONING,
    STATUS_RECONCILING,
    STATUS_STOPPING,
    NodePoolInfo,
)
from shared.tpu.slices import slice_request

if TYPE_CHECKING:
    from shared.provisioning.provisioner import Provisioner

log = logs.get("provision")

_QUOTA = re.compile(r"concurrent operations quota (\d+)")
# Pool states that hold one of the cluster's operation slots (an operation is running on the pool).
BUSY = (STATUS_PROVISIONING, STATUS_STOPPING, STATUS_RECONCILING)


def stated_quota(message: str) -> int | None:
    """The quota a GKE 429 names, or None."""
    match = _QUOTA.search(message)
    return int(match.group(1)) if match else None


def free(limit: int | None, pools: list[NodePoolInfo]) -> int | None:
    """Free operation slots given the listing, None when the quota is unknown."""
    if limit is None:
        return None
    return max(0, limit - sum(1 for p in pools if p.status in BUSY))


def resume(provisioner: Provisioner, pool: str = "") -> list[str]:
    """Request waiting slices (pending JobSet pods without their pool), oldest pod first, while slots last.

    ``pool`` is the pool whose operation ended: the instance forgets what it remembered of it, so a
    create that ended in ERROR (a stockout) is reported on its JobSet now, through the same path as
    a pending pod's event. Each slice is requested exactly as provision requests it (its whole
    replicated job, the JobSet read deciding). Returns the pools requested.
    """
    if pool:
        provisioner.known_pools.forget(pool)
    cluster = provisioner.settings.cluster_path
    pods = provisioner.kube.list_pods(
        label_selector=labels.JOBSET_NAME, field_selector="status.phase=Pending"
    )
    pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp", "")))
    pools = provisioner.gke.list_node_pools(cluster)
    requested: list[str] = []
    done: set[str] = set()
    for pod in pods:
        try:
            request = slice_request(pod)
        except (NotEligible, Refused):
            continue
        name = request.pool_name
        existing = next((p for p in pools if p.name == name), None)
        if name in done or (existing is not None and existing.status != STATUS_ERROR):
            continue
        if existing is None and free(provisioner.operation_limit, pools) == 0:
            continue  # no slot for a create; failed pools further down are still reported
        # A pending pod's event in this instance may be creating this group right now (its create
        # landed after the listing above): wait for it, and leave a pool it just created alone
        # instead of sending a second create that GKE answers 409.
        with provisioner.known_pools.single_flight(group_of(request.slice_id)):
            if existing is None and provisioner.known_pools.known(name, pod_created_at(pod)):
                done.add(name)
                continue
            outcome = provisioner.provision_pod(pod, pools=pools)
        requested += outcome.requested
        done.update(outcome.requested)
        done.add(name)
        if outcome.requested:
            pools = provisioner.gke.list_node_pools(cluster)  # the slots those creates took
    logs.decision(
        log,
        "provision.resumed",
        f"a node-pool operation finished: requested {len(requested)} waiting pool(s)",
        requested=len(requested),
    )
    return requested
