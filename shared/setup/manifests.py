"""Release manifests of JobSet and Kueue: loading, apply order, version stamps and detection.

The deployed image carries the pinned upstream ``manifests.yaml`` files as
``<manifests_dir>/jobset-<version>.yaml`` and ``kueue-<version>.yaml``; nothing is downloaded at
run time. This module turns such a file into an ordered, validated list of objects and knows
how to tell which version of a component a cluster runs.

The files are applied with cluster-admin rights, and the build downloads them from GitHub: so a
file is only used when its sha256 is the one pinned here for its version (:data:`PINNED_SHA256`), or
the one the operator states for another version (``JOBSET_SHA256`` / ``KUEUE_SHA256``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from shared.core import labels
from shared.core.errors import InvalidInputError
from shared.core.meta import Meta

# Stamped on each controller Deployment the installer applies, so detection does not depend on
# how the image is named (mirrors, digests).
VERSION_ANNOTATION = f"{labels.PRODUCT_DOMAIN}/installed-version"
# On the Kueue pod template: a hash of the manager config, so a config change rolls the pods.
CONFIG_HASH_ANNOTATION = f"{labels.PRODUCT_DOMAIN}/manager-config-hash"

KUEUE_CONFIG_MAP = "kueue-manager-config"
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
JOBSET_FRAMEWORK = "jobset.x-k8s.io/jobset"

CRD_KIND = "CustomResourceDefinition"
# Applied (and, for CRDs, waited on) before everything else.
FOUNDATION_KINDS = ("Namespace", CRD_KIND)
# kustomize's legacy order, which the upstream release files also follow.
KIND_ORDER = (
    "Namespace",
    CRD_KIND,
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Service",
    "Deployment",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")

# sha256 of each pinned release's manifests.yaml, byte for byte as the build downloads it into
# build/manifests/<name>-<version>.yaml and the image carries it (computed over the release files of
# JobSet v0.10.1 and Kueue v0.19.2; their provenance is recorded beside the test copies). A release
# not listed here is applied only with its hash stated in the settings.
PINNED_SHA256 = {
    ("jobset", "v0.10.1"): "41ad53ab43555e4adc92b3e59c01d1cb1c77bf7ce12737375db134ed4d7c219e",
    ("kueue", "v0.19.2"): "88881eb50734eb920b67486ebc2aa978ed325e1b12d99b22fc51a6d7e9e4d370",
}


@dataclasses.dataclass(frozen=True)
class Component:
    """One installable add-on and where its controller runs."""

    name: str  # file prefix: "jobset" | "kueue"
    namespace: str
    deployment: str
    container: str = "manager"


JOBSET = Component("jobset", "jobset-system", "jobset-controller-manager")
KUEUE = Component("kueue", "kueue-system", "kueue-controller-manager")
COMPONENTS = (JOBSET, KUEUE)


@dataclasses.dataclass(frozen=True)
class Release:
    """A component's manifest at one version, ready to apply (already patched and stamped)."""

    component: Component
    version: str
    documents: tuple[dict[str, Any], ...]
    source: str  # file path, for messages

    @property
    def foundation(self) -> list[dict[str, Any]]:
        """Namespaces and CRDs, in file order."""
        return [doc for doc in self.documents if doc["kind"] in FOUNDATION_KINDS]

    @property
    def rest(self) -> list[dict[str, Any]]:
        """Everything else, in apply order."""
        return [doc for doc in self.documents if doc["kind"] not in FOUNDATION_KINDS]

    @property
    def crds(self) -> list[dict[str, Any]]:
        """The CustomResourceDefinitions of the release."""
        return [doc for doc in self.documents if doc["kind"] == CRD_KIND]


