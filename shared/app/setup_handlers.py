"""Handlers of the two cluster-setup functions: ``setup_cluster`` and ``apply_kueue``.

Like ``shared.app.handlers`` for the event-driven functions, each handler takes the instance's
runtime and the CloudEvent, decodes the Pub/Sub payload, and makes one service call. Errors are
``shared.core.errors`` and ``shared.app.entry.handle`` maps them onto ack or redelivery.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shared.app.entry import Runtime
from shared.cloud.objects import ApiClientObjects, Bounds
from shared.core import logs
from shared.core.errors import InvalidInputError
from shared.events import envelope as events
from shared.events.fields import ClusterId
from shared.events.trigger import KUEUE_CLUSTER_ATTRIBUTE, parse_setup_payload
from shared.kueue.apply import KueueReport, KueueService
from shared.kueue.config import load_config, parse_config
from shared.kueue.model import TPU_SLICES_CHECK, TPU_SLICES_CONTROLLER
from shared.setup.installer import Installer, InstallReport

log = logs.get("setup")

# Payloads that mean "apply the deployed default configuration" (a bare publish).
_DEFAULT_PAYLOADS = (b"", b"{}", b"null")


def _own_objects(runtime: Runtime) -> ApiClientObjects:
    """The generic-object adapter of the cluster ``runtime`` serves, built once on its client."""
    objects: ApiClientObjects = runtime.service("objects", lambda rt: ApiClientObjects(rt.kube_api_client()))
    return objects


def objects_for(runtime: Runtime, cluster_path: str) -> ApiClientObjects:
    """The generic-object adapter for ``cluster_path``, built once per instance and cluster."""
    member = runtime.member(cluster_path)
    if member is not None:  # a fleet cluster: its runtime's own client
        return _own_objects(member)

    def build(rt: Runtime) -> ApiClientObjects:
        from shared.cloud.kube import connect

        return ApiClientObjects(connect(rt.settings, rt.gke, cluster_path).api_client)

    # A cluster being bootstrapped is not one this deployment manages; reach it by path.
    return runtime.service(f"objects:{cluster_path}", build)


def _payload(cloud_event: Any, allow_empty: bool) -> tuple[bytes, Mapping[str, str]]:
    """The delivery's data and its Pub/Sub attributes, from one decode of the CloudEvent."""
    payload, delivery, why = events.unwrap_cloud_event(cloud_event)
    attributes: Mapping[str, str] = delivery.attributes if delivery is not None else {}
    if payload is not None:
        return payload, attributes
    if allow_empty and delivery is not None and why.endswith("has no data"):
        return b"", attributes
    raise InvalidInputError(f"unreadable delivery: {why}")


def setup_cluster(runtime: Runtime, cloud_event: Any) -> InstallReport | None:
    """Install or upgrade JobSet and Kueue on the cluster the message names, when it is the managed
    cluster or one of SETUP_CLUSTERS; any other is acknowledged with a ``setup.ignored`` line."""
    cluster, ignored = parse_setup_payload(_payload(cloud_event, allow_empty=False)[0])
    if cluster is None:
        logs.decision(log, "setup.ignored", ignored, logging.INFO)
        return None
    allowed = runtime.settings.setup_cluster_paths
    # A cluster of FLEET_PROJECTS is set up once GKE lists it labelled; its CreateCluster entry
    # arrives as it is being created, so the listing is asked for now, not taken from memory.
    if cluster.path not in allowed and runtime.member(cluster.path, fresh=True) is None:
        # Installing is cluster-admin work (CRDs, RBAC, webhooks): only the deployment's own
        # cluster and the ones SETUP_CLUSTERS names, never whatever a message or another project's
        # cluster-creation entry asks for. Acknowledged: redelivery would not change the answer.
        logs.decision(
            log,
            "setup.ignored",
            f"{cluster.path} is not a cluster this deployment sets up (the managed cluster "
            f"{runtime.settings.cluster_path}, one listed in SETUP_CLUSTERS or FLEET_CLUSTERS, or a "
            "cluster of FLEET_PROJECTS carrying FLEET_LABEL)",
            logging.WARNING,
            cluster=cluster.path,
        )
        return None
    with logs.bound(cluster=cluster.path):
        installer = Installer(objects_for(runtime, cluster.path), runtime.settings)
        report = installer.install(cluster.path)
        logs.decision(
            log, "setup.done", f"setup of {cluster.path}: {report.summary()}", changed=report.changed
        )
        return report


def _kueue_target(runtime: Runtime, attributes: Mapping[str, str]) -> Runtime:
    """The runtime of the cluster the message's ``cluster`` attribute names (the managed cluster's
    without one). A cluster outside the fleet is refused: applying queues is writing cluster-scoped
    objects, so only a cluster this deployment serves, never whatever a publisher names."""
    named = attributes.get(KUEUE_CLUSTER_ATTRIBUTE, "").strip()
    if not named:
        return runtime
    cluster = ClusterId.from_path(named)  # InvalidInputError names what a path looks like
    member = runtime.member(cluster.path)
    if member is None:
        raise InvalidInputError(
            f"the message's cluster attribute names {cluster.path}, which is not a cluster this "
            f"deployment serves (the managed cluster {runtime.settings.cluster_path}, one listed in "
            "FLEET_CLUSTERS, or a cluster of FLEET_PROJECTS carrying FLEET_LABEL); nothing applied"
        )
    return member


def apply_kueue(runtime: Runtime, cloud_event: Any) -> KueueReport:
    """Apply the queue configuration in the message, or the deployed default for an empty one, to
    the cluster the message's ``cluster`` attribute names (the managed cluster without one)."""
    data, attributes = _payload(cloud_event, allow_empty=True)
    target = _kueue_target(runtime, attributes)
    settings = target.settings  # a fleet cluster's own (FLEET_OVERRIDES: allowed accelerators...)
    payload = data.strip()
    with logs.bound(cluster=settings.cluster_path):
        if payload in _DEFAULT_PAYLOADS:
            config = load_config(settings.kueue_config_path, settings.allowed_accelerators)
            source = settings.kueue_config_path or "the packaged default"
        else:
            config = parse_config(payload, settings.allowed_accelerators)
            source = "the message"
        logs.decision(
            log, "kueue.config", f"applying the Kueue configuration from {source} to {settings.cluster_path}"
        )
        service = KueueService(_own_objects(target), Bounds.from_settings(settings))
        report = service.apply(config)
        if any(queue.check_flavors for queue in config.cluster_queues):
            # Kueue keeps a ClusterQueue whose AdmissionCheck is not Active inactive: mark it Active
            # now rather than at the next reconcile sweep (which keeps it so).
            target.kube().set_admission_check_active(
                TPU_SLICES_CHECK,
                f"{TPU_SLICES_CONTROLLER} provisions every TPU slice of a Workload before admission",
            )
        return report
