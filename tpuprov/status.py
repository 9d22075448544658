"""What ``tpuprov status`` shows: one row per managed TPU pool, who owns it, who runs on it, what it costs.

Pure functions over what the adapters return (``NodePoolInfo`` from GKE, JSON dicts from Kubernetes),
so the table and the JSON are tested on fixed inputs and the command only fetches and prints.

What happens next to each pool (``next``/``why``) is the release path's own answer, not a second
opinion: ``releaser.judge`` on the owner, ``occupancy.occupants`` on the nodes, ``occupancy.demand``
for queued JobSets and ``occupancy.decide`` over them, with the settings the CLI reads from its
environment (``RELEASE_GRACE_SECONDS``, ``SUSPEND_GRACE_SECONDS``, ``IDLE_POOL_SECONDS``, ``DRAIN``:
set them as deployed). A pool is a *leak* only when the product would delete it now and has not
started to: a pool GKE is deleting (STOPPING), one inside the release grace and one held idle for a
queued JobSet of its shape are not leaks, so ``--leaks`` can gate a cron job.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.release import occupancy, releaser, verdicts
from shared.provisioning.tenancy import spending
from shared.provisioning.tenancy.ownership import chains_of
from shared.tpu import catalog, drift
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.owners import Job
from shared.tpu.pods import Pod
from shared.tpu.workloads import MULTIKUEUE_ORIGIN_LABEL, WorkloadView
from tpuprov import output

DEFAULT_PRICES = Path(__file__).parent / "data" / "prices.yaml"
# occupancy's decisions as a status column; "deleting" is GKE already deleting the pool.
NEXT = {occupancy.KEEP: "keep", occupancy.ADOPT: "adopt", occupancy.OFFER: "hold", occupancy.DELETE: "delete"}
DELETING = "deleting"


@dataclasses.dataclass(frozen=True)
class Prices:
    """USD (or ``currency``) per chip-hour by generation and capacity type."""

    per_chip_hour: Mapping[str, Mapping[str, float]]
    currency: str = "USD"

    @classmethod
    def load(cls, path: Path = DEFAULT_PRICES) -> Prices:
        """Read a price file (the shape of ``tpuprov/data/prices.yaml``); raises ValueError when malformed."""
        doc = yaml.safe_load(path.read_text()) or {}
        table = doc.get("per_chip_hour")
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise ValueError(f"{path}: per_chip_hour must map generation -> capacity type -> price")
        try:
            clean = {str(g): {str(c): float(p) for c, p in row.items()} for g, row in table.items()}
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: every price must be a number ({exc})") from None
        return cls(clean, str(doc.get("currency", "USD")))

    def per_hour(self, generation: str, capacity: str, chips: int) -> float | None:
        """The hourly price of ``chips`` chips, or None when the table has no such entry."""
        price = self.per_chip_hour.get(generation, {}).get(capacity.split(":", 1)[0])
        return None if price is None else price * chips


@dataclasses.dataclass(frozen=True)
class PoolRow:
    """One managed pool as ``tpuprov status`` reports it."""

    name: str
    owner: str  # namespace/name of the JobSet the pool's labels name
    owner_state: str  # running | suspended | completed | failed | deleting | recreated | gone
    state: str  # the GKE status
    machine_type: str
    nodes: int
    chips: int
    generation: str
    capacity: str  # on-demand | spot | reservation:<name> | flex-start
    zone: str
    age_seconds: float | None
    running: tuple[str, ...]  # namespace/name of each live JobSet with a pod on the pool's nodes
    cost_per_hour: float | None
    cost_so_far: float | None
    leak: bool
    message: str = ""
    handed_over_from: str = ""  # the former owner's name when the pool was adopted instead of deleted
    next: str = "keep"  # keep | adopt | hold | delete | deleting: what the release path does with it now
    why: str = ""  # the release path's reason for ``next``
    # Each setting the pool was built under that the current settings would set otherwise
    # (shared.tpu.drift, "SETTING: pool -> now"); not a leak: REPLACE_DRIFTED_POOLS decides.
    drift: tuple[str, ...] = ()
    # The manager's JobSet (cluster/namespace/name) when Kueue's MultiKueue created the owner JobSet
    # in this worker: the pool is that job's, followed across the fleet.
    dispatched_from: str = ""

    def as_json(self) -> dict[str, Any]:
        """A JSON-safe dict (the ``-o json`` shape, one object per pool)."""
        out = dataclasses.asdict(self)
        out["running"] = list(self.running)
        out["drift"] = list(self.drift)
        return out


def _machine_types() -> dict[str, tuple[str, int]]:
    return {m.name: (a.generation, m.chips) for a in catalog.accelerators() for m in a.machine_types}


def _parse_time(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None


def owner_state(pool: NodePoolInfo, jobset: JobSet | None) -> str:
    """How the pool's owner JobSet stands: release's own answer (``verdicts.owner_state``)."""
    return verdicts.owner_state(pool, jobset)


def capacity_of(pool: NodePoolInfo, node_labels: Iterable[Mapping[str, str]]) -> str:
    """On-demand, spot, flex-start or reservation:<name>[/BLOCK[/SUB_BLOCK]]: what GKE says of the
    pool (the block or sub-block its affinity targets, as the look before buying placed it), else its
    and its nodes' labels (a capacity-policy fallback makes pools of capacity the pods did not select)."""
    if pool.reservation:
        place = f"/{pool.reservation_place}" if pool.reservation_place else ""
        return f"reservation:{pool.reservation}{place}"
    if pool.spot:
        return "spot"
    if pool.flex_start:
        return "flex-start"
    for source in (pool.labels, *node_labels):
        if source.get(labels.RESERVATION_NAME):
            return f"reservation:{source[labels.RESERVATION_NAME]}"
        if str(source.get(labels.SPOT, "")).lower() == "true":
            return "spot"
        if str(source.get(labels.FLEX_START, "")).lower() == "true":
            return "flex-start"
    return "on-demand"


