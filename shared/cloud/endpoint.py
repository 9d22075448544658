"""Which of a GKE cluster's control-plane endpoints production talks to (CONTROL_PLANE_ENDPOINT).

A GKE cluster can answer on up to three addresses, all listed in its ``controlPlaneEndpointsConfig``:

* the DNS-based endpoint (``gke-<uid>.<region>.gke.goog``): Google's front end checks the caller's
  IAM permission ``container.clusters.connect`` before the API server sees the request, and it is
  reachable from anywhere Google APIs are, so Cloud Run needs no VPC path. It answers user traffic
  only while ``dnsEndpointConfig.allowExternalTraffic`` is true.
* the private IP endpoint: reachable only from inside the cluster's VPC network (Cloud Run Direct
  VPC egress, infra variable ``vpc_egress``).
* the public IP endpoint: reachable from the internet, subject to the cluster's authorized networks
  (Cloud Run has no fixed egress address to authorize without a NAT).

``auto`` prefers them in that order of how little the deployment has to set up: DNS, public IP,
private IP. A forced choice the cluster cannot serve is a deployment error: the message is kept for
redelivery (``TransientError``) and the reason names the setting or the cluster change that fixes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shared.core.errors import TransientError
from shared.tpu.nodepools import ClusterInfo, ControlPlaneEndpoints


@dataclasses.dataclass(frozen=True)
class ApiEndpoint:
    """Where to send Kubernetes API requests and how to check the server's certificate."""

    host: str  # https://<address>
    kind: str  # "dns", "private-ip", "public-ip", or "endpoint" (the cluster's legacy field)
    # IP endpoints present a certificate signed by the cluster's own CA (masterAuth); the DNS
    # endpoint is Google's front end, whose certificate chains to the public roots.
    cluster_ca: bool


def endpoints_of(cluster: Any) -> ControlPlaneEndpoints | None:
    """Read ``controlPlaneEndpointsConfig`` off a ``container_v1.Cluster``; None when GKE sent none."""
    if "control_plane_endpoints_config" not in cluster:
        return None
    config = cluster.control_plane_endpoints_config
    dns = config.dns_endpoint_config
    ip = config.ip_endpoints_config
    # The booleans are proto3 `optional`: unset is not the same as false. An unset `enabled` with
    # an address present is a cluster created before the field existed, whose IP endpoints work.
    ip_enabled = ip.enabled if "enabled" in ip else bool(ip.public_endpoint or ip.private_endpoint)
    public = ip.enable_public_endpoint if "enable_public_endpoint" in ip else bool(ip.public_endpoint)
    return ControlPlaneEndpoints(
        dns=dns.endpoint,
        dns_external_traffic=bool(dns.allow_external_traffic),
        ip_enabled=bool(ip_enabled),
        public_ip_enabled=bool(public),
        public_ip=ip.public_endpoint,
        private_ip=ip.private_endpoint,
    )


def _dns(cluster: ClusterInfo, e: ControlPlaneEndpoints) -> ApiEndpoint | str:
    if not e.dns:
        return (
            f"cluster {cluster.name} reports no DNS endpoint (controlPlaneEndpointsConfig.dnsEndpointConfig)"
        )
    if not e.dns_external_traffic:
        return (
            f"the DNS endpoint of cluster {cluster.name} refuses user traffic (allowExternalTraffic is "
            f"false; enable it with `gcloud container clusters update {cluster.name} --enable-dns-access`)"
        )
    return ApiEndpoint(f"https://{e.dns}", "dns", cluster_ca=False)


def _public_ip(cluster: ClusterInfo, e: ControlPlaneEndpoints) -> ApiEndpoint | str:
    if not (e.ip_enabled and e.public_ip_enabled and e.public_ip):
        return f"cluster {cluster.name} has no public IP endpoint (ipEndpointsConfig.enablePublicEndpoint)"
    return ApiEndpoint(f"https://{e.public_ip}", "public-ip", cluster_ca=True)


def _private_ip(cluster: ClusterInfo, e: ControlPlaneEndpoints) -> ApiEndpoint | str:
    if not (e.ip_enabled and e.private_ip):
        return f"cluster {cluster.name} has no private IP endpoint (ipEndpointsConfig.enabled is false)"
    return ApiEndpoint(f"https://{e.private_ip}", "private-ip", cluster_ca=True)


_CHOICES = {"dns": _dns, "public-ip": _public_ip, "private-ip": _private_ip}
_AUTO_ORDER = ("dns", "public-ip", "private-ip")


def choose_endpoint(cluster: ClusterInfo, mode: str) -> ApiEndpoint:
    """The endpoint ``mode`` (a CONTROL_PLANE_ENDPOINT value) selects on ``cluster``.

    Raises TransientError naming why the cluster cannot serve it (a deployment to fix, not input to drop).
    """
    e = cluster.endpoints
    if e is None:
        # No controlPlaneEndpointsConfig: only the legacy `endpoint` field is known.
        if cluster.endpoint and mode == "auto":
            return ApiEndpoint(f"https://{cluster.endpoint}", "endpoint", cluster_ca=True)
        raise TransientError(
            f"cannot reach cluster {cluster.name} with CONTROL_PLANE_ENDPOINT={mode}: GKE reported no "
            "controlPlaneEndpointsConfig" + ("" if cluster.endpoint else " and no endpoint")
        )
    if mode != "auto":
        chosen = _CHOICES[mode](cluster, e)
        if isinstance(chosen, ApiEndpoint):
            return chosen
        raise TransientError(f"cannot reach the cluster with CONTROL_PLANE_ENDPOINT={mode}: {chosen}")
    reasons = []
    for kind in _AUTO_ORDER:
        chosen = _CHOICES[kind](cluster, e)
        if isinstance(chosen, ApiEndpoint):
            return chosen
        reasons.append(chosen)
    raise TransientError(
        f"cluster {cluster.name} offers no usable control-plane endpoint: " + "; ".join(reasons)
    )
