"""Runtime settings, parsed once from the environment into a frozen dataclass.

Only entrypoints (``functions/*/main.py``, the CLI, the sandbox) call ``Settings.from_env``; every
service below receives the ``Settings`` object, so nothing else reads ``os.environ``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from shared.core.errors import InvalidInputError
from shared.core.names import is_dns1123_label, label_key_problem, label_value_problem

DEFAULT_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
# The node boot disk types GKE offers (GKE "Configuring a custom boot disk"). Which of them a TPU
# machine family supports is the catalog's business (shared.tpu.catalog.boot_disk_types).
BOOT_DISK_TYPES = ("pd-balanced", "pd-standard", "pd-ssd", "hyperdisk-balanced")
# How production reaches the cluster's API server (shared.cloud.endpoint): "auto" picks from the
# cluster's own controlPlaneEndpointsConfig; the others force one of its endpoints.
CONTROL_PLANE_ENDPOINTS = ("auto", "dns", "private-ip", "public-ip")
# What setup_cluster does with a newer JobSet or Kueue it finds (shared.setup.support, which cannot
# be imported here: shared.setup depends on this module).
ADDON_UPGRADE_MODES = ("keep-newer", "pinned")


def _bool(raw: str, name: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise InvalidInputError(f"setting {name}={raw!r} is not a boolean (use true/false)")


def _int(raw: str, name: str, minimum: int = 0) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidInputError(f"setting {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise InvalidInputError(f"setting {name}={value} must be >= {minimum}")
    return value


# Upper bounds of settings whose large values would break a function's time budget or leak money.
_MAXIMUM = {
    "cordon_settle_seconds": 30,  # the release call sleeps this long inside one delivery
    "idle_pool_seconds": 3600,  # an idle TPU slice costs money every second it is kept
    # A slice waits at most this long for a retry once capacity is back; longer is lost training time.
    "stockout_backoff_max_seconds": 6 * 3600,
    "reconcile_cluster_seconds": 280,  # the tick answers inside reconcile's 300 s request timeout
}


_DISK_IMAGE = re.compile(r"^projects/[^/]+/global/images/[^/]+$")
_KMS_KEY = re.compile(r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$")


# Label domains no tenant's selector may turn into a node label of a pool: the product's own
# (ownership), GKE's (cloud.google.com, and gke.io with every subdomain such as node.gke.io or
# sandbox.gke.io, which GKE's own node features read: gVisor sandboxing selects
# sandbox.gke.io/runtime) and Kubernetes core's (kubernetes.io, k8s.io and their subdomains).
RESERVED_LABEL_DOMAINS = ("tpuprov.dev", "cloud.google.com", "gke.io", "kubernetes.io", "k8s.io")


def reserved_label_domain(domain: str) -> bool:
    """Whether keys under ``domain`` are reserved (the domain itself or any subdomain of one)."""
    return any(domain == d or domain.endswith(f".{d}") for d in RESERVED_LABEL_DOMAINS)


def _list(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


# A cluster path as GKE's API names it (the product's own form; zonal clusters use a zone as L).
_CLUSTER_PATH = re.compile(r"^projects/[^/\s]+/locations/[^/\s]+/clusters/[^/\s]+$")
_PROJECT_KEY = re.compile(r"^projects/[^/\s]+$")  # a FLEET_OVERRIDES key for a whole project
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Project ids (Resource Manager: 6-30 characters, lower-case letters, digits and hyphens, starting
# with a letter, not ending with a hyphen).
_PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
# Compute Engine reservation names are RFC 1035 labels; a shared one is named with its owner project
# (the same forms shared.tpu.capacity accepts in CAPACITY_POLICY).
_RESERVATION = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_SHARED_RESERVATION = re.compile(
    r"^projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
)
TENANT_KEYS = ("chips", "reservations")
# TENANTS is operator input that ends up in error text: keep what is quoted back short.
_QUOTE_MAX = 80


def _quote(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= _QUOTE_MAX else text[: _QUOTE_MAX - 3] + "..."


@dataclasses.dataclass(frozen=True)
class TenantEntry:
    """One TENANTS entry: whose spending it states and the limits stated for it.

    ``key`` is a namespace, ``*`` (every namespace no other entry names) or ``label:KEY=VALUE`` (the
    namespaces carrying that label). ``chips`` None and ``reservations`` None mean the entry leaves
    that limit unstated (omitted, or null as Terraform's jsonencode writes an unset optional field).
    """

    key: str
    chips: int | None = None
    reservations: tuple[str, ...] | None = None

    @property
    def label(self) -> tuple[str, str] | None:
        """(key, value) of a ``label:KEY=VALUE`` entry, None for a namespace or ``*``."""
        if not self.key.startswith("label:"):
            return None
        key, _, value = self.key[len("label:") :].partition("=")
        return key, value


def _tenant_key_problem(key: str) -> str:
    if key == "*" or is_dns1123_label(key):
        return ""
    if key.startswith("label:"):
        selector = key[len("label:") :]
        label, sep, value = selector.partition("=")
        if not sep:
            return "a label entry is label:KEY=VALUE"
        return label_key_problem(label) or label_value_problem(value)
    return "the key is a namespace (DNS-1123 label), * or label:KEY=VALUE"


def parse_tenants(raw: str) -> tuple[TenantEntry, ...]:
    """TENANTS (a JSON object) as entries in key order; InvalidInputError names the bad entry."""
    if not raw.strip():
        return ()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidInputError("setting TENANTS is not JSON (a JSON object of tenant entries)") from None
    if not isinstance(doc, dict):
        raise InvalidInputError(f"setting TENANTS must be a JSON object, not a JSON {type(doc).__name__}")
    entries = []
    for key in sorted(doc):
        where = f"setting TENANTS[{_quote(key)}]"
        problem = _tenant_key_problem(key)
        if problem:
            raise InvalidInputError(f"{where}: {problem}")
        value = doc[key]
        if not isinstance(value, dict):
            raise InvalidInputError(f"{where} must be an object with chips and/or reservations")
        unknown = sorted(set(value) - set(TENANT_KEYS))
        if unknown:
            raise InvalidInputError(
                f"{where}: unknown field {_quote(unknown[0])} (allowed: {', '.join(TENANT_KEYS)})"
            )
        chips = value.get("chips")
        if chips is not None and (not isinstance(chips, int) or isinstance(chips, bool) or chips < 0):
            raise InvalidInputError(f"{where}.chips: {_quote(chips)} is not a whole number >= 0")
        reservations = value.get("reservations")
        if reservations is not None:
            if not isinstance(reservations, list):
                raise InvalidInputError(f"{where}.reservations must be a list of reservation names")
            for item in reservations:
                if not isinstance(item, str) or not (
                    _RESERVATION.match(item) or _SHARED_RESERVATION.match(item)
                ):
                    raise InvalidInputError(
                        f"{where}.reservations: {_quote(item)} is not a reservation name "
                        "(or projects/PROJECT/reservations/NAME)"
                    )
        entries.append(TenantEntry(key, chips, tuple(reservations) if reservations is not None else None))
    return tuple(entries)


def fleet_context(project: str, location: str, cluster: str) -> str:
    """The kubeconfig context ``gcloud container clusters get-credentials`` writes for a cluster
    (googlecloudsdk/api_lib/container/util.py: ``KUBECONTEXT_FORMAT = 'gke_{project}_{zone}_{cluster}'``),
    so a kubeconfig with every fleet cluster's credentials needs no other naming."""
    return f"gke_{project}_{location}_{cluster}"


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    """One setting's value from its env variable's text (bad values raise InvalidInputError)."""
    name = field.name.upper()
    default = field.default
    if isinstance(default, bool):
        return _bool(raw, name)
    if isinstance(default, int):
        value = _int(raw, name)
        limit = _MAXIMUM.get(field.name)
        if limit is not None and value > limit:
            raise InvalidInputError(f"setting {name}={value} must be <= {limit}")
        return value
    if isinstance(default, tuple):
        return _list(raw) or (default if field.name == "oauth_scopes" else ())
    return raw.strip()


# What FLEET_OVERRIDES may set per cluster: where and how its pools are made, and what it may spend.
# Not the delivery, endpoint or timing settings, which are the deployment's.
FLEET_OVERRIDABLE = frozenset(
    {
        "NODE_LOCATIONS",
        "NODE_SERVICE_ACCOUNT",
        "OAUTH_SCOPES",
        "CAPACITY_POLICY",
        "DISK_SIZE_GB",
        "DISK_TYPE",
        "BOOT_DISK_KMS_KEY",
        "SECONDARY_BOOT_DISKS",
        "ADDITIONAL_NODE_NETWORKS",
        "MAX_PODS_PER_NODE",
        "NAMESPACE_ALLOWLIST",
        "ALLOWED_ACCELERATORS",
        "MAX_CHIPS_PER_SLICE",
        "MAX_VMS_PER_JOBSET",
        "CHIP_BUDGET",
        "TENANTS",
        "KUEUE_ONLY",
        "DRAIN",
        "IDLE_POOL_SECONDS",
        "RELEASE_GRACE_SECONDS",
        "SUSPEND_GRACE_SECONDS",
        "TPU7X_WORKLOAD_POLICY",
    }
)


def parse_fleet_overrides(
    text: str, fleet: tuple[str, ...], projects: tuple[str, ...] = ()
) -> dict[str, dict[str, str]]:
    """FLEET_OVERRIDES as {cluster path or ``projects/P``: {setting: raw value}}; an error names the
    cluster (or project) and the key. ``fleet``: the clusters that may be named (not the managed one,
    whose settings are the defaults); ``projects``: FLEET_PROJECTS, any of whose clusters may be named
    (it joins once labelled). ``projects/P`` sets what every fleet cluster of P takes unless its own
    entry says otherwise (one node service account per project, say, for clusters labelled in later);
    P is a FLEET_PROJECTS project or one a FLEET_CLUSTERS cluster is in."""
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise InvalidInputError(f"setting FLEET_OVERRIDES is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidInputError("setting FLEET_OVERRIDES must be an object {cluster path: {SETTING: value}}")
    parsed: dict[str, dict[str, str]] = {}
    fleet_projects = {*projects, *(path.split("/")[1] for path in fleet if _CLUSTER_PATH.match(path))}
    for cluster, values in document.items():
        discoverable = bool(_CLUSTER_PATH.match(cluster)) and cluster.split("/")[1] in projects
        project_wide = bool(_PROJECT_KEY.match(cluster)) and cluster.split("/")[1] in fleet_projects
        if cluster not in fleet and not discoverable and not project_wide:
            also = f" nor a cluster of FLEET_PROJECTS ({', '.join(projects)})" if projects else ""
            raise InvalidInputError(
                f"setting FLEET_OVERRIDES names cluster {_quote(cluster)}, not one of FLEET_CLUSTERS "
                f"({', '.join(fleet) or 'none'}; the managed cluster's settings are the defaults "
                f"themselves){also}, nor projects/P of a fleet project "
                f"({', '.join(sorted(fleet_projects)) or 'none'})"
            )
        if not isinstance(values, dict):
            raise InvalidInputError(
                f"setting FLEET_OVERRIDES[{_quote(cluster)}] must be an object of settings"
            )
        mine: dict[str, str] = {}
        for key, value in values.items():
            if key not in FLEET_OVERRIDABLE:
                raise InvalidInputError(
                    f"setting FLEET_OVERRIDES[{_quote(cluster)}] key {_quote(key)} is not a setting one "
                    f"cluster may override (one of {', '.join(sorted(FLEET_OVERRIDABLE))})"
                )
            if isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, list):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, int | float | dict):
                value = json.dumps(value) if isinstance(value, dict) else str(value)
            if not isinstance(value, str):
                raise InvalidInputError(
                    f"setting FLEET_OVERRIDES[{_quote(cluster)}] key {key} has no usable value"
                )
            mine[key] = value
        parsed[cluster] = mine
    return parsed


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the functions can be configured with; see docs/settings.md for the env names."""

    # Which cluster this deployment manages. Events from other clusters are acknowledged and dropped.
    project_id: str = ""
    location: str = ""
    cluster_name: str = ""
    # More clusters it manages (cluster paths, comma-separated): the fleet is the managed cluster and
    # these. Each delivery works on the cluster its event names; an event of any other is dropped.
    fleet_clusters: tuple[str, ...] = ()
    # The kubeconfig context to use ("" = its current context). A fleet cluster other than the
    # managed one is reached through the context gcloud names it (``fleet_context``).
    kube_context: str = ""
    # Per-cluster settings: a JSON object {cluster path: {SETTING: value}}; the other settings are
    # every cluster's defaults. Only FLEET_OVERRIDABLE settings, each parsed as its env variable is.
    fleet_overrides: str = ""
    # Projects whose labelled clusters are in the fleet too (project ids, comma-separated): every
    # cluster of these projects whose GKE resource labels carry FLEET_LABEL, as GKE lists them,
    # so a cluster joins (or leaves) by its label, without a redeploy.
    fleet_projects: tuple[str, ...] = ()
    # The GKE resource label (KEY=VALUE) that puts a cluster of FLEET_PROJECTS in the fleet.
    fleet_label: str = "tpuprov=enabled"
    # How long one project's cluster listing answers before GKE is asked again: a newly labelled
    # cluster is served within this many seconds, and the listing costs one call per project each.
    fleet_discovery_seconds: int = 300

    # Where the APIs live. Empty means production (gRPC to GKE, endpoint from get_cluster).
    gke_api_endpoint: str = ""  # e.g. http://127.0.0.1:8089 (REST, anonymous credentials)
    kube_api_endpoint: str = ""  # e.g. http://127.0.0.1:8090 (no auth)
    # Compute Engine (workload policies for tpu7x); empty means production compute.googleapis.com.
    compute_api_endpoint: str = ""  # e.g. http://127.0.0.1:8091 (REST, anonymous credentials)
    kubeconfig: str = ""  # explicit kubeconfig path, used when no endpoint is given
    # Bearer token sent to the *_API_ENDPOINT emulators, which authorize it like Google's front ends
    # (the sandbox gives each function its own). Production ignores it: ADC names the caller there.
    emulator_access_token: str = ""
    control_plane_endpoint: str = "auto"  # one of CONTROL_PLANE_ENDPOINTS (docs/deploy.md)

    # Event handling.
    max_event_age_seconds: int = 900
    # An object (pod, Workload, JobSet, node pool operation) decided this recently is answered from
    # that decision, with no API call: duplicates and forged log entries cost nothing (0 = off).
    event_coalesce_seconds: int = 5

    # Node pool shape defaults.
    node_locations: tuple[str, ...] = ()  # zone(s) for TPU pools; default: the cluster's zone
    node_service_account: str = ""
    oauth_scopes: tuple[str, ...] = DEFAULT_SCOPES
    # A TPU VM runs one workload pod plus the node's system pods, so GKE's default of 110 (a /24 of
    # the Pod range per node) wastes pod IP space; 16 gets a /27 (GKE "Configure maximum Pods per
    # node"). 0 = GKE's default (needed on routes-based clusters, which refuse the setting).
    max_pods_per_node: int = 16
    disk_size_gb: int = 100
    disk_type: str = ""  # "" = the machine family's default boot disk (catalog.boot_disk_types)
    # Customer-managed key of the nodes' boot disks (projects/P/locations/L/keyRings/R/cryptoKeys/K);
    # "" = Google-managed encryption. The Compute Engine service agent needs encrypt/decrypt on it.
    boot_disk_kms_key: str = ""
    # Confidential mode for the boot disks (Hyperdisk Balanced only, and only with BOOT_DISK_KMS_KEY);
    # a slice whose machine family boots from another disk type is refused.
    confidential_storage: bool = False
    # Secondary boot disks that preload container images or data on every TPU node (GKE "Use
    # secondary boot disks to preload data or container images"): "projects/P/global/images/I"
    # entries, each optionally "=CONTAINER_IMAGE_CACHE" (default: a data disk). Comma-separated.
    secondary_boot_disks: tuple[str, ...] = ()
    # Additional node networks (multi-NIC for high-throughput DCN between slices): "NETWORK:SUBNETWORK"
    # entries, comma-separated; the cluster must have multi-networking enabled.
    additional_node_networks: tuple[str, ...] = ()
    # Shielded VM options of the nodes, sent on every create; the defaults are GKE's own (secure
    # boot off: it refuses unsigned third-party kernel modules; integrity monitoring on).
    shielded_secure_boot: bool = False
    shielded_integrity_monitoring: bool = True
    # Surge upgrade settings of a pool; -1 = unset (GKE's default: one node surged, none unavailable).
    upgrade_max_surge: int = -1
    upgrade_max_unavailable: int = -1
    network_tags: tuple[str, ...] = ()
    # Pod labels copied to the node labels of its pool (cost and monitoring): exact keys, or
    # prefixes ending in "/" (e.g. "team,example.com/"). Keys GKE refuses as node labels are refused
    # at startup; a pod's selectors win over a copied label of the same key.
    copy_pod_labels: tuple[str, ...] = ()
    # Named workload policy for multi-host tpu7x slices ("{topology}" -> e.g. 2-2-2). Empty: the
    # product creates one per topology itself (shared.provisioning.create.policies); set, it creates none.
    tpu7x_workload_policy: str = ""

    # Guardrails.
    namespace_allowlist: tuple[str, ...] = ()  # empty = every namespace
    allowed_accelerators: tuple[str, ...] = ()  # empty = every accelerator in the catalog
    max_chips_per_slice: int = 4096
    # TPU VMs one JobSet may declare (replicas x VMs per slice over its replicated jobs); more is
    # refused before anything is bought. Default: GKE's largest cluster (65,000 nodes), which no
    # JobSet can outgrow and still run.
    max_vms_per_jobset: int = 65000
    # Pod selector keys that may become node labels of a pool (exact keys, or prefixes ending in
    # "/"): a tenant's selector is otherwise refused, so nobody can stamp labels other workloads
    # select or bill by onto a pool. Keys under GKE's and Kubernetes' domains are never allowed.
    node_label_keys: tuple[str, ...] = ()
    chip_budget: int = 0  # total chips over all managed pools; 0 = unlimited
    # Who may spend what (a JSON object; see parse_tenants): keys are namespaces, "*" or
    # "label:KEY=VALUE", values {"chips": N, "reservations": [...]}. Parsed and checked at startup;
    # the provisioner enforces it. "" = no per-tenant statement.
    tenants: str = ""
    # true: pools are made only for Workloads Kueue admitted (the quota is Kueue's ClusterQueues').
    kueue_only: bool = False
    # true: the operator states on purpose that spending is not limited here (infra refuses to
    # deploy without one of CHIP_BUDGET, TENANTS, KUEUE_ONLY or this).
    unlimited_spending: bool = False
    drain: bool = False  # true: never create, only clean up
    # true: every slice gets on-demand VMs whatever capacity policy applies; pods that select Spot,
    # flex-start or a reservation are refused (they could never land on on-demand nodes).
    force_on_demand: bool = False
    # true: a slice's pool built under node settings that have since changed (shared.tpu.drift) is
    # deleted when provision next sees a pending pod of the slice and nobody runs on it, then built
    # anew; false: drift is only reported (tpuprov status, the provision decision line).
    replace_drifted_pools: bool = False

    # Fan-out and deadlines (see docs/performance.md). GKE runs a limited number of node-pool
    # operations per cluster at once and answers 429/400 beyond it. A fan-out sends this many creates
    # at once first, widens while GKE accepts them (up to CREATE_CONCURRENCY_MAX), narrows and stops
    # at the first such answer (redelivery continues); shared.provisioning.create.slots keeps the account.
    create_concurrency: int = 8
    # The widest a fan-out grows: threads and HTTP connections of one instance.
    create_concurrency_max: int = 64
    # GKE API requests per minute this deployment may spend (the project's quota of the Kubernetes
    # Engine API is 3000 a minute by default); creates are paced so that no 60 s window holds more.
    gke_requests_per_minute: int = 3000
    # No new GKE create starts after this many seconds of a delivery; must stay below the provision
    # service's Cloud Run timeout (60 s in infra/main.tf) minus one GKE call (8 s).
    request_deadline_seconds: int = 45
    # The cluster's quota of concurrently running node-pool operations; 0 = learn it from GKE's first
    # 429 ("... hits the concurrent operations quota N"), which names it.
    gke_operation_limit: int = 0
    # Kubernetes list calls are paged with limit/continue; items per page (kubectl uses 500).
    kube_list_page_size: int = 500

    # Release / reconcile.
    release_grace_seconds: int = 0  # wait this long after Completed before releasing
    suspend_grace_seconds: int = 600  # release pools of a suspended JobSet after this long
    # Wait between cordoning a pool's nodes and checking who runs there: a scheduler decision made
    # just before the cordon may still bind just after it.
    cordon_settle_seconds: int = 1
    # Keep an idle pool this long for a waiting JobSet of exactly its shape before deleting it.
    idle_pool_seconds: int = 120
    # One fleet cluster's part of a reconcile tick: the tick waits this long for each cluster's
    # sweep (they run side by side) and goes on; a sweep still running is skipped at the next tick.
    # Inside the reconcile service's Cloud Run timeout (300 s in infra/main.tf).
    reconcile_cluster_seconds: int = 240

    # Stockouts and quota (docs/functions.md): a slice GKE could not provision is retried after
    # STOCKOUT_BACKOFF_SECONDS, doubling per failed attempt up to STOCKOUT_BACKOFF_MAX_SECONDS (the
    # cluster autoscaler's node-group backoff: 5 min doubling to 30 min). 0 retries at the next sweep.
    stockout_backoff_seconds: int = 300
    stockout_backoff_max_seconds: int = 1800
    # Ordered capacity fallback for slices (shared.tpu.capacity), e.g. "spot, on-demand"; a JobSet's
    # tpuprov.dev/capacity-policy annotation overrides it. "" = only what each pod selects.
    capacity_policy: str = ""

    # Setup / Kueue.
    manifests_dir: str = "/app/manifests"
    kueue_config_path: str = ""
    jobset_version: str = "v0.10.1"
    kueue_version: str = "v0.19.2"
    # Expected sha256 of the JobSet / Kueue release file in MANIFESTS_DIR. "" = the hash pinned in
    # shared.setup.manifests for that version (a version without one is refused until it is given).
    jobset_sha256: str = ""
    kueue_sha256: str = ""
    # Clusters besides the managed one that setup_cluster may install JobSet and Kueue on (cluster
    # paths, comma-separated); a setup message naming any other cluster is acknowledged and ignored.
    setup_clusters: tuple[str, ...] = ()
    # The Kueue AdmissionCheck whose controller this product is (controllerName tpuprov.dev/tpu-slices):
    # Workloads of ClusterQueues using it get all their slices before Kueue admits them.
    admission_check_name: str = "tpu-slices"
    # The fleet cluster that is Kueue's MultiKueue manager ("" = none): the check in its workers
    # answers the worker copies of that cluster's Workloads so that one worker only runs (and buys
    # for) each (shared.provisioning.placement.multikueue).
    multikueue_manager: str = ""
    # How long a capacity shortage in a worker keeps MultiKueue's placement away from it.
    multikueue_shortage_seconds: int = 1800
    # Bounds of one setup run; the total must stay inside Cloud Run's request timeout.
    setup_timeout_seconds: int = 280
    setup_webhook_retry_seconds: int = 120  # keep retrying webhook errors of one call this long
    setup_poll_interval_ms: int = 2000  # poll period of the waits, first backoff of retries
    # What setup_cluster does with a JobSet or Kueue already on the cluster that is newer than the
    # pinned release (shared.setup.support): "keep-newer" leaves it alone, "pinned" replaces it with
    # the pinned release. An older one is upgraded in place either way.
    addon_upgrade: str = "keep-newer"

    def __post_init__(self) -> None:
        # A misspelled endpoint mode or disk type would fail every call; say so at startup instead.
        if self.control_plane_endpoint not in CONTROL_PLANE_ENDPOINTS:
            raise InvalidInputError(
                f"setting CONTROL_PLANE_ENDPOINT={self.control_plane_endpoint!r} is not one of "
                f"{', '.join(CONTROL_PLANE_ENDPOINTS)}"
            )
        if self.disk_type and self.disk_type not in BOOT_DISK_TYPES:
            raise InvalidInputError(
                f"setting DISK_TYPE={self.disk_type!r} is not a GKE boot disk type; use one of "
                f"{', '.join(BOOT_DISK_TYPES)}, or leave it unset for each TPU generation's default"
            )
        if self.stockout_backoff_max_seconds < self.stockout_backoff_seconds:
            raise InvalidInputError(
                f"setting STOCKOUT_BACKOFF_MAX_SECONDS={self.stockout_backoff_max_seconds} must be >= "
                f"STOCKOUT_BACKOFF_SECONDS={self.stockout_backoff_seconds}"
            )
        for entry in self.node_label_keys:
            # Same rule as COPY_POD_LABELS: GKE refuses these domains as node labels, and the
            # product's own keys are its ownership record.
            domain = entry.split("/", 1)[0] if "/" in entry else ""
            if reserved_label_domain(domain):
                raise InvalidInputError(
                    f"setting NODE_LABEL_KEYS entry {entry!r}: keys under {domain}/ cannot be node labels"
                )
        for entry in self.copy_pod_labels:
            # The product's ownership keys, and GKE's and Kubernetes' domains (GKE refuses those as
            # node labels; shared.tpu.selectors holds the rule), cannot be copied.
            domain = entry.split("/", 1)[0] if "/" in entry else ""
            if reserved_label_domain(domain):
                raise InvalidInputError(
                    f"setting COPY_POD_LABELS entry {entry!r}: keys under {domain}/ cannot be node labels"
                )
        if self.boot_disk_kms_key and not _KMS_KEY.match(self.boot_disk_kms_key):
            raise InvalidInputError(
                f"setting BOOT_DISK_KMS_KEY={self.boot_disk_kms_key!r} is not a Cloud KMS key name "
                "(projects/PROJECT/locations/LOCATION/keyRings/RING/cryptoKeys/KEY)"
            )
        for entry in self.secondary_boot_disks:
            image, _, mode = entry.partition("=")
            if not _DISK_IMAGE.match(image) or mode not in ("", "CONTAINER_IMAGE_CACHE"):
                raise InvalidInputError(
                    f"setting SECONDARY_BOOT_DISKS entry {entry!r} must be projects/P/global/images/IMAGE, "
                    "optionally followed by =CONTAINER_IMAGE_CACHE"
                )
        for entry in self.additional_node_networks:
            network, _, subnetwork = entry.partition(":")
            if not network.strip() or not subnetwork.strip():
                raise InvalidInputError(
                    f"setting ADDITIONAL_NODE_NETWORKS entry {entry!r} must be NETWORK:SUBNETWORK"
                )
        if self.upgrade_max_surge == 0 and self.upgrade_max_unavailable in (0, -1):
            # With neither a surge node nor an unavailable one no node could ever be upgraded.
            raise InvalidInputError(
                "setting UPGRADE_MAX_SURGE=0 needs UPGRADE_MAX_UNAVAILABLE >= 1 (else no node can be "
                "upgraded)"
            )
        if self.confidential_storage and not self.boot_disk_kms_key:
            # A disk in confidential mode must be encrypted with a Cloud KMS key.
            raise InvalidInputError("setting CONFIDENTIAL_STORAGE=true needs BOOT_DISK_KMS_KEY")
        if self.max_pods_per_node and not 8 <= self.max_pods_per_node <= 256:
            raise InvalidInputError(
                f"setting MAX_PODS_PER_NODE={self.max_pods_per_node} must be 0 (GKE's default) or 8..256"
            )
        parse_tenants(self.tenants)  # raises on a bad entry, naming it
        for name in ("jobset_sha256", "kueue_sha256"):
            value = getattr(self, name)
            if value and not _SHA256.match(value):
                raise InvalidInputError(
                    f"setting {name.upper()}={_quote(value)} is not a sha256 (64 lower-case hex digits)"
                )
        for setting, paths in (
            ("SETUP_CLUSTERS", self.setup_clusters),
            ("FLEET_CLUSTERS", self.fleet_clusters),
        ):
            for entry in paths:
                if not _CLUSTER_PATH.match(entry):
                    raise InvalidInputError(
                        f"setting {setting} entry {_quote(entry)} is not "
                        "projects/PROJECT/locations/LOCATION/clusters/CLUSTER"
                    )
        if self.multikueue_manager and not _CLUSTER_PATH.match(self.multikueue_manager):
            raise InvalidInputError(
                f"setting MULTIKUEUE_MANAGER={_quote(self.multikueue_manager)} is not "
                "projects/PROJECT/locations/LOCATION/clusters/CLUSTER"
            )
        for project in self.fleet_projects:
            if not _PROJECT_ID.match(project):
                raise InvalidInputError(
                    f"setting FLEET_PROJECTS entry {_quote(project)} is not a project id (6 to 30 "
                    "lower-case letters, digits and hyphens, starting with a letter)"
                )
        _ = self.fleet_label_pair  # raises on a malformed label, naming it
        if self.fleet_overrides:
            for path in parse_fleet_overrides(self.fleet_overrides, self._overridable, self.fleet_projects):
                try:
                    if _PROJECT_KEY.match(path):  # a project's own values, on the defaults
                        dataclasses.replace(self, fleet_overrides="", **self._fields_of(path))
                    else:
                        self.for_cluster(path)  # each cluster's settings validated as a whole
                except InvalidInputError as exc:
                    raise InvalidInputError(f"FLEET_OVERRIDES[{_quote(path)}]: {exc.why}") from None
        for name in (
            "create_concurrency",
            "create_concurrency_max",
            "gke_requests_per_minute",
            "request_deadline_seconds",
            "kube_list_page_size",
            "max_vms_per_jobset",
            "reconcile_cluster_seconds",
            "fleet_discovery_seconds",
            "multikueue_shortage_seconds",
        ):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"setting {name.upper()}={getattr(self, name)} must be >= 1")
        if self.addon_upgrade not in ADDON_UPGRADE_MODES:
            raise InvalidInputError(
                f"setting ADDON_UPGRADE={_quote(self.addon_upgrade)} is not one of "
                f"{', '.join(ADDON_UPGRADE_MODES)}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse settings from ``env`` (default: ``os.environ``); bad values raise InvalidInputError."""
        source: Mapping[str, str] = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = field.name.upper()
            if name in source:
                kwargs[field.name] = _parse(field, source[name])
        # Cloud Run sets GOOGLE_CLOUD_PROJECT; accept it when PROJECT_ID is absent.
        if "project_id" not in kwargs and source.get("GOOGLE_CLOUD_PROJECT"):
            kwargs["project_id"] = source["GOOGLE_CLOUD_PROJECT"].strip()
        return cls(**kwargs)

    @property
    def secondary_boot_disk_modes(self) -> tuple[tuple[str, str], ...]:
        """SECONDARY_BOOT_DISKS as (disk image, mode) pairs; mode "" for a data disk."""
        return tuple(
            (image, mode) for image, _, mode in (e.partition("=") for e in self.secondary_boot_disks)
        )

    @property
    def additional_network_pairs(self) -> tuple[tuple[str, str], ...]:
        """ADDITIONAL_NODE_NETWORKS as (network, subnetwork) pairs."""
        pairs = (e.partition(":") for e in self.additional_node_networks)
        return tuple((network.strip(), subnetwork.strip()) for network, _, subnetwork in pairs)

    @property
    def cluster_path(self) -> str:
        """The GKE resource name of the managed cluster."""
        return f"projects/{self.project_id}/locations/{self.location}/clusters/{self.cluster_name}"

    @property
    def fleet_paths(self) -> tuple[str, ...]:
        """The clusters this deployment manages: the managed one (when named), then FLEET_CLUSTERS."""
        own = (self.cluster_path,) if self.cluster_name else ()
        return tuple(dict.fromkeys((*own, *self.fleet_clusters)))

    @property
    def fleet_label_pair(self) -> tuple[str, str]:
        """FLEET_LABEL as (key, value). Google Cloud's label rules (Resource Manager, "Requirements
        for labels"): a key of 1-63 lower-case letters, digits, "_" or "-" starting with a letter;
        a value of 0-63 of the same."""
        key, sep, value = self.fleet_label.strip().partition("=")
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise InvalidInputError(
                f"setting FLEET_LABEL={_quote(self.fleet_label)} is not KEY=VALUE with a GKE resource "
                "label's key and value (lower-case letters, digits, _ and -; the key starts with a letter)"
            )
        return key, value

    def discoverable(self, path: str) -> bool:
        """Whether ``path`` is a cluster of FLEET_PROJECTS: in the fleet when GKE lists it labelled."""
        return _CLUSTER_PATH.match(path) is not None and path.split("/")[1] in self.fleet_projects

    @property
    def _overridable(self) -> tuple[str, ...]:
        return tuple(p for p in self.fleet_paths if p != self.cluster_path)

    def for_cluster(self, path: str) -> Settings:
        """These settings with the managed cluster ``path`` (one of ``fleet_paths``): what one fleet
        cluster's services run with. Another cluster is not behind the managed cluster's endpoint
        or kubeconfig context: it is reached through its own context (``fleet_context``) in a
        kubeconfig, or looked up in GKE."""
        if path == self.cluster_path:
            return self
        _, project, _, location, _, name = path.split("/")
        return dataclasses.replace(
            self,
            project_id=project,
            location=location,
            cluster_name=name,
            kube_api_endpoint="",
            kube_context=fleet_context(project, location, name) if self.kubeconfig else "",
            fleet_overrides="",
            **self._overrides_of(path),
        )

    def _overrides_of(self, path: str) -> dict[str, Any]:
        """FLEET_OVERRIDES of cluster ``path`` as field values: its project's (``projects/P``), then
        its own on top (a bad one raises, naming the key; startup validation adds the cluster)."""
        return {**self._fields_of("/".join(path.split("/")[:2])), **self._fields_of(path)}

    def _fields_of(self, key: str) -> dict[str, Any]:
        """One FLEET_OVERRIDES entry (a cluster path or ``projects/P``) as field values."""
        fields = {f.name.upper(): f for f in dataclasses.fields(Settings)}
        values = parse_fleet_overrides(self.fleet_overrides, self._overridable, self.fleet_projects).get(
            key, {}
        )
        return {fields[name].name: _parse(fields[name], raw) for name, raw in values.items()}

    @property
    def setup_cluster_paths(self) -> tuple[str, ...]:
        """The clusters setup_cluster may install on: the fleet, then SETUP_CLUSTERS."""
        return tuple(dict.fromkeys((self.cluster_path, *self.fleet_paths, *self.setup_clusters)))

    @property
    def tenant_entries(self) -> tuple[TenantEntry, ...]:
        """TENANTS parsed (validated at construction), in key order."""
        return parse_tenants(self.tenants)

    @property
    def spending_stated(self) -> bool:
        """Whether the deployment says how much it may spend: a chip budget, tenant entries,
        Kueue-only provisioning, or unlimited spending stated on purpose."""
        return bool(self.chip_budget > 0 or self.tenant_entries or self.kueue_only or self.unlimited_spending)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields replaced (tests and the sandbox use this)."""
        return dataclasses.replace(self, **changes)