def _demand(
    jobsets: Sequence[JobSet],
    pools: Sequence[NodePoolInfo],
    settings: Settings,
    may_spend: Callable[[str, int], str] | None,
) -> list[occupancy.Demand]:
    # As the releaser: no handover window or drain mode means no pool is held for anyone.
    if settings.idle_pool_seconds <= 0 or settings.drain:
        return []
    return occupancy.demand(jobsets, pools, settings, may_spend)


def fate(
    pool: NodePoolInfo,
    owner: JobSet | None,
    found: Sequence[occupancy.Occupant],
    waiting: Sequence[occupancy.Demand],
    settings: Settings,
    now: datetime.datetime,
    hold: str = "",
) -> tuple[str, str]:
    """What the release path would do with ``pool`` now (a ``NEXT`` value or ``deleting``) and why;
    ``hold``: why a suspended owner's Kueue Workload still needs it (``verdicts.workload_hold``)."""
    if pool.status == STATUS_STOPPING:
        return DELETING, f"GKE is deleting {pool.name}"
    verdict = releaser.judge(pool, owner, settings, now, hold)
    idle = releaser.idle_seconds(pool, owner, settings, now)
    decision = occupancy.decide(pool, verdict, found, waiting, idle or 0.0, settings)
    return NEXT[decision.action], decision.why


def _hold(
    owner: JobSet | None,
    workloads: Sequence[WorkloadView],
    settings: Settings,
    now: datetime.datetime,
) -> str:
    """Why a suspended owner keeps its pools for its Kueue Workload, as release reads it."""
    if owner is None or not owner.suspended:
        return ""
    for workload in workloads:
        if workload.owner_kind == "JobSet" and workload.owner_uid == owner.uid:
            hold = verdicts.workload_hold(workload, settings.admission_check_name, settings, now)
            if hold:
                return hold
    return ""