def parse_version(text: str) -> tuple[int, int, int, tuple[Any, ...]] | None:
    """``"v0.19.2"`` -> comparable tuple; a pre-release sorts before its release; junk -> None."""
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    # (1,) sorts after any (0, ...) so a release outranks its pre-releases.
    pre_key: tuple[Any, ...] = (1,) if pre is None else (0, *(_pre_part(p) for p in pre.split(".")))
    return int(major), int(minor), int(patch), pre_key


def _pre_part(part: str) -> tuple[int, int | str]:
    return (0, int(part)) if part.isdigit() else (1, part)


def compare_versions(left: str, right: str) -> int | None:
    """-1, 0 or 1 as ``left`` is older, equal or newer than ``right``; None when either is unparseable."""
    a, b = parse_version(left), parse_version(right)
    if a is None or b is None:
        return None
    return (a > b) - (a < b)


def image_tag(image: str) -> str:
    """The tag of a container image reference (``repo:tag`` or ``repo:tag@sha256:...``), or ""."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else ""


def deployed_version(deployment: Mapping[str, Any], component: Component) -> str:
    """The version a controller Deployment runs: the installer's stamp, else the image tag, else ""."""
    stamped = Meta.of(deployment).annotations.get(VERSION_ANNOTATION, "")
    if stamped:
        return str(stamped)
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or []
    chosen = [c for c in containers if c.get("name") == component.container] or containers[:1]
    return image_tag(str(chosen[0].get("image", ""))) if chosen else ""


def manifest_path(directory: str, component: Component, version: str) -> Path:
    """Where the image keeps the release file of ``component`` at ``version``."""
    return Path(directory) / f"{component.name}-{version}.yaml"


def sha256_setting(component: Component) -> str:
    """The setting that states the expected hash of ``component``'s file: JOBSET_SHA256 / KUEUE_SHA256."""
    return f"{component.name.upper()}_SHA256"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (InvalidInputError when it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        raise InvalidInputError(f"release manifest {path} is missing from the image") from None
    return digest.hexdigest()


def verify_sha256(path: Path, component: Component, version: str, expected: str = "") -> str:
    """Check the file against ``expected`` (the operator's), else the hash pinned for ``version``;
    return its sha256. InvalidInputError names both hashes on a mismatch, and the setting to state
    for a version nothing is pinned for."""
    source = f"{sha256_setting(component)}"
    if not expected:
        expected = PINNED_SHA256.get((component.name, version), "")
        source = f"pinned for {component.name} {version}"
    actual = file_sha256(path)
    if not expected:
        raise InvalidInputError(
            f"no sha256 is pinned for {component.name} {version}: state the file's hash in "
            f"{sha256_setting(component)} (its sha256 is {actual}; check it against the release "
            "you meant to install) to apply it"
        )
    if actual != expected:
        raise InvalidInputError(
            f"{path}: sha256 {actual} does not match the expected {expected} ({source}); refusing to apply it"
        )
    return actual


def _loader() -> Any:
    # The libyaml loader parses the 1.7 MB Kueue file about ten times faster than pure Python.
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=8)
def _read_documents(path: str, mtime_ns: int, size: int) -> tuple[dict[str, Any], ...]:
    del mtime_ns, size  # only part of the cache key
    with open(path, encoding="utf-8") as handle:
        try:
            docs = [doc for doc in yaml.load_all(handle, Loader=_loader()) if doc is not None]
        except yaml.YAMLError as exc:
            raise InvalidInputError(f"{path} is not valid YAML: {exc}") from None
    problems = []
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
            problems.append(f"document {index} has no apiVersion/kind")
        elif not Meta.of(doc).name:
            problems.append(f"document {index} ({doc['kind']}) has no metadata.name")
    if problems:
        raise InvalidInputError(f"{path}: " + "; ".join(problems))
    return tuple(docs)


def read_documents(path: Path) -> list[dict[str, Any]]:
    """All objects of a multi-document YAML file (deep copies; parsed once per file version)."""
    try:
        stat = os.stat(path)
    except OSError:
        raise InvalidInputError(f"release manifest {path} is missing from the image") from None
    return copy.deepcopy(list(_read_documents(str(path), stat.st_mtime_ns, stat.st_size)))


