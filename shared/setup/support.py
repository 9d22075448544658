"""The JobSet and Kueue versions the product supports on a user's cluster, and what setup does there.

Users' clusters often have both add-ons already (xpk installs Kueue v0.17 and JobSet v0.11). The
supported range is a set of minor lines, each tested on the real components at one patch
(``make test-matrix``: the tutorial flow, the admission check and the handover on JobSet x Kueue
pairs; docs/sandbox.md):

* JobSet v0.10, v0.11, v0.12, tested at v0.10.1 (pinned), v0.11.1 and v0.12.0. The product uses
  ``jobset.x-k8s.io/v1alpha2``, the only version every one of them serves.
* Kueue v0.17, v0.18, v0.19, tested at v0.17.1, v0.18.4 and v0.19.2 (pinned): the latest patch of
  each line the Go module proxy served when the range was set. The product uses only
  ``kueue.x-k8s.io/v1beta2`` (``shared.cloud.kube.KUEUE_PATH``, ``shared.kueue``); every CRD of each
  of them serves v1beta2 (and stores it) beside a deprecated v1beta1
  (``config/components/crd/bases`` of sigs.k8s.io/kueue at those tags). Kueue v0.20, which stops
  serving v1beta1, was not served by the proxy, so it is untested and outside the range.

What ``setup_cluster`` does with an installed version is :func:`plan`'s answer, by ADDON_UPGRADE:
``keep-newer`` (the default) upgrades an older one to the pinned release in place and leaves a newer
one alone, ``pinned`` also replaces a newer one with the pinned release.
"""

from __future__ import annotations

import dataclasses

from shared.core.settings import ADDON_UPGRADE_MODES
from shared.setup.manifests import compare_versions, parse_version

KEEP_NEWER, PINNED = ADDON_UPGRADE_MODES

# What setup does with one component (shared.setup.installer reports these).
INSTALL = "installed"
UPGRADE = "upgraded"
DOWNGRADE = "downgraded"
SAME = "unchanged"
KEEP_NEWER_ACTION = "skipped-newer"
KEEP_UNKNOWN = "skipped-unknown"


@dataclasses.dataclass(frozen=True)
class SupportedRange:
    """Minor lines of one add-on the product supports, and the patch each was tested at."""

    component: str
    tested: tuple[str, ...]  # oldest first, one per minor line

    @property
    def lines(self) -> tuple[str, ...]:
        """``("v0.17", "v0.18", "v0.19")``."""
        return tuple(_line(v) for v in self.tested)

    def describe(self) -> str:
        """``v0.17-v0.19``."""
        return f"{self.lines[0]}-{self.lines[-1]}"


SUPPORTED = {
    "jobset": SupportedRange("jobset", ("v0.10.1", "v0.11.1", "v0.12.0")),
    "kueue": SupportedRange("kueue", ("v0.17.1", "v0.18.4", "v0.19.2")),
}


def _line(version: str) -> str:
    parsed = parse_version(version)
    return f"v{parsed[0]}.{parsed[1]}" if parsed else ""


@dataclasses.dataclass(frozen=True)
class Support:
    """Whether one installed version is in the supported range, and the words for it."""

    supported: bool
    tested: bool  # exactly a tested patch
    detail: str


def support(component: str, version: str) -> Support:
    """Is ``version`` of ``component`` ("jobset" | "kueue") supported?"""
    known = SUPPORTED[component]
    if parse_version(version) is None:
        return Support(False, False, f"unsupported: not a release version (supported: {known.describe()})")
    if version in known.tested:
        return Support(True, True, f"supported: tested, in the range {known.describe()}")
    line = _line(version)
    if line in known.lines:
        patch = known.tested[known.lines.index(line)]
        return Support(True, False, f"supported: the {line} line, tested at {patch}")
    side = "older" if (compare_versions(version, known.tested[0]) or 0) < 0 else "newer"
    return Support(False, False, f"unsupported: {side} than the range {known.describe()}")


def plan(found: str, pinned: str, mode: str = KEEP_NEWER) -> str:
    """What setup does with a component found at ``found`` ("" = absent) when ``pinned`` is the
    release it ships: one of the action names above."""
    if not found:
        return INSTALL
    order = compare_versions(found, pinned)
    if order is None:
        return KEEP_UNKNOWN  # a build nobody can place (a mirror's tag, "main"): never replaced
    if order < 0:
        return UPGRADE
    if order > 0:
        return DOWNGRADE if mode == PINNED else KEEP_NEWER_ACTION
    return SAME
