"""Release manifests: version parsing and detection, apply order, stamps and the Kueue JobSet integration."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.testing.fixtures import kube as fixtures_kube
from shared.cloud.objects import Bounds
from shared.core.errors import InvalidInputError
from shared.setup import manifests

MANIFESTS = fixtures_kube.MANIFESTS_DIR
JOBSET_VERSION, KUEUE_VERSION = "v0.10.1", "v0.19.2"
FAST = Bounds(total=20.0, webhook_retry=5.0, poll=0.01)


@pytest.fixture
def release_manifests() -> Path:
    """The release manifests beside the repository; the test fails when they are missing."""
    fixtures_kube.require_manifest(fixtures_kube.JOBSET_MANIFEST)
    fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)
    return MANIFESTS


needs_manifests = pytest.mark.usefixtures("release_manifests")


# ----------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        ("v0.19.2", "v0.19.2", 0),
        ("v0.18.0", "v0.19.2", -1),
        ("v0.19.10", "v0.19.2", 1),
        ("v1.0.0", "v0.99.99", 1),
        ("v0.20.0-rc.1", "v0.20.0", -1),
        ("v0.20.0-rc.2", "v0.20.0-rc.10", -1),
        ("0.19.2", "v0.19.2", 0),
        ("latest", "v0.19.2", None),
        ("", "v0.19.2", None),
    ],
    ids=[
        "equal",
        "older",
        "numeric-not-lexical",
        "major",
        "pre-release-before-release",
        "rc-numeric",
        "no-v",
        "tag",
        "empty",
    ],
)
def test_compare_versions(left: str, right: str, expected: int | None) -> None:
    assert manifests.compare_versions(left, right) == expected


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("registry.k8s.io/kueue/kueue:v0.19.2", "v0.19.2"),
        ("registry.k8s.io/kueue/kueue:v0.19.2@sha256:abcd", "v0.19.2"),
        ("localhost:5000/kueue", ""),
        ("localhost:5000/kueue:v0.18.1", "v0.18.1"),
        ("kueue", ""),
    ],
    ids=["tag", "tag-and-digest", "registry-port-no-tag", "registry-port-tag", "bare"],
)
def test_image_tag(image: str, tag: str) -> None:
    assert manifests.image_tag(image) == tag


def _deployment(image: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"annotations": annotations or {}},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {"name": "kube-rbac-proxy", "image": "gcr.io/proxy:v0.8.0"},
                        {"name": "manager", "image": image},
                    ]
                }
            }
        },
    }


def test_deployed_version_prefers_the_installer_stamp_then_the_manager_image() -> None:
    mirrored = _deployment("mirror.example/kueue@sha256:ff", {manifests.VERSION_ANNOTATION: "v0.19.2"})
    assert manifests.deployed_version(mirrored, manifests.KUEUE) == "v0.19.2"
    assert manifests.deployed_version(_deployment("x/kueue:v0.18.0"), manifests.KUEUE) == "v0.18.0"


# ----------------------------------------------------------------------------- release files


@needs_manifests
def test_release_is_ordered_foundation_first_and_webhooks_last() -> None:
    release = manifests.load_release(str(MANIFESTS), manifests.KUEUE, KUEUE_VERSION)
    kinds = [doc["kind"] for doc in release.documents]
    assert len(kinds) == 79
    assert kinds[0] == "Namespace"
    assert kinds[1:12] == ["CustomResourceDefinition"] * 11
    assert kinds[-2:] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert kinds.index("Deployment") > kinds.index("Service") > kinds.index("ConfigMap")
    assert [d["kind"] for d in release.foundation] == kinds[:12]
    assert len(release.rest) == 67


@needs_manifests
def test_release_stamps_the_version_and_keeps_a_config_that_has_jobset() -> None:
    release = manifests.load_release(str(MANIFESTS), manifests.KUEUE, KUEUE_VERSION)
    deployment = manifests.find(release.documents, "Deployment", "kueue-system", "kueue-controller-manager")
    assert deployment is not None
    assert deployment["metadata"]["annotations"][manifests.VERSION_ANNOTATION] == KUEUE_VERSION
    original = {
        doc["metadata"]["name"]: doc
        for doc in yaml.load_all(
            (MANIFESTS / f"kueue-{KUEUE_VERSION}.yaml").read_text(),
            Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
        )
        if doc["kind"] == "ConfigMap"
    }
    config_map = manifests.find(release.documents, "ConfigMap", "kueue-system", "kueue-manager-config")
    # Upstream already enables JobSet, so the text (comments and all) must be byte-identical.
    assert config_map == original["kueue-manager-config"]


def _manifest_dir(tmp_path: Path, kueue_edit: Any = None, kueue_version: str = KUEUE_VERSION) -> Path:
    shutil.copy(MANIFESTS / f"jobset-{JOBSET_VERSION}.yaml", tmp_path / f"jobset-{JOBSET_VERSION}.yaml")
    text = (MANIFESTS / f"kueue-{KUEUE_VERSION}.yaml").read_text()
    (tmp_path / f"kueue-{kueue_version}.yaml").write_text(kueue_edit(text) if kueue_edit else text)
    return tmp_path


def _without_jobset(text: str) -> str:
    edited = text.replace('  - "jobset.x-k8s.io/jobset"\n', "")
    assert edited != text
    return edited


def _manager_config(docs: Any) -> dict[str, Any]:
    config_map = manifests.find(list(docs), "ConfigMap", "kueue-system", "kueue-manager-config")
    assert config_map is not None
    parsed: dict[str, Any] = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    return parsed


def _kueue_sha256(directory: Path, version: str = KUEUE_VERSION) -> str:
    """What an operator states in KUEUE_SHA256 for an edited (or unpinned) Kueue file."""
    return manifests.file_sha256(directory / f"kueue-{version}.yaml")


@needs_manifests
def test_missing_jobset_integration_is_added_and_rolls_the_pods(tmp_path: Path) -> None:
    stock = manifests.load_release(str(MANIFESTS), manifests.KUEUE, KUEUE_VERSION)
    directory = _manifest_dir(tmp_path, _without_jobset)
    edited = manifests.load_release(str(directory), manifests.KUEUE, KUEUE_VERSION, _kueue_sha256(directory))
    frameworks = _manager_config(edited.documents)["integrations"]["frameworks"]
    assert frameworks[-1] == "jobset.x-k8s.io/jobset"
    assert frameworks[:-1] == [
        f for f in _manager_config(stock.documents)["integrations"]["frameworks"] if "jobset" not in f
    ]

    def config_hash(release: manifests.Release) -> str:
        deployment = manifests.find(
            release.documents, "Deployment", "kueue-system", "kueue-controller-manager"
        )
        assert deployment is not None
        return str(
            deployment["spec"]["template"]["metadata"]["annotations"][manifests.CONFIG_HASH_ANNOTATION]
        )

    assert config_hash(stock) != config_hash(edited)


def test_integrations_section_is_created_when_absent() -> None:
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kueue-manager-config", "namespace": "kueue-system"},
            "data": {"controller_manager_config.yaml": "apiVersion: config.kueue.x-k8s.io/v1beta2\n"},
        }
    ]
    assert manifests.ensure_jobset_integration(docs) is True
    assert _manager_config(docs)["integrations"] == {"frameworks": ["jobset.x-k8s.io/jobset"]}
    assert manifests.ensure_jobset_integration(docs) is False


@needs_manifests
def test_a_file_whose_image_does_not_match_its_name_is_refused(tmp_path: Path) -> None:
    directory = _manifest_dir(tmp_path, kueue_version="v0.19.3")
    with pytest.raises(InvalidInputError, match=r"deploys image tag 'v0.19.2', not v0.19.3"):
        manifests.load_release(
            str(directory), manifests.KUEUE, "v0.19.3", _kueue_sha256(directory, "v0.19.3")
        )


def test_a_missing_release_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match=r"kueue-v0\.19\.2\.yaml is missing from the image"):
        manifests.load_release(str(tmp_path), manifests.KUEUE, KUEUE_VERSION)


# ----------------------------------------------------------------------------- pinned hashes


@needs_manifests
def test_the_pinned_releases_match_their_pinned_sha256() -> None:
    for component, version in ((manifests.JOBSET, JOBSET_VERSION), (manifests.KUEUE, KUEUE_VERSION)):
        path = manifests.manifest_path(str(MANIFESTS), component, version)
        assert manifests.file_sha256(path) == manifests.PINNED_SHA256[(component.name, version)]
        assert manifests.load_release(str(MANIFESTS), component, version).version == version
    # The settings' defaults are exactly the pinned releases.
    assert set(manifests.PINNED_SHA256) == {("jobset", JOBSET_VERSION), ("kueue", KUEUE_VERSION)}


@needs_manifests
def test_a_file_that_differs_from_the_pinned_release_is_refused(tmp_path: Path) -> None:
    directory = _manifest_dir(tmp_path, _without_jobset)
    actual = _kueue_sha256(directory)
    pinned = manifests.PINNED_SHA256[("kueue", KUEUE_VERSION)]
    with pytest.raises(InvalidInputError) as refused:
        manifests.load_release(str(directory), manifests.KUEUE, KUEUE_VERSION)
    why = refused.value.why
    assert f"sha256 {actual} does not match the expected {pinned}" in why
    assert f"pinned for kueue {KUEUE_VERSION}" in why and "refusing to apply it" in why


@needs_manifests
def test_another_version_needs_its_sha256_stated(tmp_path: Path) -> None:
    text = (MANIFESTS / f"kueue-{KUEUE_VERSION}.yaml").read_text().replace("kueue:v0.19.2", "kueue:v0.20.0")
    (tmp_path / "kueue-v0.20.0.yaml").write_text(text)
    actual = _kueue_sha256(tmp_path, "v0.20.0")
    with pytest.raises(
        InvalidInputError, match=rf"no sha256 is pinned for kueue v0.20.0: .* KUEUE_SHA256 .*{actual}"
    ):
        manifests.load_release(str(tmp_path), manifests.KUEUE, "v0.20.0")
    with pytest.raises(InvalidInputError, match=rf"does not match the expected {'0' * 64} \(KUEUE_SHA256\)"):
        manifests.load_release(str(tmp_path), manifests.KUEUE, "v0.20.0", "0" * 64)
    release = manifests.load_release(str(tmp_path), manifests.KUEUE, "v0.20.0", actual)
    assert release.version == "v0.20.0"


def test_the_settings_carry_the_operators_hashes() -> None:
    from shared.core.settings import Settings

    assert (Settings().jobset_sha256, Settings().kueue_sha256) == ("", "")
    settings = Settings.from_env({"KUEUE_SHA256": "a" * 64, "JOBSET_SHA256": "b" * 64})
    assert (settings.kueue_sha256, settings.jobset_sha256) == ("a" * 64, "b" * 64)
    with pytest.raises(InvalidInputError, match=r"KUEUE_SHA256=.* is not a sha256"):
        Settings.from_env({"KUEUE_SHA256": "A" * 64})
    assert manifests.sha256_setting(manifests.JOBSET) == "JOBSET_SHA256"
