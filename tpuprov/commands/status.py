"""``tpuprov status``: the managed TPU pools now, who owns them, who runs on them, what they cost."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import Any, cast

from tpuprov.cluster import add_cluster_arguments
from tpuprov.output import add_output_argument


def register(subparsers: Any) -> None:
    """Add the ``status`` subcommand."""
    parser = subparsers.add_parser(
        "status",
        help="managed TPU pools: owner, state, chips, capacity, who runs on them, estimated cost",
        description="List every node pool tpu-provisioner manages on the cluster, with an estimated cost "
        "from a price table (tpuprov/data/prices.yaml; override with --prices or $TPUPROV_PRICES).",
    )
    add_cluster_arguments(parser)
    parser.add_argument(
        "--leaks",
        action="store_true",
        help="only pools the product would delete now but has not (exit 1 when there are any)",
    )
    add_output_argument(parser)
    parser.add_argument("--prices", type=Path, default=None, help="price table (YAML) to estimate costs with")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON); exit 1 when ``--leaks`` finds any, 2 on bad input or when a
    cluster of the fleet could not be read (the others are still shown).

    Without ``--fleet-cluster`` every cluster the deployment serves is shown, one section each; a
    fleet of one prints exactly the single-cluster report."""
    from shared.core.errors import TpuProvError
    from tpuprov import output, status
    from tpuprov.cluster import fleet_clusters, settings_from

    price_file = args.prices or (
        Path(os.environ["TPUPROV_PRICES"]) if os.environ.get("TPUPROV_PRICES") else None
    )
    try:
        prices = status.Prices.load(price_file) if price_file else status.Prices.load()
    except (OSError, ValueError) as exc:
        print(f"tpuprov status: {exc}", file=sys.stderr)
        return 2
    try:
        settings = settings_from(args)
        targets = [settings] if args.fleet_cluster else fleet_clusters(settings)
    except TpuProvError as exc:
        print(f"tpuprov status: {exc.why}", file=sys.stderr)
        return 2
    reports: list[_Report] = []
    for target in targets:
        try:
            reports.append(_Report(target.cluster_path, *_cluster_report(target, prices, args.leaks)))
        except TpuProvError as exc:
            # One cluster's outage or denial hides none of the others' pools.
            prefix = f"{target.cluster_path}: " if len(targets) > 1 else ""
            print(f"tpuprov status: {prefix}{exc.why}", file=sys.stderr)
            reports.append(_Report(target.cluster_path, error=f"could not be read: {exc.why}"))
    if len(reports) == 1:
        [report] = reports
        if report.error:
            return 2
        output.emit(args.output, report.doc, lambda: report.text)
    else:
        fleet = {"clusters": [{"cluster": r.cluster, "error": r.error or None, **r.doc} for r in reports]}
        output.emit(
            args.output,
            fleet,
            lambda: "\n".join(f"== Cluster {r.cluster}\n{r.section}" for r in reports),
        )
    if any(r.error for r in reports):
        return 2
    return 1 if args.leaks and any(r.leaks for r in reports) else 0


@dataclasses.dataclass(frozen=True)
class _Report:
    """One cluster's part of the report; ``error`` says why it could not be read ("" when it was)."""

    cluster: str
    doc: dict[str, Any] = dataclasses.field(default_factory=dict)
    text: str = ""
    leaks: bool = False
    error: str = ""

    @property
    def section(self) -> str:
        """The cluster's text under its heading: the report, or why there is none."""
        return self.text or f"{self.error}\n"


def _cluster_report(settings: Any, prices: Any, leaks_only: bool) -> tuple[dict[str, Any], str, bool]:
    """One cluster's report: its document, its text and whether it has leaks; raises TpuProvError
    when the cluster cannot be read."""
    from shared.cloud.ports import KubeAPI
    from shared.core.errors import TpuProvError
    from shared.provisioning.tenancy.spending import Spending
    from tpuprov import admission, status
    from tpuprov.cluster import ClusterView

    view = ClusterView(settings)
    pools = view.pools()
    # The product's own accounts: the ClusterView answers the two reads Spending makes.
    spent = Spending(view.settings, cast(KubeAPI, view))
    rows = status.pool_rows(
        pools,
        view.jobsets(),
        view.pods(),
        view.nodes(),
        prices,
        datetime.datetime.now(tz=datetime.UTC),
        view.settings,
        jobs=view.jobs(),
        workloads=_workloads(view),
        may_spend=spent.never_holds,
    )
    accounts = spent.accounts(pools)
    if leaks_only:
        rows = [r for r in rows if r.leak]
        return (
            status.document(rows, prices),
            status.render_table(rows, prices, "No leaked TPU node pools."),
            bool(rows),
        )
    doc = status.document(rows, prices)
    doc["spending"] = status.spending_document(accounts, view.settings)
    section = status.spending_section(accounts, view.settings)
    try:
        health, checks = admission_section(view)
    except TpuProvError as exc:  # the pools are still worth showing
        print(f"tpuprov status: could not read the admission check: {exc.why}", file=sys.stderr)
        doc["admission_check"] = None
    else:
        doc["admission_check"] = admission.document(health, checks)
        section += admission.render(health, checks)
    return doc, status.render_table(rows, prices) + section, any(r.leak for r in rows)


def _workloads(view: Any) -> list[Any]:
    """Kueue's Workloads ([] when Kueue is not installed): release keeps a suspended JobSet's pools on
    what their status says, and status shows the same answer."""
    from shared.core.errors import NotFoundError

    try:
        return list(view.list_workloads())
    except NotFoundError:
        return []


def admission_section(view: Any) -> tuple[Any, list[Any]]:
    """The product's AdmissionCheck as doctor reads it, and the Workloads carrying its state."""
    from shared.core.errors import NotFoundError
    from tpuprov import admission
    from tpuprov.doctor.readers import admission_check_view

    name = view.settings.admission_check_name
    seen = admission_check_view(view.objects, name)
    health = admission.CheckHealth(seen.name, seen.exists, seen.active, seen.message, seen.queues)
    try:
        workloads = view.objects.list_objects("kueue.x-k8s.io/v1beta2", "Workload")
    except NotFoundError:
        workloads = []  # Kueue is not installed
    return health, admission.workload_checks(workloads, name)
