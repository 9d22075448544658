"""Pods killed by a node-pool deletion, read from the real pods.

A deleted pool's Nodes go; the controller manager's pod GC then marks every pod still bound to one
and not yet finished ``Failed`` with the condition ``DisruptionTarget`` (reason
``DeletionByPodGC``) and deletes it, after a 40 s quarantine (``pkg/controller/podgc``). Such a
pod was killed by the deletion. Within the quarantine a pod still running or pending on a Node
that no longer exists is as good as killed, so ``killed()`` counts both.
"""

from __future__ import annotations

import threading
from typing import Any

from sandbox.kube.api import KubeClient
from sandbox.realstack.kubestate import follow

PODS = "/api/v1/pods"
GC_REASON = "DeletionByPodGC"


def killed_by_gc(pod: dict[str, Any]) -> bool:
    """Whether the pod GC failed this pod because its Node is gone."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" and c.get("reason") == GC_REASON
        for c in conditions
    )


def _key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}/{meta.get('uid')}"


class PodFates:
    """Follows every pod and remembers those the pod GC killed."""

    def __init__(self, api: KubeClient) -> None:
        self.api = api
        self.errors: list[str] = []
        self._killed: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="pod-fates", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _follow(self) -> None:
        follow(self.api, PODS, self._seen, self._stop, self.errors)

    def _seen(self, event_type: str, pod: dict[str, Any]) -> None:
        if killed_by_gc(pod):
            with self._lock:
                self._killed.add(_key(pod))

    def killed(self) -> list[str]:
        """Pods the GC killed, plus unfinished pods bound to a Node that is gone (awaiting the GC)."""
        present = {str(n["metadata"]["name"]) for n in self.api.list("/api/v1/nodes")}
        orphans = {
            _key(pod)
            for pod in self.api.list(PODS)
            if (pod.get("spec") or {}).get("nodeName")
            and pod["spec"]["nodeName"] not in present
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        }
        with self._lock:
            return sorted(self._killed | orphans)
