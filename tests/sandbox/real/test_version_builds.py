"""The other JobSet and Kueue versions the sandbox builds (``sandbox.kube.build``), without building one.

Each supported version has a Go module pinning it; the matrix runs each at least once; the manifest
recipe (the module's kustomize config with the release image, rendered by the bundled kubectl) gives
back the pinned releases' files byte for byte, so the rendered manifests of the other versions are
what upstream publishes too.
"""

from __future__ import annotations

import os

import pytest

from sandbox.kube import build
from sandbox.realstack.versions import MATRIX, PINNED, Pair, matrix
from shared.setup.support import SUPPORTED

pytestmark = [pytest.mark.integration]


def test_every_supported_version_has_a_go_module_or_is_pinned() -> None:
    built = {(r.name, r.version) for r in build.releases()}
    supported = {(name, version) for name, known in SUPPORTED.items() for version in known.tested}
    assert built == supported
    assert (PINNED.jobset, PINNED.kueue) == ("v0.10.1", "v0.19.2")
    for release in build.extra_releases():
        assert not release.pinned
        assert release.module == build.VERSION_MODULES / str(release)
        assert release.binary == build.VERSIONS_DIR / str(release) / release.name
        assert build.pinned_versions(release.module)[build.COMPONENTS[release.name].module] == release.version


def test_the_matrix_runs_every_supported_version() -> None:
    every = {(j, k) for j in SUPPORTED["jobset"].tested for k in SUPPORTED["kueue"].tested}
    assert {(p.jobset, p.kueue) for p in MATRIX} == every - {(PINNED.jobset, PINNED.kueue)}
    assert len(MATRIX) == len(set(MATRIX)) == 8
    assert matrix({"TPUPROV_MATRIX": "jobset-v0.11.1+kueue-v0.18.4"}) == (Pair("v0.11.1", "v0.18.4"),)
    with pytest.raises(ValueError, match="not jobset-<version>"):
        matrix({"TPUPROV_MATRIX": "v0.11.1"})


def test_a_version_nothing_pins_is_refused() -> None:
    assert build.parse_release("kueue-v0.18.4") == build.Release("kueue", "v0.18.4")
    with pytest.raises(ValueError, match="no Go module pins it"):
        build.parse_release("kueue-v0.16.0")
    with pytest.raises(ValueError, match="not jobset-<version> or kueue-<version>"):
        build.parse_release("lws-v0.9.0")


@pytest.mark.skipif(not build.binary("kubebin").exists(), reason="needs kubebin (make kube-bins)")
@pytest.mark.parametrize("name", ["jobset", "kueue"])
def test_the_render_recipe_gives_back_the_pinned_release_files(name: str) -> None:
    release = build.Release(name, build.pinned_release(name))
    go = build.go_command()
    env = {**os.environ, "GOFLAGS": os.environ.get("GOFLAGS", "") + " -mod=readonly"}
    rendered = build.render_manifest(release, build._module_dir(go, release, env), build.binary("kubebin"))
    assert rendered == release.manifest.read_text()
