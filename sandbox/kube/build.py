"""Build the sandbox's real Kubernetes components from their pinned Go modules, once.

Two Go modules of the project pin the components (go.mod) and their bytes (go.sum); three
binaries come out of them into the ignored folder ``sandbox/kube/bin``:

- ``kubebin`` (``sandbox/kube/go``): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
  kwok and kubectl in one binary that dispatches on its first argument (one link instead of six;
  the packages they share are compiled once);
- ``kueue`` (same module): Kueue's upstream main package, built through the module's requirements;
- ``jobset`` (``sandbox/kube/go-jobset``): the JobSet controller's upstream main package. It needs
  a module of its own because Kueue requires a newer JobSet API module, which in one module graph
  would select a newer JobSet controller than the one the product pins.

A stamp next to the binaries records a digest of what decides their bytes (go.mod, go.sum, the
dispatcher's source, the Go version and the flags): a second build with nothing changed returns
at once, and a change to a pinned version rebuilds. Go's default module and build caches are
used, so a machine that built once builds again from cache.

Run it with ``python -m sandbox.kube.build`` (``make kube-bins``).

Other versions of JobSet and Kueue (the supported range that ``make test-matrix`` runs the product
on) are built only on demand, one Go module each under ``sandbox/kube/go-versions/<name>-<version>``
(go.mod and go.sum pin that release and exactly the requirements it declares), into
``sandbox/kube/bin/versions/<name>-<version>/``: the controller binary and the release manifest,
rendered from the module's own kustomize config (``config/default``, the upstream release recipe,
with the bundled kubectl's kustomize), never downloaded. Each has a stamp like the pinned ones.
``python -m sandbox.kube.build --versions kueue-v0.18.4 jobset-v0.11.1`` (or ``--all-versions``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
GO_MODULE = HERE / "go"
JOBSET_MODULE = HERE / "go-jobset"
BIN_DIR = HERE / "bin"
STAMP = BIN_DIR / ".stamp"
# Only 2 cores on the machines this runs on: two compile jobs at once, stripped, path-free binaries.
GO_FLAGS = ("-p", "2", "-trimpath")


@dataclass(frozen=True)
class Target:
    """One binary and the Go package it is built from."""

    binary: str
    package: str
    what: str
    module: Path
    # module whose pinned version the binary reports -> the variables that carry it (-X)
    versions: tuple[tuple[str, tuple[str, ...]], ...] = ()


# A `go build` of a dependency leaves the version variables at their "v0.0.0" placeholders, which the
# API server would then report (and clients compare against): stamp the pinned versions instead.
_KUBE_VERSION_VARS = tuple(
    f"{package}.gitVersion" for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
)


TARGETS = (
    Target(
        "kubebin",
        "./cmd/kubebin",
        "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, kubectl",
        GO_MODULE,
        (("k8s.io/kubernetes", _KUBE_VERSION_VARS),),
    ),
    Target(
        "jobset",
        "sigs.k8s.io/jobset",
        "JobSet controller",
        JOBSET_MODULE,
        (("sigs.k8s.io/jobset", ("sigs.k8s.io/jobset/pkg/version.GitVersion",)),),
    ),
    Target(
        "kueue",
        "sigs.k8s.io/kueue/cmd/kueue",
        "Kueue controller manager",
        GO_MODULE,
        (("sigs.k8s.io/kueue", ("sigs.k8s.io/kueue/pkg/version.GitVersion",)),),
    ),
)


def binary(name: str) -> Path:
    """Path of a built binary (``kubebin``, ``jobset`` or ``kueue``)."""
    return BIN_DIR / name


def pinned_versions(module: Path) -> dict[str, str]:
    """Module -> version as ``module``'s go.mod requires it."""
    found: dict[str, str] = {}
    for line in (module / "go.mod").read_text().splitlines():
        match = re.match(r"^\s*(?:require\s+)?([\w.\-/]+)\s+(v\S+)\s*(?://.*)?$", line)
        if match:
            found.setdefault(match.group(1), match.group(2))
    return found