def pool_rows(
    pools: Sequence[NodePoolInfo],
    jobsets: Sequence[JobSet],
    pods: Sequence[Pod],
    nodes: Sequence[Node],
    prices: Prices,
    now: datetime.datetime,
    settings: Settings,
    jobs: Sequence[Job] = (),
    workloads: Sequence[WorkloadView] = (),
    may_spend: Callable[[str, int], str] | None = None,
) -> list[PoolRow]:
    """One row per managed pool, sorted by owner then name; ``settings`` as the functions are deployed;
    every object as the functions' port returns it (``tpuprov.cluster.ClusterView`` reads them).

    ``jobs``: the batch/v1 Jobs, through which a pod on a pool is proven its JobSet's own (labels
    prove nothing; ``shared.provisioning.tenancy.ownership``), exactly as release decides occupancy;
    ``workloads``: Kueue's, whose status says whether a suspended owner's pools are still needed;
    ``may_spend``: release's ``Spending.never_holds``, so no pool is shown kept for a namespace
    that may not hold it."""
    listed = list(jobsets)
    by_key: dict[tuple[str, str], JobSet | None] = {js.key: js for js in listed}
    node_pool: dict[str, str] = {}
    node_labels: dict[str, list[Mapping[str, str]]] = {}
    pool_nodes: dict[str, list[Node]] = {}
    # GKE's NodePool carries no creation time: a pool's age is its oldest node's, which is also when
    # it started to cost money (a pool without nodes has no VMs to pay for).
    oldest: dict[str, datetime.datetime] = {}
    for node in nodes:
        pool_name = node.pool
        node_pool[node.name] = pool_name
        node_labels.setdefault(pool_name, []).append(node.labels)
        pool_nodes.setdefault(pool_name, []).append(node)
        created = _parse_time(node.created)
        if created and (pool_name not in oldest or created < oldest[pool_name]):
            oldest[pool_name] = created
    # Pods grouped by the pool of their node, so each pool's occupancy looks at its own pods only.
    pool_pods: dict[str, list[Pod]] = {}
    for pod in pods:
        if node_pool.get(pod.node_name):
            pool_pods.setdefault(node_pool[pod.node_name], []).append(pod)
    chains = chains_of(pods, {(j.namespace, j.name): j for j in jobs}, by_key)
    queued: list[occupancy.Demand] | None = None  # listed once, and only when an idle pool needs it
    shapes = _machine_types()
    rows = []
    for pool in pools:
        if not pool.managed:
            continue
        namespace = pool.owner.namespace
        name = pool.owner.name
        owner = by_key.get((namespace, name))
        state = owner_state(pool, owner)
        found = occupancy.occupants(
            pool, pool_nodes.get(pool.name, []), pool_pods.get(pool.name, []), by_key, chains
        )
        if queued is None and not found:
            queued = _demand(listed, pools, settings, may_spend)
        action, why = fate(
            pool, owner, found, queued or [], settings, now, _hold(owner, workloads, settings, now)
        )
        generation, chips_per_vm = shapes.get(pool.machine_type, ("?", 0))
        chips = chips_per_vm * pool.node_count
        capacity = capacity_of(pool, node_labels.get(pool.name, []))
        has_nodes = bool(node_labels.get(pool.name))
        created = oldest.get(pool.name)
        age = (now - created).total_seconds() if created else None
        hourly = prices.per_hour(generation, capacity, chips)
        # A flex-start pool exists before its VMs do: while it has no nodes it waits and costs nothing.
        # Nor does a pool in ERROR without nodes (a stockout left no VMs behind).
        flex_waiting = pool.flex_start and pool.status == "RUNNING" and not has_nodes
        if hourly is not None and (flex_waiting or (pool.status == "ERROR" and not has_nodes)):
            hourly = 0.0
        so_far: float | None = None  # unknown price, or nodes without a creation time
        if hourly is not None and not has_nodes:
            so_far = 0.0  # no VMs, nothing paid yet
        elif hourly is not None and age is not None:
            so_far = round(hourly * age / 3600, 2)
        on_it = tuple(sorted({o.describe() for o in found}))
        rows.append(
            PoolRow(
                name=pool.name,
                owner=f"{namespace}/{name}",
                owner_state=state,
                state="WAITING" if flex_waiting else pool.status,
                machine_type=pool.machine_type,
                nodes=len(node_labels.get(pool.name, [])) if pool.flex_start else pool.node_count,
                chips=chips,
                generation=generation,
                capacity=capacity,
                zone=",".join(pool.node_locations),
                age_seconds=age,
                running=on_it,
                cost_per_hour=None if hourly is None else round(hourly, 2),
                cost_so_far=so_far,
                leak=action == NEXT[occupancy.DELETE],
                message=pool.status_message,
                handed_over_from=pool.labels.get(labels.HANDED_OVER_FROM, ""),
                next=action,
                why=why,
                drift=tuple(d.describe() for d in drift.drift(pool, drift.expected_spec(settings, pool))),
                dispatched_from=_dispatched_from(owner, settings),
            )
        )
    return sorted(rows, key=lambda r: (r.owner, r.name))


def _dispatched_from(owner: JobSet | None, settings: Settings) -> str:
    """Where a JobSet MultiKueue created in this worker came from: Kueue gives it the manager
    JobSet's namespace and name and its origin label (``jobset_multikueue_adapter.go``)."""
    if owner is None or MULTIKUEUE_ORIGIN_LABEL not in owner.meta.labels:
        return ""
    manager = settings.multikueue_manager.rsplit("/", 1)[-1] or "the manager"
    return f"{manager}/{owner.namespace}/{owner.name}"


