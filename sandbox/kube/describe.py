"""What the scheduler and the controllers see right now, in a few lines: what a timed-out wait prints.

A pending pod's reason is on the pod (its ``PodScheduled`` condition), a Node's on the Node (Ready,
cordon, the taints the API server's ``TaintNodesByCondition`` admission and the node lifecycle
controller put on it), and a JobSet's on its conditions; a timeline of product decisions shows none
of them. ``cluster_now`` reads all three through the API, so a failure says which one held things up.
"""

from __future__ import annotations

from typing import Any

from sandbox.kube.api import ApiError, KubeClient
from shared.core import labels

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
_SETTLED = ("Running", "Succeeded")  # pods whose lines would only be noise
JOBSETS = f"/apis/{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}/jobsets"


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def node_line(node: dict[str, Any]) -> str:
    meta, spec = node["metadata"], node.get("spec") or {}
    taints = ",".join(f"{t.get('key')}:{t.get('effect')}" for t in spec.get("taints") or []) or "-"
    pool = (meta.get("labels") or {}).get(labels.NODEPOOL, "?")
    cordon = " cordoned" if spec.get("unschedulable") else ""
    ready = _condition(node, "Ready").get("status", "none")
    return f"  node {meta['name']} pool={pool} Ready={ready}{cordon} taints={taints}"


def pod_line(pod: dict[str, Any]) -> str:
    meta, status = pod["metadata"], pod.get("status") or {}
    scheduled = _condition(pod, "PodScheduled")
    # Whose pod it is: a Job of an old incarnation (same names, another uid) can still own one.
    owner: dict[str, Any] = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), {})
    jobset_uid = str((meta.get("labels") or {}).get(labels.JOBSET_UID, "-"))[:8]
    deleting = " deleting" if meta.get("deletionTimestamp") else ""
    return (
        f"  pod {meta.get('namespace')}/{meta['name']} {status.get('phase')}{deleting}"
        f" owner={owner.get('kind', '-')}/{owner.get('name', '-')} jobset-uid={jobset_uid}"
        f" node={(pod.get('spec') or {}).get('nodeName', '-')}"
        f" scheduled={scheduled.get('status', '?')} {scheduled.get('message', '')}"
    )


def jobset_line(jobset: dict[str, Any]) -> str:
    meta = jobset["metadata"]
    said = ",".join(
        f"{c.get('type')}={c.get('status')}" for c in (jobset.get("status") or {}).get("conditions") or []
    )
    return f"  jobset {meta.get('namespace')}/{meta['name']} uid={str(meta.get('uid'))[:8]} {said}"


def cluster_now(api: KubeClient) -> list[str]:
    """Every Node, every pod not Running or Succeeded, and every JobSet (none where the JobSet CRD is
    not installed), a line each; one line saying why when the API cannot be read."""
    try:
        found_nodes = api.list(NODES)
        found_pods = [p for p in api.list(PODS) if (p.get("status") or {}).get("phase") not in _SETTLED]
    except (ApiError, OSError) as exc:
        return [f"cluster now: unreadable ({exc})"]
    try:
        found_jobsets = api.list(JOBSETS)
    except (ApiError, OSError):
        found_jobsets = []
    return [
        "cluster now:",
        *map(node_line, found_nodes),
        *map(pod_line, found_pods),
        *map(jobset_line, found_jobsets),
    ]


def bound_pending(api: KubeClient) -> list[str]:
    """Pods bound to a Node but still Pending (``namespace/name``): the scheduler did its part, and
    running them is KWOK's (a kubelet's) part."""
    try:
        found = api.list(PODS)
    except (ApiError, OSError):
        return []
    return [
        f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
        for p in found
        if (p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") == "Pending"
    ]