def ldflags(target: Target) -> str:
    """Strip symbols and debug info (a third of the size), and stamp the pinned versions."""
    versions = pinned_versions(target.module)
    stamps = []
    for module, variables in target.versions:
        version = versions[module]
        stamps += [f"-X {variable}={version}" for variable in variables]
        if module == "k8s.io/kubernetes":
            major, minor = version.lstrip("v").split(".")[:2]
            for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
                stamps += [f"-X {package}.gitMajor={major}", f"-X {package}.gitMinor={minor}"]
                stamps.append(f"-X {package}.gitTreeState=clean")
    return " ".join(["-s", "-w", *stamps])


def go_command() -> str:
    """The ``go`` on PATH, else the standard install location."""
    found = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if found is None:
        raise RuntimeError("go is not installed: the real Kubernetes components are built with it")
    return found


def _go_version(go: str) -> str:
    return subprocess.run([go, "version"], check=True, capture_output=True, text=True).stdout.strip()


def digest(go: str) -> str:
    """What the binaries' bytes depend on: pinned modules, our sources, toolchain and flags."""
    h = hashlib.sha256()
    sources = [m / name for m in (GO_MODULE, JOBSET_MODULE) for name in ("go.mod", "go.sum")]
    for path in sorted([*sources, *GO_MODULE.glob("cmd/**/*.go")]):
        h.update(str(path.relative_to(HERE)).encode())
        h.update(path.read_bytes())
    h.update(_go_version(go).encode())
    h.update(" ".join(GO_FLAGS).encode())
    h.update(" ".join(f"{t.binary}={t.package} {ldflags(t)}" for t in TARGETS).encode())
    return h.hexdigest()


def up_to_date(go: str | None = None) -> bool:
    """Whether every binary exists and was built from the current pins."""
    go = go or go_command()
    if not all(binary(t.binary).exists() for t in TARGETS):
        return False
    try:
        return STAMP.read_text().strip() == digest(go)
    except OSError:
        return False


def build(out: TextIO = sys.stderr) -> bool:
    """Build whatever is not up to date; return True if anything was built.

    Raises RuntimeError with go's output when a build fails.
    """
    go = go_command()
    if up_to_date(go):
        print("[kube-bins] up to date (" + ", ".join(t.binary for t in TARGETS) + ")", file=out)
        return False
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    STAMP.unlink(missing_ok=True)
    env = {**os.environ, "GOFLAGS": os.environ.get("GOFLAGS", "") + " -mod=readonly"}
    for target in TARGETS:
        print(f"[kube-bins] building {target.binary}: {target.what} ...", file=out, flush=True)
        start = time.monotonic()
        result = subprocess.run(
            [
                go,
                "build",
                *GO_FLAGS,
                f"-ldflags={ldflags(target)}",
                "-o",
                str(binary(target.binary)),
                target.package,
            ],
            cwd=target.module,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"go build {target.package} failed:\n{result.stdout}{result.stderr}")
        size = binary(target.binary).stat().st_size / 2**20
        took = time.monotonic() - start
        print(f"[kube-bins] built {target.binary} in {took:.0f}s ({size:.0f} MiB)", file=out, flush=True)
    STAMP.write_text(digest(go) + "\n")
    return True


def ensure_built() -> Path:
    """Build if needed (tests and the harness call this); return the binaries' folder."""
    build()
    return BIN_DIR


# -- other versions (the supported range) ----------------------------------------------------------

VERSION_MODULES = HERE / "go-versions"
VERSIONS_DIR = BIN_DIR / "versions"
# The pinned releases' manifests: offline test data beside the repository, never inside it.
SHARED_MANIFESTS = HERE.parents[2] / "shared" / "manifests"
# One folder holding every version's manifest (symlinks), the MANIFESTS_DIR of a matrix stack.
MANIFESTS_DIR = VERSIONS_DIR / "manifests"
# Extra versions are built beside whatever else runs on these 2 cores: one compile job, one thread.
VERSION_GO_FLAGS = ("-p", "1", "-trimpath")


@dataclass(frozen=True)
class Component:
    """How one add-on is built and released upstream."""

    module: str
    package: str  # its controller's main package
    image: str  # the release image the upstream release sets (Makefile: kustomize edit set image)
    version_var: str


COMPONENTS = {
    "jobset": Component(
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "registry.k8s.io/jobset/jobset",
        "sigs.k8s.io/jobset/pkg/version.GitVersion",
    ),
    "kueue": Component(
        "sigs.k8s.io/kueue",
        "sigs.k8s.io/kueue/cmd/kueue",
        "registry.k8s.io/kueue/kueue",
        "sigs.k8s.io/kueue/pkg/version.GitVersion",
    ),
}
_PINNED_MODULE = {"jobset": JOBSET_MODULE, "kueue": GO_MODULE}


