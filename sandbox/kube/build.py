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
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rebuild is needed, build nothing")
    args = parser.parse_args(argv)
    if args.check:
        fresh = up_to_date()
        print("[kube-bins] " + ("up to date" if fresh else "out of date"))
        return 0 if fresh else 1
    try:
        build()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
