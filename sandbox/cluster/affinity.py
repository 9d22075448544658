"""Required inter-pod affinity and anti-affinity, as kube-scheduler's InterPodAffinity filter applies it.

JobSet's exclusive placement (one Job per node pool) is expressed with these terms, so the
simulated scheduler must honour them for multislice JobSets to land one slice per pool:

* anti-affinity: no pod matching the term may already run in the node's topology domain (and no
  running pod's own anti-affinity may match the incoming pod there);
* affinity: a pod matching the term must run in the domain, unless no pod anywhere matches yet
  and the incoming pod matches its own term (the first pod of a group may go anywhere).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def selector_matches(selector: Mapping[str, Any], pod_labels: Mapping[str, str]) -> bool:
    """A metav1 LabelSelector (matchLabels + matchExpressions) against a label map."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if pod_labels.get(key) != str(value):
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = [str(v) for v in expr.get("values") or []]
        present = key in pod_labels
        if op == "In" and not (present and pod_labels[key] in values):
            return False
        if op == "NotIn" and present and pod_labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _terms(pod: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get(REQUIRED) or [])


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


class PodPlacement:
    """Where the active (bound, not finished) pods are, for affinity checks within one pass."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self._node_labels = {str(n["metadata"]["name"]): _labels(n) for n in nodes}
        self._placed: list[tuple[dict[str, Any], dict[str, str]]] = []
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                self.add(pod, str(node))

    def add(self, pod: dict[str, Any], node: str) -> None:
        """Record a pod bound to ``node`` (also pods bound earlier in the same pass)."""
        self._placed.append((pod, self._node_labels.get(node, {})))

    def violation(self, pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> str:
        """Why ``pod`` may not go to a node with ``node_labels`` ("" when it may)."""
        own = _labels(pod)
        for term in _terms(pod, "podAntiAffinity"):
            key = term.get("topologyKey", "")
            if key in node_labels and self._any_in_domain(term, key, node_labels[key]):
                return "anti-affinity"
        for placed, placed_node in self._placed:
            for term in _terms(placed, "podAntiAffinity"):
                key = term.get("topologyKey", "")
                same_domain = key in node_labels and placed_node.get(key) == node_labels[key]
                if same_domain and selector_matches(term.get("labelSelector") or {}, own):
                    return "existing anti-affinity"
        for term in _terms(pod, "podAffinity"):
            key = term.get("topologyKey", "")
            selector = term.get("labelSelector") or {}
            if key in node_labels and self._any_in_domain(term, key, node_labels[key]):
                continue
            nobody_yet = not any(selector_matches(selector, _labels(p)) for p, _ in self._placed)
            if not (nobody_yet and selector_matches(selector, own)):
                return "affinity"
        return ""

    def _any_in_domain(self, term: Mapping[str, Any], key: str, value: str) -> bool:
        selector = term.get("labelSelector") or {}
        return any(
            node.get(key) == value and selector_matches(selector, _labels(placed))
            for placed, node in self._placed
        )