@dataclass(frozen=True, order=True)
class Release:
    """One version of one add-on: ``Release("kueue", "v0.18.4")``."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def pinned(self) -> bool:
        return self.version == pinned_release(self.name)

    @property
    def module(self) -> Path:
        return _PINNED_MODULE[self.name] if self.pinned else VERSION_MODULES / str(self)

    @property
    def folder(self) -> Path:
        return BIN_DIR if self.pinned else VERSIONS_DIR / str(self)

    @property
    def binary(self) -> Path:
        return self.folder / self.name

    @property
    def manifest(self) -> Path:
        """The release manifest (``<name>-<version>.yaml``): the shared copy of a pinned one."""
        return SHARED_MANIFESTS / f"{self}.yaml" if self.pinned else self.folder / f"{self}.yaml"

    @property
    def stamp(self) -> Path:
        return self.folder / ".stamp"


def parse_release(text: str) -> Release:
    """``"kueue-v0.18.4"`` -> Release; ValueError for a name or version nothing builds."""
    name, _, version = text.partition("-")
    if name not in COMPONENTS:
        raise ValueError(f"{text!r}: not jobset-<version> or kueue-<version>")
    release = Release(name, version)
    if not release.pinned and not (release.module / "go.mod").exists():
        known = ", ".join(str(r) for r in releases())
        raise ValueError(f"{text!r}: no Go module pins it in {VERSION_MODULES} (known: {known})")
    return release


def pinned_release(name: str) -> str:
    """The version of ``name`` the pinned modules build (the product's pinned release)."""
    return pinned_versions(_PINNED_MODULE[name])[COMPONENTS[name].module]


def extra_releases() -> tuple[Release, ...]:
    """The other versions a Go module folder pins, sorted."""
    found = []
    for folder in sorted(VERSION_MODULES.glob("*-v*")):
        name, _, version = folder.name.partition("-")
        if name in COMPONENTS and (folder / "go.mod").exists():
            found.append(Release(name, version))
    return tuple(sorted(found, key=_release_key))


def releases(name: str | None = None) -> tuple[Release, ...]:
    """Every version the sandbox can run (pinned and extra), oldest first, optionally of one add-on."""
    pinned = [Release(n, pinned_release(n)) for n in COMPONENTS]
    every = sorted({*pinned, *extra_releases()}, key=_release_key)
    return tuple(r for r in every if name is None or r.name == name)


def _release_key(release: Release) -> tuple[str, tuple[int, ...]]:
    return release.name, tuple(int(part) for part in re.findall(r"\d+", release.version))


def _release_ldflags(release: Release) -> str:
    return f"-s -w -X {COMPONENTS[release.name].version_var}={release.version}"


def release_digest(go: str, release: Release) -> str:
    """What an extra version's binary and manifest depend on (kubebin renders the manifest)."""
    h = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        h.update((release.module / name).read_bytes())
    h.update(_go_version(go).encode())
    recipe = [*VERSION_GO_FLAGS, _release_ldflags(release), COMPONENTS[release.name].image]
    h.update(" ".join(recipe).encode())
    h.update(STAMP.read_bytes() if STAMP.exists() else b"")
    return h.hexdigest()


def release_up_to_date(release: Release, go: str | None = None) -> bool:
    """Whether ``release``'s binary and manifest exist and were built from its current pins."""
    if release.pinned:
        return up_to_date(go) and release.manifest.exists()
    go = go or go_command()
    if not (release.binary.exists() and release.manifest.exists()):
        return False
    try:
        return release.stamp.read_text().strip() == release_digest(go, release)
    except OSError:
        return False


def _module_dir(go: str, release: Release, env: dict[str, str]) -> Path:
    result = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", COMPONENTS[release.name].module],
        cwd=release.module,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"go list -m {COMPONENTS[release.name].module} failed:\n{result.stderr}")
    return Path(result.stdout.strip())


