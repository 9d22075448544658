"""Provision's side of a handover: a JobSet pod found running on a pool made for another JobSet.

Release keeps an idle pool for a queued JobSet of its shape (``release.offered``); once that JobSet
is admitted its pods bind to the pool at once, and the pool must become that JobSet's (node labels,
billing labels, a ``TPUSliceAdopted`` Event) so that its own completion releases it. Whichever
function sees the new owner's pods there first adopts it, always through ``Releaser.dispose``:
release and reconcile when they look at the pool, a JobSet's own release for the pools it ran on
last, and provision here, when a pending-pod event is delivered for a pod that is bound by then.
"""

from __future__ import annotations

import datetime
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels
from shared.core.errors import NotFoundError, TransientError
from shared.core.settings import Settings
from shared.provisioning.release.guard import MANAGED_NODES
from shared.provisioning.release.releaser import JobSets, Releaser, is_managed, owned_by
from shared.tpu.pods import Pod


class Handover:
    """Adopts, for a bound JobSet pod, the pool it runs on when that pool's owner no longer needs it."""

    def __init__(self, settings: Settings, gke: NodePoolAPI, kube: KubeAPI, releaser: Releaser) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.releaser = releaser

    def claim(self, pod: Pod) -> str:
        """Adopt the pool ``pod`` runs on if it is labelled for a JobSet that lets it go; returns a note
        for the outcome ("" when there was nothing to take). Raises TransientError (redelivery) when
        GKE could not relabel the pool now, e.g. while another operation runs on it.

        Costs nothing for a pod that is not a bound, live JobSet pod, and one Node listing when the pod
        runs on its own JobSet's pool (the Node carries the pool's owner labels).
        """
        node = pod.node_name
        name = pod.jobset_value(labels.JOBSET_NAME) or ""
        # Like release and reconcile, any live JobSet pod on the pool counts (an opted-out one too:
        # opting out is about creating pools for it, and deleting one under it is never right).
        if not node or not name or pod.deleting or pod.finished:
            return ""
        namespace = pod.namespace
        uid = pod.jobset_value(labels.JOBSET_UID) or ""
        found = [n for n in self.kube.list_nodes(MANAGED_NODES) if n.name == node]
        if not found:
            return ""  # not a node of a pool the product made
        node_labels = found[0].labels
        if _owner_of(node_labels) == (namespace, name) and node_labels.get(labels.OWNER_UID, uid) == uid:
            return ""  # its own JobSet's pool, the usual case
        # The listing, not a get: the functions' roles already read pools that way (infra/roles.json).
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        pool = next((p for p in listing if p.name == node_labels.get(labels.NODEPOOL)), None)
        if pool is None or not is_managed(pool) or owned_by(pool, namespace, name, uid):
            return ""  # adopted already (the Node's labels follow once GKE's update is done)
        jobsets: JobSets = {}
        owner_ns, owner_name = pool.owner.key
        try:
            owner = self.kube.get_jobset(owner_ns, owner_name)
        except NotFoundError:
            owner = None
        jobsets[(owner_ns, owner_name)] = owner
        verdict = self.releaser.judge(pool, owner, datetime.datetime.now(tz=datetime.UTC))
        if not verdict.delete:
            return ""  # the owner still needs it (e.g. suspended within its grace): it stays the owner's
        trigger = f"pod {namespace}/{pod.name} of JobSet {namespace}/{name} runs on it"
        outcome = self.releaser.dispose([(pool, verdict)], trigger, jobsets, listing, adopt_only=True)
        if outcome.retry:
            raise TransientError("; ".join(outcome.retry))
        taken = [p.name for p, taker in outcome.adopted if (taker.namespace, taker.name) == (namespace, name)]
        return f"; adopted node pool {', '.join(taken)}" if taken else ""


def _owner_of(pool_labels: Any) -> tuple[str, str]:
    return (str(pool_labels.get(labels.OWNER_NAMESPACE, "")), str(pool_labels.get(labels.OWNER_NAME, "")))