def order_documents(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stable sort into apply order; kinds not in KIND_ORDER go last, in file order."""
    rank = {kind: index for index, kind in enumerate(KIND_ORDER)}
    return sorted(docs, key=lambda doc: rank.get(doc["kind"], len(KIND_ORDER)))


def find(docs: Sequence[Mapping[str, Any]], kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
    """The document of ``kind`` named ``namespace/name``, or None."""
    for doc in docs:
        meta = Meta.of(doc, default_namespace="")
        if doc.get("kind") == kind and meta.name == name and meta.namespace == namespace:
            return doc
    return None


def ensure_jobset_integration(docs: list[dict[str, Any]]) -> bool:
    """Enable Kueue's JobSet integration in the manager ConfigMap in place; True when it changed.

    The text is only rewritten when the framework is missing: re-serializing drops upstream's
    comments, and leaving it byte-identical keeps re-applies no-ops.
    """
    config_map = find(docs, "ConfigMap", KUEUE.namespace, KUEUE_CONFIG_MAP)
    if config_map is None:
        raise InvalidInputError(f"Kueue manifest has no ConfigMap {KUEUE.namespace}/{KUEUE_CONFIG_MAP}")
    data = config_map.get("data") or {}
    try:
        config = yaml.safe_load(data.get(KUEUE_CONFIG_KEY) or "") or {}
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"Kueue manager config is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidInputError("Kueue manager config is not a mapping")
    integrations = config.get("integrations")
    if not isinstance(integrations, dict):
        integrations = config["integrations"] = {}
    frameworks = integrations.get("frameworks")
    if not isinstance(frameworks, list):
        frameworks = integrations["frameworks"] = []
    if JOBSET_FRAMEWORK in frameworks:
        return False
    frameworks.append(JOBSET_FRAMEWORK)
    new_data = dict(data)
    new_data[KUEUE_CONFIG_KEY] = yaml.safe_dump(config, sort_keys=False)
    config_map["data"] = new_data  # type: ignore[index]
    return True


def _stamp(docs: list[dict[str, Any]], component: Component, version: str) -> None:
    deployment = find(docs, "Deployment", component.namespace, component.deployment)
    if deployment is None:
        raise InvalidInputError(
            f"{component.name} manifest has no Deployment {component.namespace}/{component.deployment}"
        )
    found = deployed_version(deployment, component)
    if found != version:
        raise InvalidInputError(f"{component.name}-{version}.yaml deploys image tag {found!r}, not {version}")
    meta = deployment.setdefault("metadata", {})  # type: ignore[attr-defined]
    meta.setdefault("annotations", {})[VERSION_ANNOTATION] = version
    if component == KUEUE:
        config_map = find(docs, "ConfigMap", KUEUE.namespace, KUEUE_CONFIG_MAP) or {}
        text = str((config_map.get("data") or {}).get(KUEUE_CONFIG_KEY, ""))
        template_meta = deployment["spec"]["template"].setdefault("metadata", {})
        template_meta.setdefault("annotations", {})[CONFIG_HASH_ANNOTATION] = hashlib.sha256(
            text.encode()
        ).hexdigest()[:16]


def load_release(directory: str, component: Component, version: str, sha256: str = "") -> Release:
    """Verify (see :func:`verify_sha256`), read, check, patch (Kueue: JobSet integration) and stamp
    one release manifest. ``sha256`` is the operator's expected hash; "" means the pinned one."""
    path = manifest_path(directory, component, version)
    verify_sha256(path, component, version, sha256)
    docs = read_documents(path)
    if component == KUEUE:
        ensure_jobset_integration(docs)
    _stamp(docs, component, version)
    return Release(component, version, tuple(order_documents(docs)), str(path))
