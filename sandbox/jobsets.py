"""JobSet manifests the sandbox submits: built by the demos, the simulation, the benchmark and the tests."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from shared.core import labels

# How long the sandbox scheduler lets a pod of this template run before it succeeds.
RUN_SECONDS = "sandbox.tpuprov.dev/run-seconds"


def tpu_jobset(
    name: str,
    namespace: str = "default",
    *,
    replicas: int = 2,
    accelerator: str = "tpu-v6e-slice",
    topology: str = "4x4",
    chips_per_vm: int = 4,
    vms: int | None = None,
    replicated_job: str = "slice",
    uid: str | None = None,
    selectors: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    run_seconds: float = 0.0,
) -> dict[str, Any]:
    """A JobSet of ``replicas`` TPU slices; each Job runs ``vms`` pods (one per VM of the slice)."""
    if vms is None:
        dims = [int(d) for d in topology.split("x")]
        total = 1
        for d in dims:
            total *= d
        vms = max(1, total // chips_per_vm)
    node_selector = {labels.TPU_ACCELERATOR: accelerator, labels.TPU_TOPOLOGY: topology, **(selectors or {})}
    return {
        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid if uid is not None else str(uuid.uuid4()),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": replicated_job,
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": vms,
                            "completions": vms,
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"annotations": {RUN_SECONDS: str(run_seconds)}},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "nodeSelector": node_selector,
                                    "containers": [
                                        {
                                            "name": "trainer",
                                            "image": "python:3.11",
                                            "resources": {
                                                "requests": {labels.TPU_RESOURCE: str(chips_per_vm)},
                                                "limits": {labels.TPU_RESOURCE: str(chips_per_vm)},
                                            },
                                        }
                                    ],
                                },
                            },
                        }
                    },
                }
            ]
        },
    }


def cpu_jobset(name: str, namespace: str = "default", uid: str | None = None) -> dict[str, Any]:
    """A JobSet without TPUs (the product must ignore its pods)."""
    jobset = tpu_jobset(name, namespace, replicas=1, uid=uid, vms=1)
    pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["nodeSelector"] = {}
    pod_spec["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    return jobset
