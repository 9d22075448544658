"""The pure pieces of RealStack: reading the audit log, telling a pod the pod GC killed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandbox.realstack.kubestate import audited_jobset_deletions, collection
from sandbox.realstack.pods import killed_by_gc


def audit(
    verb: str = "delete", stage: str = "ResponseComplete", code: int = 200, resource: str = "jobsets"
) -> str:
    return json.dumps(
        {
            "kind": "Event",
            "apiVersion": "audit.k8s.io/v1",
            "level": "Metadata",
            "stage": stage,
            "verb": verb,
            "user": {"username": "sandbox-admin"},
            "objectRef": {
                "resource": resource,
                "namespace": "team-a",
                "name": "train",
                "apiGroup": "jobset.x-k8s.io",
                "apiVersion": "v1alpha2",
            },
            "responseStatus": {"code": code},
        }
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            audit(),
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"namespace": "team-a", "name": "train"},
            },
        ),
        (audit(code=404), None),  # nothing was deleted
        (audit(code=403), None),  # refused
        (audit(stage="ResponseStarted"), None),  # the same request, recorded once at completion
        (audit(verb="deletecollection"), None),
        (audit(resource="jobs"), None),
        ("not json", None),
    ],
)
def test_only_a_completed_successful_jobset_delete_is_a_deletion(line: str, expected: Any) -> None:
    assert audited_jobset_deletions(line) == expected


def _pod(*conditions: dict[str, str]) -> dict[str, Any]:
    return {"status": {"phase": "Failed", "conditions": list(conditions)}}


@pytest.mark.parametrize(
    ("pod", "killed"),
    [
        (_pod({"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}), True),
        (_pod({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}), False),
        (_pod({"type": "DisruptionTarget", "status": "False", "reason": "DeletionByPodGC"}), False),
        (_pod({"type": "Ready", "status": "False", "reason": "PodCompleted"}), False),
        ({"status": {}}, False),
    ],
)
def test_a_pod_is_killed_by_a_pool_deletion_only_when_the_pod_gc_says_so(
    pod: dict[str, Any], killed: bool
) -> None:
    assert killed_by_gc(pod) is killed


def test_collection_paths_of_core_and_group_kinds() -> None:
    assert collection("v1", "pods", "default") == "/api/v1/namespaces/default/pods"
    assert collection("v1", "nodes", None) == "/api/v1/nodes"
    assert (
        collection("jobset.x-k8s.io/v1alpha2", "jobsets", "a")
        == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/a/jobsets"
    )