def render_manifest(release: Release, source: Path, kubebin: Path) -> str:
    """The release's ``manifests.yaml`` as upstream renders it: ``kustomize build config/default``
    after ``kustomize edit set image controller=<release image>`` in config/components/manager (the
    Makefiles' release targets of both projects), here with kubebin's kubectl kustomize on a copy of
    the module's config/ (the module cache is read-only). For the pinned versions this reproduces
    the shared release files byte for byte."""
    import yaml  # the sandbox's dependency; the build of the pinned binaries needs none

    with tempfile.TemporaryDirectory(prefix=f"render-{release}-") as tmp:
        config = Path(tmp) / "config"
        shutil.copytree(source / "config", config, copy_function=shutil.copyfile)
        for folder, _, _ in os.walk(config):
            os.chmod(folder, 0o755)
        kustomization = config / "components" / "manager" / "kustomization.yaml"
        doc = yaml.safe_load(kustomization.read_text())
        image = {"name": "controller", "newName": COMPONENTS[release.name].image, "newTag": release.version}
        doc["images"] = [i for i in doc.get("images") or [] if i.get("name") != "controller"] + [image]
        kustomization.write_text(yaml.safe_dump(doc, sort_keys=False))
        result = subprocess.run(
            [str(kubebin), "kubectl", "kustomize", str(config / "default")], capture_output=True, text=True
        )
    if result.returncode != 0:
        raise RuntimeError(f"kustomize of {release} failed:\n{result.stderr}")
    return result.stdout


def build_release(release: Release, out: TextIO = sys.stderr) -> bool:
    """Build an extra version's controller and render its manifest unless its stamp is current
    (the pinned ones: :func:`build`); return True if anything was built."""
    build(out)  # kubebin renders the manifest
    if release.pinned:
        link_manifests()
        return False
    go = go_command()
    if release_up_to_date(release, go):
        print(f"[kube-bins] {release} up to date", file=out)
        link_manifests()
        return False
    release.folder.mkdir(parents=True, exist_ok=True)
    release.stamp.unlink(missing_ok=True)
    env = {
        **os.environ,
        "GOFLAGS": os.environ.get("GOFLAGS", "") + " -mod=readonly",
        "GOMAXPROCS": os.environ.get("GOMAXPROCS", "1"),
    }
    component = COMPONENTS[release.name]
    print(f"[kube-bins] building {release} ({component.package}) ...", file=out, flush=True)
    start = time.monotonic()
    result = subprocess.run(
        [
            go,
            "build",
            *VERSION_GO_FLAGS,
            f"-ldflags={_release_ldflags(release)}",
            "-o",
            str(release.binary),
            component.package,
        ],
        cwd=release.module,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        output = result.stdout + result.stderr
        raise RuntimeError(f"go build {component.package} ({release}) failed:\n{output}")
    took = time.monotonic() - start
    release.manifest.write_text(render_manifest(release, _module_dir(go, release, env), binary("kubebin")))
    size = release.binary.stat().st_size / 2**20
    said = f"[kube-bins] built {release} in {took:.0f}s ({size:.0f} MiB), manifest rendered"
    print(said, file=out, flush=True)
    release.stamp.write_text(release_digest(go, release) + "\n")
    link_manifests()
    return True


def link_manifests() -> Path:
    """:data:`MANIFESTS_DIR`, a symlink per version whose manifest exists (pinned ones included)."""
    MANIFESTS_DIR.mkdir(parents=True, exist_ok=True)
    for release in releases():
        link = MANIFESTS_DIR / release.manifest.name
        if release.manifest.exists() and not link.exists():
            link.unlink(missing_ok=True)  # a dangling link
            link.symlink_to(release.manifest)
    return MANIFESTS_DIR


def ensure_releases(wanted: Iterable[Release]) -> Path:
    """Build whatever of ``wanted`` (and the pinned binaries) is not up to date; return MANIFESTS_DIR."""
    build()
    for release in wanted:
        build_release(release)
    return link_manifests()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rebuild is needed, build nothing")
    parser.add_argument(
        "--versions", nargs="*", default=[], metavar="NAME-VERSION", help="also build these other versions"
    )
    parser.add_argument("--all-versions", action="store_true", help="also build every other version")
    args = parser.parse_args(argv)
    wanted = [*map(parse_release, args.versions)] + (list(extra_releases()) if args.all_versions else [])
    if args.check:
        fresh = up_to_date() and all(release_up_to_date(r) for r in wanted)
        print("[kube-bins] " + ("up to date" if fresh else "out of date"))
        return 0 if fresh else 1
    try:
        build()
        for release in wanted:
            build_release(release)
    except (RuntimeError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
