"""What the function tests share: a JobSet submitted as its controllers would, and the pending-pod
LogEntry GKE exports for its pods."""

from __future__ import annotations

import copy

from sandbox.emulators.logging import entries as logentries
from shared.core import labels
from shared.tpu.jobsets import expand_pods
from tests.conftest import CLUSTER_ID


def submit(world, jobset, mutate=None):
    """Create the JobSet (the API assigns its uid) and its pending pods, as the controllers would."""
    jobset = copy.deepcopy(jobset)
    jobset["metadata"].pop("uid", None)
    stored = world.kube.put(jobset)
    pods = []
    for pod in expand_pods(stored):
        if mutate:
            mutate(pod)
        pods.append(world.kube.put(pod))
    return stored, pods


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