def totals(rows: Sequence[PoolRow]) -> dict[str, Any]:
    """Pools, nodes, chips, cost per hour and so far, and leaks, over ``rows``."""
    return {
        "pools": len(rows),
        "nodes": sum(r.nodes for r in rows),
        "chips": sum(r.chips for r in rows),
        "cost_per_hour": round(sum(r.cost_per_hour or 0.0 for r in rows), 2),
        "cost_so_far": round(sum(r.cost_so_far or 0.0 for r in rows), 2),
        "leaks": sum(1 for r in rows if r.leak),
    }


def _age(seconds: float | None) -> str:
    # kubectl's AGE style: the two largest units; "-" for a pool without nodes (no age to tell)
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    days, hours, minutes = s // 86400, s % 86400 // 3600, s % 3600 // 60
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m{s % 60}s" if minutes else f"{s}s"


def _money(value: float | None, currency: str) -> str:
    return "?" if value is None else f"{value:,.2f}" if currency == "USD" else f"{value:,.2f} {currency}"


def render_table(rows: Sequence[PoolRow], prices: Prices, empty: str = "No managed TPU node pools.") -> str:
    """The kubectl-style table with a totals line, then why each pool not simply in use is where it is;
    the ``empty`` line when there is nothing."""
    if not rows:
        return f"{empty}\n"
    header = (
        "POOL",
        "OWNER",
        "OWNER-STATE",
        "STATE",
        "NEXT",
        "MACHINE x NODES",
        "CHIPS",
        "CAPACITY",
        "ZONE",
        "AGE",
        "RUNNING",
        f"{prices.currency}/H",
        f"{prices.currency} SO FAR",
    )
    body = [
        (
            r.name + (" (leak)" if r.leak else ""),
            r.owner
            + (f" (from {r.handed_over_from})" if r.handed_over_from else "")
            + (f" (MultiKueue: {r.dispatched_from})" if r.dispatched_from else ""),
            r.owner_state,
            r.state,
            r.next,
            f"{r.machine_type} x {r.nodes}",
            str(r.chips),
            r.capacity,
            r.zone or "-",
            _age(r.age_seconds),
            ",".join(r.running) or "-",
            _money(r.cost_per_hour, prices.currency),
            _money(r.cost_so_far, prices.currency),
        )
        for r in rows
    ]
    sums = totals(rows)
    leaks = f"{sums['leaks']} leak" + ("" if sums["leaks"] == 1 else "s")
    money = (_money(sums["cost_per_hour"], prices.currency), _money(sums["cost_so_far"], prices.currency))
    nodes = f"{sums['nodes']} nodes"
    body.append(("TOTAL", "", "", "", "", nodes, str(sums["chips"]), "", "", "", leaks, *money))
    # A running owner keeping its pool needs no explanation; every other pool says why it is kept,
    # held, handed over or deleted.
    notes = [f"{r.name}: {r.next}: {r.why}\n" for r in rows if (r.next, r.owner_state) != ("keep", "running")]
    # Built under settings that have since changed: said apart from the release path's answer.
    notes += [f"{r.name}: drift: {'; '.join(r.drift)}\n" for r in rows if r.drift]
    return output.table(header, body) + ("\n" + "".join(notes) if notes else "")


def spending_section(accounts: Sequence[spending.Account], settings: Settings) -> str:
    """Who may spend what and what each budget holds now (the product's own accounts)."""
    if not settings.spending_stated:
        return f"\nSpending: {spending.NO_LIMIT_STATED}.\n"
    lines = [f"  {a.describe()}" for a in accounts]
    if settings.unlimited_spending:
        lines.append("  UNLIMITED_SPENDING: stated on purpose")
    if settings.kueue_only:
        lines.append("  KUEUE_ONLY: only JobSets whose Kueue Workload holds quota")
    return "\nSpending:\n" + "\n".join(lines) + "\n"


def spending_document(accounts: Sequence[spending.Account], settings: Settings) -> dict[str, Any]:
    """The spending section as JSON."""
    return {
        "stated": settings.spending_stated,
        "unlimited": settings.unlimited_spending,
        "kueue_only": settings.kueue_only,
        "accounts": [{"budget": a.name, "limit": a.limit, "used": a.used} for a in accounts],
    }


def document(rows: Sequence[PoolRow], prices: Prices) -> dict[str, Any]:
    """``-o json|yaml``: the rows, the totals and the currency."""
    return {"currency": prices.currency, "pools": [r.as_json() for r in rows], "totals": totals(rows)}


def render_json(rows: Sequence[PoolRow], prices: Prices) -> str:
    """``-o json``, as the command prints it."""
    return output.dumps(document(rows, prices), "json")
