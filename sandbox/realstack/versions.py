"""Which JobSet and Kueue versions a ``RealStack`` runs: the pinned pair, or another supported one.

``setup_cluster`` installs another version the way an operator makes it do so: JOBSET_VERSION /
KUEUE_VERSION name the release, JOBSET_SHA256 / KUEUE_SHA256 state its file's hash (nothing is
pinned for it), and MANIFESTS_DIR holds the file. Here the files are the ones ``sandbox.kube.build``
renders from each version's Go module (``build.MANIFESTS_DIR``), and ``ReleaseWiring`` starts the
controller binary of whatever version the installed Deployment deploys.

``MATRIX`` is what ``make test-matrix`` runs: each supported JobSet version and each supported
Kueue version at least once (``shared.setup.support.SUPPORTED``). ``TPUPROV_MATRIX`` narrows it:
a comma-separated list of pairs as ``str(Pair)`` spells them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from sandbox.kube import build
from sandbox.stack.config import StackConfig
from shared.setup.manifests import file_sha256


@dataclasses.dataclass(frozen=True)
class Pair:
    """A JobSet version and a Kueue version run together."""

    jobset: str
    kueue: str

    def __str__(self) -> str:
        return f"jobset-{self.jobset}+kueue-{self.kueue}"

    @property
    def releases(self) -> tuple[build.Release, build.Release]:
        return build.Release("jobset", self.jobset), build.Release("kueue", self.kueue)

    def ensure_built(self) -> None:
        """Build both controllers and render both manifests unless their stamps are current."""
        build.ensure_releases(self.releases)

    def function_env(self) -> dict[str, str]:
        """What setup_cluster is deployed with to install this pair (after :meth:`ensure_built`)."""
        env = {"MANIFESTS_DIR": str(build.MANIFESTS_DIR)}
        for release in self.releases:
            env[f"{release.name.upper()}_VERSION"] = release.version
            if not release.pinned:
                env[f"{release.name.upper()}_SHA256"] = file_sha256(release.manifest)
        return env

    def config(self, base: StackConfig) -> StackConfig:
        """``base`` with setup_cluster installing this pair."""
        self.ensure_built()
        env: Mapping[str, str] = {**base.function_env, **self.function_env()}
        return dataclasses.replace(base, manifests_dir=build.MANIFESTS_DIR, function_env=env)


PINNED = Pair(build.pinned_release("jobset"), build.pinned_release("kueue"))
# Every supported JobSet and Kueue version once, none of them with its pinned partner (the rest of
# the suite runs the pinned pair): the oldest with the oldest, and so on.
MATRIX = (
    Pair("v0.10.1", "v0.17.1"),
    Pair("v0.11.1", "v0.18.4"),
    Pair("v0.12.0", "v0.19.2"),
)


def matrix(env: Mapping[str, str] | None = None) -> tuple[Pair, ...]:
    """:data:`MATRIX`, or the pairs ``TPUPROV_MATRIX`` names."""
    chosen = (os.environ if env is None else env).get("TPUPROV_MATRIX", "").strip()
    if not chosen:
        return MATRIX
    pairs = []
    for text in chosen.split(","):
        jobset, _, kueue = text.strip().partition("+")
        if not jobset.startswith("jobset-") or not kueue.startswith("kueue-"):
            raise ValueError(f"TPUPROV_MATRIX entry {text!r} is not jobset-<version>+kueue-<version>")
        pairs.append(Pair(jobset.removeprefix("jobset-"), kueue.removeprefix("kueue-")))
    return tuple(pairs)
