"""Which control-plane endpoint production talks to (``shared.cloud.endpoint``, CONTROL_PLANE_ENDPOINT).

The choice is a pure decision over the cluster's ``controlPlaneEndpointsConfig`` (a table test);
the adapter tests read that config through the real client from the GKE emulator, and the last
test follows it into the Kubernetes client configuration that ``api_client_for`` builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from shared.cloud.endpoint import ApiEndpoint, choose_endpoint
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import api_client_for
from shared.core.errors import InvalidInputError, TransientError
from shared.core.settings import Settings
from shared.tpu.nodepools import ClusterInfo, ControlPlaneEndpoints

DNS = "gke-0123abcd.us-east5.gke.goog"
EVERYTHING = ControlPlaneEndpoints(
    dns=DNS,
    dns_external_traffic=True,
    ip_enabled=True,
    public_ip_enabled=True,
    public_ip="34.1.2.3",
    private_ip="10.0.0.2",
)
DNS_CLOSED = dataclasses.replace(EVERYTHING, dns_external_traffic=False)
PRIVATE_ONLY = dataclasses.replace(DNS_CLOSED, public_ip_enabled=False, public_ip="")
DNS_ONLY = dataclasses.replace(
    EVERYTHING, ip_enabled=False, public_ip_enabled=False, public_ip="", private_ip=""
)
NOTHING = dataclasses.replace(DNS_ONLY, dns_external_traffic=False)

VIA_DNS = ApiEndpoint(f"https://{DNS}", "dns", cluster_ca=False)
VIA_PUBLIC = ApiEndpoint("https://34.1.2.3", "public-ip", cluster_ca=True)
VIA_PRIVATE = ApiEndpoint("https://10.0.0.2", "private-ip", cluster_ca=True)
VIA_LEGACY = ApiEndpoint("https://35.9.9.9", "endpoint", cluster_ca=True)


def cluster(endpoints: ControlPlaneEndpoints | None, endpoint: str = "35.9.9.9") -> ClusterInfo:
    return ClusterInfo("tpu", "us-east5", endpoint, "Q0E=", endpoints=endpoints)


# (cluster's endpoints, CONTROL_PLANE_ENDPOINT) -> the endpoint, or words of the refusal.
CASES: list[tuple[str, ControlPlaneEndpoints | None, str, ApiEndpoint | str]] = [
    ("auto prefers DNS: no VPC path needed", EVERYTHING, "auto", VIA_DNS),
    ("auto: DNS closed to user traffic, public IP next", DNS_CLOSED, "auto", VIA_PUBLIC),
    ("auto: private cluster without DNS access", PRIVATE_ONLY, "auto", VIA_PRIVATE),
    ("auto: IP endpoints disabled", DNS_ONLY, "auto", VIA_DNS),
    ("auto: nothing usable", NOTHING, "auto", "offers no usable control-plane endpoint"),
    ("forced DNS", EVERYTHING, "dns", VIA_DNS),
    ("forced DNS, closed", DNS_CLOSED, "dns", "--enable-dns-access"),
    ("forced private IP over an open DNS endpoint", EVERYTHING, "private-ip", VIA_PRIVATE),
    ("forced private IP, IP endpoints disabled", DNS_ONLY, "private-ip", "no private IP endpoint"),
    ("forced public IP", DNS_CLOSED, "public-ip", VIA_PUBLIC),
    ("forced public IP on a private cluster", PRIVATE_ONLY, "public-ip", "enablePublicEndpoint"),
    ("no controlPlaneEndpointsConfig: legacy endpoint", None, "auto", VIA_LEGACY),
    ("no controlPlaneEndpointsConfig, forced", None, "dns", "no controlPlaneEndpointsConfig"),
]


@pytest.mark.parametrize(("endpoints", "mode", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_choose_endpoint(
    endpoints: ControlPlaneEndpoints | None, mode: str, expected: ApiEndpoint | str
) -> None:
    if isinstance(expected, ApiEndpoint):
        assert choose_endpoint(cluster(endpoints), mode) == expected
    else:
        with pytest.raises(TransientError) as refused:
            choose_endpoint(cluster(endpoints), mode)
        assert expected in refused.value.why
        assert "tpu" in refused.value.why  # the reason names the cluster


def test_the_refusal_of_auto_lists_why_each_endpoint_is_out() -> None:
    with pytest.raises(TransientError) as refused:
        choose_endpoint(cluster(NOTHING), "auto")
    why = refused.value.why
    assert "allowExternalTraffic is false" in why
    assert "no public IP endpoint" in why and "no private IP endpoint" in why


def test_no_endpoint_at_all_is_said() -> None:
    with pytest.raises(TransientError, match="and no endpoint"):
        choose_endpoint(cluster(None, endpoint=""), "auto")


def test_the_setting_is_checked_at_startup() -> None:
    assert Settings.from_env({}).control_plane_endpoint == "auto"
    assert Settings.from_env({"CONTROL_PLANE_ENDPOINT": " dns "}).control_plane_endpoint == "dns"
    with pytest.raises(InvalidInputError, match="CONTROL_PLANE_ENDPOINT='private' is not one of"):
        Settings.from_env({"CONTROL_PLANE_ENDPOINT": "private"})


# --- through the real client, from the GKE emulator ---------------------------------------------

PROJECT = "test-proj"
ZONE = "us-central2-b"
SEEDS = {
    "public": ClusterSeed(PROJECT, ZONE, "public", endpoint="34.1.2.3", dns_external_traffic=False),
    "private": ClusterSeed(
        PROJECT,
        ZONE,
        "private",
        dns_external_traffic=False,
        public_ip_access=False,
        private_endpoint="10.0.0.9",
    ),
    "dns-only": ClusterSeed(PROJECT, ZONE, "dns-only", ip_access=False),
    "default": ClusterSeed(PROJECT, ZONE, "default", endpoint="34.1.2.4", ca_certificate_b64="Q0E="),
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[GkeEmulator]:
    with GkeEmulator(list(SEEDS.values()), op_delay=0) as gke:
        yield gke


@pytest.fixture
def api(emulator: GkeEmulator) -> GkeNodePoolAPI:
    return GkeNodePoolAPI(endpoint=emulator.url, timeout=5.0)


def test_the_adapter_reads_the_clusters_endpoints(api: GkeNodePoolAPI) -> None:
    private = api.get_cluster(SEEDS["private"].path)
    assert private.endpoints == ControlPlaneEndpoints(
        dns=SEEDS["private"].dns_endpoint,
        dns_external_traffic=False,
        ip_enabled=True,
        public_ip_enabled=False,
        public_ip="",
        private_ip="10.0.0.9",
    )
    assert private.endpoint == "10.0.0.9"  # GKE's legacy field: the private address of a private cluster
    dns_only = api.get_cluster(SEEDS["dns-only"].path)
    assert dns_only.endpoints is not None
    assert (dns_only.endpoints.ip_enabled, dns_only.endpoints.public_ip, dns_only.endpoints.private_ip) == (
        False,
        "",
        "",
    )
    assert (
        dns_only.endpoints.dns.endswith(".us-central2.gke.goog") and dns_only.endpoints.dns_external_traffic
    )


@pytest.mark.parametrize(
    ("name", "mode", "kind"),
    [
        ("public", "auto", "public-ip"),
        ("private", "auto", "private-ip"),
        ("dns-only", "auto", "dns"),
        ("default", "auto", "dns"),
        ("default", "private-ip", "private-ip"),
        ("default", "public-ip", "public-ip"),
    ],
)
def test_endpoint_choice_over_emulated_clusters(api: GkeNodePoolAPI, name: str, mode: str, kind: str) -> None:
    assert choose_endpoint(api.get_cluster(SEEDS[name].path), mode).kind == kind


def test_forcing_an_endpoint_the_cluster_lacks_is_refused(api: GkeNodePoolAPI) -> None:
    with pytest.raises(TransientError, match="no public IP endpoint"):
        choose_endpoint(api.get_cluster(SEEDS["private"].path), "public-ip")
    with pytest.raises(TransientError, match="--enable-dns-access"):
        choose_endpoint(api.get_cluster(SEEDS["public"].path), "dns")


class _Token:
    """google.auth credentials as far as api_client_for uses them (no Google account here)."""

    valid = True
    token = "ya29.test-token"


@pytest.mark.parametrize(
    ("mode", "host", "cluster_ca"),
    [
        ("auto", f"https://{SEEDS['default'].dns_endpoint}", False),
        ("public-ip", "https://34.1.2.4", True),
        ("private-ip", "https://10.128.0.2", True),
    ],
)
def test_api_client_for_uses_the_chosen_endpoint(
    api: GkeNodePoolAPI, monkeypatch: pytest.MonkeyPatch, mode: str, host: str, cluster_ca: bool
) -> None:
    import google.auth

    def default(scopes: Any = None) -> tuple[_Token, str]:
        return _Token(), PROJECT

    monkeypatch.setattr(google.auth, "default", default)
    seed = SEEDS["default"]
    settings = Settings(
        unlimited_spending=True,
        project_id=PROJECT,
        location=ZONE,
        cluster_name=seed.name,
        control_plane_endpoint=mode,
    )

    cfg = api_client_for(settings, lambda: api).configuration

    assert cfg.host == host
    assert cfg.api_key == {"authorization": "ya29.test-token"}
    if cluster_ca:  # IP endpoints: the cluster's own CA from masterAuth
        assert Path(cfg.ssl_ca_cert).read_bytes() == b"CA"
    else:  # the DNS endpoint: Google's front end, checked against the public roots
        assert cfg.ssl_ca_cert is None


def test_unset_booleans_are_read_as_gke_means_them() -> None:
    """proto3 `optional` booleans: unset is not false. A cluster older than ipEndpointsConfig.enabled
    reports addresses without the flag, and those endpoints work."""
    from google.cloud import container_v1

    from shared.cloud.endpoint import endpoints_of

    config = container_v1.ControlPlaneEndpointsConfig
    legacy = container_v1.Cluster(
        control_plane_endpoints_config=config(
            ip_endpoints_config=config.IPEndpointsConfig(
                public_endpoint="34.1.2.3", private_endpoint="10.0.0.2"
            )
        )
    )
    assert endpoints_of(legacy) == ControlPlaneEndpoints(
        ip_enabled=True, public_ip_enabled=True, public_ip="34.1.2.3", private_ip="10.0.0.2"
    )
    closed = container_v1.Cluster(
        control_plane_endpoints_config=config(
            ip_endpoints_config=config.IPEndpointsConfig(enabled=False, private_endpoint="10.0.0.2")
        )
    )
    assert endpoints_of(closed) == ControlPlaneEndpoints(private_ip="10.0.0.2")
    assert endpoints_of(container_v1.Cluster(endpoint="34.1.2.3")) is None
