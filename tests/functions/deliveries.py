"""What the function tests share: a JobSet submitted as its controllers would, and the pending-pod
LogEntry GKE exports for its pods."""

from __future__ import annotations

from shared.core import labels
from shared.events import entries as logentries
from tests.conftest import CLUSTER_ID


def submit(world, jobset, mutate=None):
    """Create the JobSet (the API assigns its uid), its Jobs and their pending pods, as the
    controllers would."""
    return world.kube.submit_jobset(jobset, mutate)


def pending_event(pod, cluster=CLUSTER_ID, **kwargs):
    meta = pod["metadata"]
    return logentries.pod_event_entry(
        cluster,
        meta["namespace"],
        meta["name"],
        meta.get("uid", ""),
        controller=("JobSet", meta["labels"].get(labels.JOBSET_NAME, "")),
        **kwargs,
    )
