"""Which clusters of FLEET_PROJECTS are in the fleet: those GKE lists with the FLEET_LABEL label.

A platform team adds a cluster to the fleet by labelling it (``gcloud container clusters update
C --update-labels tpuprov=enabled``), not by redeploying. The instance asks GKE for each listed
project's clusters (``projects/P/locations/-``: every zone and region, one call) and keeps the
answer ``FLEET_DISCOVERY_SECONDS``; deliveries in between are decided from memory, so an event of
an unlabelled cluster costs no call, and a labelled cluster is served within one TTL.

Resource labels are set by whoever may update the cluster (``container.clusters.update``, a
project admin's grant), never by a tenant of the cluster: a tenant can write pod labels, not this.

When GKE cannot answer for a project, the last listing goes on answering (a blip must not drop
a served cluster); with no listing yet, the delivery is redelivered. Zones GKE says it could not
reach (``missingZones``) keep the members they had.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from shared.cloud.ports import NodePoolAPI
from shared.core import logs
from shared.core.errors import PermanentError, TransientError
from shared.core.settings import Settings
from shared.tpu.nodepools import ClusterListing

log = logs.get("fleet")


@dataclasses.dataclass(frozen=True)
class _Known:
    members: frozenset[str]  # labelled cluster paths
    fetched: float  # monotonic time of the listing


class FleetDirectory:
    """The labelled clusters of every FLEET_PROJECTS project, each project's listing cached."""

    def __init__(
        self, settings: Settings, gke: Callable[[], NodePoolAPI], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._projects = settings.fleet_projects
        self._label = settings.fleet_label_pair
        self._ttl = float(settings.fleet_discovery_seconds)
        self._gke = gke
        self._clock = clock
        self._known: dict[str, _Known] = {}
        self._locks = {project: threading.Lock() for project in self._projects}

    def labelled(self, path: str, fresh: bool = False) -> bool:
        """Whether the cluster ``path`` (of a FLEET_PROJECTS project) carries the fleet label now,
        as far as the project's listing (at most one TTL old; ``fresh``: taken now, for a cluster
        just created or relabelled) says. Raises TransientError when GKE cannot list a project
        that has no listing yet."""
        project = path.split("/")[1]
        if project not in self._locks:
            return False
        return path in self._members(project, fresh)

    def members(self) -> list[str]:
        """Every labelled cluster of every listed project, sorted; a project GKE cannot list now
        and has no listing of is left out (logged), so one project's outage stops no sweep."""
        found: set[str] = set()
        for project in self._projects:
            try:
                found |= self._members(project, False)
            except (TransientError, PermanentError) as exc:
                logs.decision(
                    log,
                    "fleet.unlisted",
                    f"the clusters of project {project} are not swept this time: {exc.why}",
                    logging.ERROR,
                    project=project,
                )
        return sorted(found)

    def _members(self, project: str, fresh: bool) -> frozenset[str]:
        with self._locks[project]:  # one listing per project at a time; the others wait for it
            known = self._known.get(project)
            if known is not None and not fresh and self._clock() - known.fetched < self._ttl:
                return known.members
            try:
                listing = self._gke().list_clusters(project)
            except (TransientError, PermanentError) as exc:
                if known is None:
                    raise TransientError(
                        f"cannot list the clusters of fleet project {project}: {exc.why}"
                    ) from None
                logs.decision(
                    log,
                    "fleet.stale",
                    f"listing the clusters of project {project} failed ({exc.why}); the listing of "
                    f"{self._clock() - known.fetched:.0f}s ago goes on answering",
                    logging.WARNING,
                    project=project,
                )
                return known.members
            members = self._labelled_in(listing, known)
            before = known.members if known is not None else frozenset()
            if known is None or members != before:
                joined, left = sorted(members - before), sorted(before - members)
                logs.decision(
                    log,
                    "fleet.discovered",
                    f"project {project}: {len(members)} cluster(s) labelled {'='.join(self._label)}"
                    + (f"; joined {', '.join(joined)}" if joined else "")
                    + (f"; left {', '.join(left)}" if left else ""),
                    project=project,
                )
            self._known[project] = _Known(members, self._clock())
            return members

    def _labelled_in(self, listing: ClusterListing, known: _Known | None) -> frozenset[str]:
        key, value = self._label
        members = {c.path for c in listing.clusters if dict(c.resource_labels).get(key) == value}
        if listing.missing_zones and known is not None:
            # GKE could not answer for these zones: their clusters may be missing from the list
            # without having left; keep the members there until a full answer says otherwise.
            missing = listing.missing_zones
            members |= {path for path in known.members if _in_any(path.split("/")[3], missing)}
        return frozenset(members)


def _in_any(location: str, zones: tuple[str, ...]) -> bool:
    """Whether a cluster's zone, or a regional cluster's region, is one of (or holds one of) ``zones``."""
    return any(zone == location or zone.startswith(f"{location}-") for zone in zones)
