"""Which JobSet and Kueue versions a ``RealStack`` runs: the pinned pair, or another supported one.

``setup_cluster`` installs another version the way an operator makes it do so: JOBSET_VERSION /
KUEUE_VERSION name the release, JOBSET_SHA256 / KUEUE_SHA256 state its file's hash (nothing is
pinned for it), and MANIFESTS_DIR holds the file. Here the files are the ones ``sandbox.kube.build``
renders from each version's Go module (``build.MANIFESTS_DIR``), and ``ReleaseWiring`` starts the
controller binary of whatever version the installed Deployment deploys.

``MATRIX`` is what ``make test-matrix`` runs: every supported JobSet version with every supported
Kueue version (``shared.setup.support.SUPPORTED``) but the pinned pair. ``TPUPROV_MATRIX`` narrows it:
a comma-separated list of pairs as ``str(Pair)`` spells them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from sandbox.kube import build
from sandbox.stack.config import StackConfig
from shared.setup.manifests import file_sha256
from shared.setup.support import SUPPORTED


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
# Every pair of a supported JobSet and a supported Kueue version but the pinned one (the rest of the
# suite runs that): a user's cluster may hold any of them together (xpk installs Kueue v0.17 beside
# JobSet v0.11, a hand-made cluster anything), and one version's bug may show with one partner only.
MATRIX = tuple(
    Pair(jobset, kueue)
    for jobset in SUPPORTED["jobset"].tested
    for kueue in SUPPORTED["kueue"].tested
    if Pair(jobset, kueue) != PINNED
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
