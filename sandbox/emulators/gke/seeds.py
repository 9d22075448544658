"""The clusters the GKE emulator knows from the start (clusters are never created through it)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from sandbox.emulators.gke.rules import region_of


@dataclasses.dataclass(frozen=True)
class ClusterSeed:
    """A cluster the emulator knows from the start (clusters are never created through it)."""

    project: str
    location: str
    name: str
    endpoint: str = "127.0.0.1"
    ca_certificate_b64: str = ""
    locations: tuple[str, ...] = ()
    # New GKE clusters are enrolled in REGULAR by default; "" seeds a cluster outside release channels.
    release_channel: str = "REGULAR"
    # controlPlaneEndpointsConfig. Every GKE cluster has a DNS endpoint; whether it takes user
    # traffic, and whether the IP endpoints (private always, public optionally) exist, is per cluster.
    dns_external_traffic: bool = True  # dnsEndpointConfig.allowExternalTraffic
    ip_access: bool = True  # ipEndpointsConfig.enabled
    public_ip_access: bool = True  # ipEndpointsConfig.enablePublicEndpoint
    private_endpoint: str = "10.128.0.2"  # ipEndpointsConfig.privateEndpoint
    # Workload Identity Federation for GKE (workloadIdentityConfig.workloadPool PROJECT.svc.id.goog).
    # On by default: the product asks every TPU pool for GKE's metadata server, which GKE grants only
    # on such clusters (rules.check_workload_metadata); False seeds a cluster without it.
    workload_identity: bool = True
    # resourceLabels the cluster starts with (GKE resource labels, not Kubernetes labels); they
    # change through setResourceLabels, so the state keeps the current ones.
    resource_labels: tuple[tuple[str, str], ...] = ()

    @property
    def workload_pool(self) -> str:
        """The cluster's workload identity pool, "" when Workload Identity is off."""
        return f"{self.project}.svc.id.goog" if self.workload_identity else ""

    @property
    def path(self) -> str:
        """The resource path ``projects/P/locations/L/clusters/C``."""
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"

    @property
    def dns_endpoint(self) -> str:
        """The cluster's DNS endpoint, shaped as GKE's: ``gke-<uid>.<region>.gke.goog``."""
        uid = hashlib.sha256(self.path.encode()).hexdigest()[:32]
        return f"gke-{uid}.{region_of(self.location)}.gke.goog"

    def fill_endpoints(self, cluster: Any) -> None:
        """Set ``endpoint`` and ``controlPlaneEndpointsConfig`` on a Cluster protobuf message."""
        config = cluster.control_plane_endpoints_config
        config.dns_endpoint_config.endpoint = self.dns_endpoint
        config.dns_endpoint_config.allow_external_traffic = self.dns_external_traffic
        ip = config.ip_endpoints_config
        ip.enabled = self.ip_access
        if self.ip_access:
            ip.enable_public_endpoint = self.public_ip_access
            ip.private_endpoint = self.private_endpoint
            if self.public_ip_access:
                ip.public_endpoint = self.endpoint
        # The legacy field names the public address when there is one, else the private one.
        cluster.endpoint = (
            self.endpoint if self.ip_access and self.public_ip_access else self.private_endpoint
        )

    @classmethod
    def from_path(
        cls,
        path: str,
        endpoint: str = "127.0.0.1",
        ca_certificate_b64: str = "",
        locations: tuple[str, ...] = (),
        release_channel: str = "REGULAR",
        workload_identity: bool = True,
        resource_labels: tuple[tuple[str, str], ...] = (),
    ) -> ClusterSeed:
        """Build a seed from ``projects/P/locations/L/clusters/C``; zones default to the location's zone."""
        parts = path.strip("/").split("/")
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" or parts[4] != "clusters":
            raise ValueError(f"not a cluster path: {path!r}")
        location = parts[3]
        if not locations:
            locations = (location,) if region_of(location) != location else (f"{location}-a",)
        return cls(
            parts[1],
            location,
            parts[5],
            endpoint,
            ca_certificate_b64,
            tuple(locations),
            release_channel,
            workload_identity=workload_identity,
            resource_labels=resource_labels,
        )
