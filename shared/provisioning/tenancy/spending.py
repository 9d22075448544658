"""Who may spend what: the deployment's stated limit, each tenant's chip budget and reservations.

A pool is bought only within what the operator stated (``Settings.spending_stated``): a total
``CHIP_BUDGET``, per-tenant entries (``TENANTS``: a namespace, the namespaces carrying a label, or
every other namespace), Kueue's quota (``KUEUE_ONLY``), or ``UNLIMITED_SPENDING`` written on
purpose. GKE's node auto-provisioning refuses accelerators without explicit limits for the same
reason: anyone with ``pods/create`` would otherwise buy TPUs up to the project's quota.

A tenant's usage is the chips of the product's pools (not STOPPING) whose owner namespace maps to
its entry: ownership labels are written by the product alone (through GKE), never by a tenant.
Namespace labels (for ``label:KEY=VALUE`` entries) are the cluster administrator's; a tenant may
create objects in its namespace, not relabel it. Each create, adoption and kept idle pool is
charged to the entry the owner's namespace maps to, and the create's Event names it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping

from shared.cloud.ports import KubeAPI
from shared.core.errors import NotFoundError
from shared.core.settings import Settings, TenantEntry
from shared.tpu import catalog
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo, Reservation
from shared.tpu.workloads import WorkloadView

NO_LIMIT_STATED = (
    "this deployment states no spending limit, so nothing is bought: set CHIP_BUDGET, TENANTS, "
    "KUEUE_ONLY=true or UNLIMITED_SPENDING=true"
)


def entry_name(entry: TenantEntry) -> str:
    """How an entry is named in Events and logs: ``TENANTS["team-a"]``."""
    return f'TENANTS["{entry.key}"]'


def pool_chips(pool: NodePoolInfo) -> int:
    """Chips a pool holds (0 for a machine type the catalog does not know)."""
    return (catalog.machine_type_chips(pool.machine_type) or 0) * pool.node_count


def reservation_allowed(entry: TenantEntry, reservation: Reservation, project: str) -> bool:
    """Whether ``entry`` lists ``reservation``: by name, or by its full path (a bare name is in the
    deployment's own project)."""
    if entry.reservations is None:
        return False
    owner = reservation.project or project
    full = f"projects/{owner}/reservations/{reservation.name}"
    for allowed in entry.reservations:
        bare = not allowed.startswith("projects/") and owner == project and allowed == reservation.name
        if allowed == full or bare:
            return True
    return False


@dataclasses.dataclass(frozen=True)
class Account:
    """One budget and what it holds now."""

    name: str  # TENANTS["team-a"], CHIP_BUDGET
    limit: int | None  # chips; None: no chip limit stated for it
    used: int

    def describe(self) -> str:
        limit = "no chip limit" if self.limit is None else f"{self.limit} chips"
        return f"{self.name}: {self.used} chips in use of {limit}"


class Spending:
    """Decides whether a slice may be bought (or a pool kept or adopted) for a namespace, and what
    it is charged to. Reads namespace labels (only for ``label:`` entries), cached for ``ttl``."""

    def __init__(
        self,
        settings: Settings,
        kube: KubeAPI,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.ttl = ttl
        self.clock = clock
        self._labels: dict[str, tuple[float, Mapping[str, str]]] = {}

    # -- which entry -----------------------------------------------------------------------------

    def _namespace_labels(self, namespace: str) -> Mapping[str, str]:
        cached = self._labels.get(namespace)
        if cached is not None and self.clock() - cached[0] < self.ttl:
            return cached[1]
        try:
            found = self.kube.get_namespace_labels(namespace)
        except NotFoundError:
            found = {}
        if len(self._labels) > 1024:
            self._labels.clear()
        self._labels[namespace] = (self.clock(), found)
        return found

    def entry(self, namespace: str) -> TenantEntry | None:
        """The TENANTS entry a namespace spends under: its own, else the first ``label:`` entry whose
        label it carries (in key order), else ``*``; None when TENANTS names none for it."""
        entries = self.settings.tenant_entries
        own = next((e for e in entries if e.key == namespace), None)
        if own is not None:
            return own
        by_label = [e for e in entries if e.label is not None]
        if by_label:
            carried = self._namespace_labels(namespace)
            for entry in by_label:
                key, value = entry.label or ("", "")
                if carried.get(key) == value:
                    return entry
        return next((e for e in entries if e.key == "*"), None)

    # -- usage -----------------------------------------------------------------------------------

    def usage(self, pools: Iterable[NodePoolInfo], exclude: str = "") -> dict[str, int]:
        """Chips held per TENANTS entry key by the product's pools (STOPPING ones are on their way
        out; ``exclude`` names a pool not to count, e.g. the one being adopted)."""
        used: dict[str, int] = {}
        for pool in pools:
            if not pool.managed:
                continue
            if pool.status == STATUS_STOPPING or pool.name == exclude:
                continue
            entry = self.entry(pool.owner.namespace)
            if entry is not None:
                used[entry.key] = used.get(entry.key, 0) + pool_chips(pool)
        return used

    def accounts(self, pools: list[NodePoolInfo]) -> list[Account]:
        """Every budget this deployment states and what it holds (``tpuprov status`` and doctor)."""
        found = []
        if self.settings.chip_budget:
            total = sum(pool_chips(p) for p in pools if p.managed and p.status != STATUS_STOPPING)
            found.append(Account("CHIP_BUDGET", self.settings.chip_budget, total))
        used = self.usage(pools) if self.settings.tenant_entries else {}
        for entry in self.settings.tenant_entries:
            found.append(Account(entry_name(entry), entry.chips, used.get(entry.key, 0)))
        return found

    # -- decisions -------------------------------------------------------------------------------

    def refusal(
        self,
        namespace: str,
        chips: int,
        reservation: Reservation | None,
        pools: list[NodePoolInfo],
        pending: Mapping[str, int] | None = None,
        exclude: str = "",
    ) -> tuple[str, str]:
        """(why ``chips`` more for ``namespace`` may not be held, what they are charged to): the
        refusal is "" when they may. ``pending``: chips already granted in this delivery by entry
        key (a fan-out reserves before it sends); ``exclude``: a pool already held that moves.
        KUEUE_ONLY is checked by the caller against the JobSet's Workload (``kueue_refusal``)."""
        settings = self.settings
        if not settings.spending_stated:
            return NO_LIMIT_STATED, ""
        charged = "UNLIMITED_SPENDING" if settings.unlimited_spending else ""
        if settings.kueue_only:
            charged = "Kueue quota (KUEUE_ONLY)"
        if settings.tenant_entries:
            entry = self.entry(namespace)
            if entry is None:
                return f"namespace {namespace!r} has no entry in TENANTS, so it may spend nothing", ""
            name = entry_name(entry)
            unlisted = self._unlisted(entry, reservation) if reservation is not None else ""
            if unlisted:
                return unlisted, name
            if entry.chips is not None:
                used = self.usage(pools, exclude).get(entry.key, 0) + (pending or {}).get(entry.key, 0)
                if used + chips > entry.chips:
                    return (
                        f"{name} chip budget exceeded: {used} chips held + {chips} requested > {entry.chips}",
                        name,
                    )
            charged = name
        return "", charged or "CHIP_BUDGET"

    def reservation_refusal(self, namespace: str, reservation: Reservation) -> str:
        """Why ``namespace``'s TENANTS entry may not consume ``reservation`` ("" when it may, or when
        no TENANTS is set)."""
        if not self.settings.tenant_entries:
            return ""
        entry = self.entry(namespace)
        if entry is None:
            return f"namespace {namespace!r} has no entry in TENANTS, so it may spend nothing"
        return self._unlisted(entry, reservation)

    def _unlisted(self, entry: TenantEntry, reservation: Reservation) -> str:
        """Why ``entry`` may not consume ``reservation`` ("" when it lists it)."""
        if reservation_allowed(entry, reservation, self.settings.project_id):
            return ""
        listed = ", ".join(entry.reservations or ()) or "none"
        return f"{entry_name(entry)} does not list reservation {reservation.value} (allowed: {listed})"

    def never_holds(self, namespace: str, chips: int) -> str:
        """Why ``namespace`` could never hold ``chips`` more under TENANTS ("" when it could): no idle
        pool is kept for a JobSet of a namespace with no entry, or with a budget below one slice.
        What it holds now is not counted (a pool kept for it would move, not be bought); taking the
        pool is then checked against the whole budget (``Releaser.may_own``)."""
        if not self.settings.tenant_entries:
            return ""
        entry = self.entry(namespace)
        if entry is None:
            return f"namespace {namespace!r} has no entry in TENANTS"
        if entry.chips is not None and entry.chips < chips:
            return f"{entry_name(entry)} allows {entry.chips} chips, less than one slice's {chips}"
        return ""

    def kueue_refusal(self, jobset: JobSet, replicated_job: str) -> str:
        """Under KUEUE_ONLY, why the JobSet's replicated job has no Kueue quota for its slices ("" when
        its Workload holds quota for it): one list of the namespace's Workloads."""
        if not self.settings.kueue_only:
            return ""
        meta = jobset.meta
        try:
            listed = self.kube.list_workloads(meta.namespace)
        except NotFoundError:
            listed = []
        mine = [w for w in listed if w.owner_kind == "JobSet" and w.owner_uid == meta.uid]
        if any(_holds_quota(w, replicated_job) for w in mine):
            return ""
        return (
            f"KUEUE_ONLY is set and JobSet {meta.namespace}/{meta.name} has no Kueue Workload with quota "
            f"reserved for {replicated_job}: submit it to a LocalQueue (kueue.x-k8s.io/queue-name)"
        )


def _holds_quota(workload: WorkloadView, replicated_job: str) -> bool:
    live = workload.active and not workload.has("Finished") and not workload.has("Evicted")
    return live and workload.has("QuotaReserved") and replicated_job in workload.pod_sets
