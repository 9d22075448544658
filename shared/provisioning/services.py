"""The services of one function instance, built once and handed to every orchestrator.

A controller's ``main`` builds its clients, caches and rate limiters once and hands them to each of
its reconcilers; this is that for the product. Provision, the Kueue admission check and the
reconcile sweep of one Cloud Run instance share:

* one account of GKE's operation slots and API request quota (``Slots``): two would each spend
  ``GKE_REQUESTS_PER_MINUTE`` and learn GKE's operation limit twice;
* one memory of pools seen to exist and one single flight per replicated job (``KnownPools``);
* one failure record writer (``Backoff``), one capacity fallback (``Fallback``, which tells
  MultiKueue's placement when a worker runs out of options: ``MultiKueuePlacement``) and one releaser
  (``Releaser``, with its ownership proofs, Kueue holds and budgets), so a recycle, a handover
  and a release all go the same guarded way;
* the one route from a group of slices to their creates (``SliceGroupEngine``);
* the managed cluster as GKE describes it, read once (``cluster()``).

``shared.app.handlers`` builds one per instance. The orchestrators take nothing else, so no caller
can give one of them a second, private account by accident; a test or tool builds a ``Services``
from settings and ports and hands it over, as the instance does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core.settings import Settings
from shared.provisioning.create.backoff import Backoff
from shared.provisioning.create.engine import SliceGroupEngine
from shared.provisioning.create.fallback import Fallback
from shared.provisioning.create.known import KnownPools
from shared.provisioning.create.policies import WorkloadPolicies
from shared.provisioning.create.reservations import ReservationLook
from shared.provisioning.create.slots import Slots
from shared.provisioning.placement.multikueue import FleetPeers, MultiKueuePlacement
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.tenancy.ownership import Owners
from shared.provisioning.tenancy.spending import Spending
from shared.tpu.nodepools import ClusterInfo


class Services:
    """Everything one instance's orchestrators share (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        *,
        known_pool_ttl: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        policies: WorkloadPolicies | None = None,
        reservations: ReservationLook | None = None,
        sleep: Callable[[float], None] = time.sleep,
        peers: FleetPeers | None = None,
    ) -> None:
        """``known_pool_ttl`` > 0 lets provision answer from memory for pools it saw that recently;
        ``clock`` times deadlines and pacing, ``wall_clock`` (Unix seconds) the stockout backoff;
        ``policies`` creates the product's tpu7x workload policies (None: pools name them and GKE
        must find them already there); ``reservations`` reads a reservation before a create on it
        and places the slice where it has room (None: GKE's answer to the create tells); ``peers``
        reaches the fleet's other clusters (MultiKueue's manager, for its workers' copies)."""
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.clock = clock
        self.wall_clock = wall_clock
        self.policies = policies
        self.reservations = reservations
        self.known_pools = KnownPools(known_pool_ttl, clock)
        self.slots = Slots(settings, gke, kube, clock=clock)
        self.releaser = Releaser(settings, gke, kube, sleep=sleep, forget=self.known_pools.forget)
        self.owners: Owners = self.releaser.owners
        self.spending: Spending = self.releaser.spending
        self.backoff = Backoff(settings, kube, wall_clock)
        self.multikueue = MultiKueuePlacement(settings, kube, peers, wall_clock, gke)
        self.fallback = Fallback(
            settings, gke, kube, self.backoff, self.cluster, self.releaser, self.multikueue
        )
        # The one route from a group of slices to its creates, on the collaborators above.
        self.engine = SliceGroupEngine(
            settings,
            gke,
            kube,
            self.slots,
            self.fallback,
            self.spending,
            policies,
            self.cluster,
            reservations,
        )
        self._cluster: ClusterInfo | None = None
        self._cluster_lock = threading.Lock()

    def cluster(self) -> ClusterInfo:
        """The managed cluster (zones, release channel), read from GKE once per instance. A failed
        read raises (TransientError: redelivery); nothing is cached until one succeeds."""
        with self._cluster_lock:
            if self._cluster is None:
                self._cluster = self.gke.get_cluster(self.settings.cluster_path)
            return self._cluster
