"""What ``tpuprov publish setup|kueue --wait`` watch on the cluster after the message is published.

The functions answer Pub/Sub, not the publisher, so the outcome is read where it lands: setup is
done when the JobSet and Kueue controllers run at the versions setup leaves (the pinned ones, or a
newer one ADDON_UPGRADE keeps) and are Available; a Kueue
configuration is applied when every object ``shared.kueue.render`` makes of it is on the cluster
with that content and no other object carries the product's managed-by label (``apply_kueue``
prunes those). Both poll through the functions' own Kubernetes adapter (``tpuprov.cluster``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.cloud.objects import describe, object_key
from shared.core.errors import NotFoundError
from shared.core.settings import Settings
from shared.kueue.config import parse_config
from shared.kueue.render import MANAGED_KINDS, MANAGED_SELECTOR, render
from shared.setup.manifests import JOBSET, KUEUE, VERSION_ANNOTATION
from shared.setup.support import KEEP_NEWER, KEEP_NEWER_ACTION, KEEP_UNKNOWN, plan
from tpuprov.progress import Progress


def _deployment_state(
    objects: Any, namespace: str, name: str, version: str, mode: str = KEEP_NEWER
) -> tuple[bool, str]:
    """(installed at the version setup leaves and Available, what it looks like now) for one add-on
    controller: ``version`` (the pinned release), unless setup keeps the one installed
    (``shared.setup.support.plan`` with ADDON_UPGRADE ``mode``: a newer or unrecognisable one)."""
    try:
        deployment = objects.get("apps/v1", "Deployment", name, namespace)
    except NotFoundError:
        return False, "not installed yet"
    installed = ((deployment.get("metadata") or {}).get("annotations") or {}).get(VERSION_ANNOTATION, "")
    status = deployment.get("status") or {}
    available = any(
        c.get("type") == "Available" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    replicas = (
        f"{status.get('availableReplicas', 0)}/{(deployment.get('spec') or {}).get('replicas', 1)} available"
    )
    action = plan(installed, version, mode)
    if action in (KEEP_NEWER_ACTION, KEEP_UNKNOWN):
        why = "newer than" if action == KEEP_NEWER_ACTION else "not a release, so not replaced by"
        return available, f"{installed} kept ({why} {version}, ADDON_UPGRADE={mode}), {replicas}"
    if installed != version:
        return False, f"{installed or 'unknown version'} installed, waiting for {version}"
    return available, replicas


def wait_for_setup(settings: Settings, timeout: float, progress: Any = None, poll: float = 2.0) -> bool:
    """After a setup message: follow the install on the cluster until both controllers are Available."""
    from tpuprov.cluster import ClusterView

    progress = progress or Progress()
    objects = ClusterView(settings).objects
    ok = True
    for component, version in ((JOBSET, settings.jobset_version), (KUEUE, settings.kueue_version)):
        ok = (
            progress.wait_until(
                f"Waiting for {component.name} {version} ({component.namespace}/{component.deployment})",
                lambda c=component, v=version: _deployment_state(
                    objects, c.namespace, c.deployment, v, settings.addon_upgrade
                ),
                timeout,
                poll,
            )
            and ok
        )
    return ok


def _holds(live: Any, want: Any) -> bool:
    """True when ``live`` carries everything ``want`` says (the API server may add defaults)."""
    if isinstance(want, Mapping):
        return isinstance(live, Mapping) and all(k in live and _holds(live[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(map(_holds, live, want))
    # Quantities come back as the API server prints them ("24" for 24).
    return live == want or (not isinstance(want, bool) and str(live) == str(want))


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    # What apply_kueue sets: everything but the identity and the server's own metadata.
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {**{k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}, "labels": labels}


def kueue_state(objects: Any, desired: list[dict[str, Any]]) -> tuple[bool, str]:
    """(the cluster's managed Kueue objects are exactly ``desired``, how far it is)."""
    live: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for api_version, kind in MANAGED_KINDS:
        try:
            found = objects.list_objects(api_version, kind, label_selector=MANAGED_SELECTOR)
        except NotFoundError:
            return False, f"{kind} is not served yet (Kueue's CRDs are not installed)"
        live.update({object_key(obj): obj for obj in found})
    wanted = {object_key(obj): obj for obj in desired}
    missing = [describe(o) for k, o in wanted.items() if k not in live]
    differ = [
        describe(o) for k, o in wanted.items() if k in live and not _holds(_content(live[k]), _content(o))
    ]
    stale = [describe(o) for k, o in live.items() if k not in wanted]
    done = len(wanted) - len(missing) - len(differ)
    parts = [f"{done}/{len(wanted)} objects applied"]
    for label, names in (("missing", missing), ("not yet updated", differ), ("to prune", stale)):
        if names:
            parts.append(f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")
    return not (missing or differ or stale), "; ".join(parts)


def wait_for_kueue(
    settings: Settings, config_text: str, timeout: float, progress: Any = None, poll: float = 2.0
) -> bool:
    """After a Kueue message: follow the apply on the cluster until it matches the configuration."""
    from tpuprov.cluster import ClusterView

    desired = render(parse_config(config_text, settings.allowed_accelerators))
    objects = ClusterView(settings).objects
    return (progress or Progress()).wait_until(
        f"Waiting for the Kueue configuration ({len(desired)} objects)",
        lambda: kueue_state(objects, desired),
        timeout,
        poll,
    )
