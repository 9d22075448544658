"""Run every check against a ``Deployment`` and render the report (``-o table|json|yaml``).

An adapter call that fails (no permission to read, an API down) becomes a failing line naming the
section and the reason; the other sections still run, so one report shows everything to fix.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from shared.core.errors import TpuProvError
from shared.core.settings import Settings
from shared.setup.manifests import JOBSET, KUEUE
from shared.tpu import capacity
from tpuprov import output
from tpuprov.doctor.checks import (
    Check,
    check_addon,
    check_admission_check,
    check_apis,
    check_reach,
    check_release_channel,
    check_reservation_reads,
    check_role,
    check_sinks,
    check_spending,
    check_wiring,
)
from tpuprov.doctor.views import Deployment, Expected

# The identity the reachability check acts as: provision is the first to reach a new cluster.
REACH_AS = "provision"


def _section(name: str, run: Callable[[], list[Check]]) -> list[Check]:
    try:
        return run()
    except TpuProvError as exc:
        return [Check(name, False, f"could not read: {exc.why}")]


def _role(deployment: Deployment, expected: Expected, function: str) -> list[Check]:
    return [check_role(expected, deployment.role(function))]


def fleet_of(deployment: Deployment, settings: Settings) -> tuple[str, ...]:
    """The clusters the deployment serves, as its provision function decides them (the managed
    cluster, FLEET_CLUSTERS, then the clusters of FLEET_PROJECTS that GKE lists with FLEET_LABEL
    now); just ``settings``' cluster when the deployed settings cannot be read (the spending
    section says why)."""
    from tpuprov.cluster import fleet_cluster_paths

    try:
        deployed = Settings.from_env(deployment.function_env("provision"))
    except TpuProvError:
        return (settings.cluster_path,)
    if deployed.cluster_path != settings.cluster_path:
        return (settings.cluster_path,)  # another deployment's view: check what was asked for
    # The operator's endpoints (a sandbox's emulator) list the labelled clusters, as status does.
    listing = deployed.with_overrides(
        gke_api_endpoint=settings.gke_api_endpoint, emulator_access_token=settings.emulator_access_token
    )
    return tuple(fleet_cluster_paths(listing))


def _named(checks: list[Check], cluster: str) -> list[Check]:
    """``checks`` with the fleet cluster's name after each check's."""
    name = cluster.rsplit("/", 1)[-1]
    return [dataclasses.replace(c, name=f"{c.name} ({name})") for c in checks]


def diagnose(deployment: Deployment, expected: Expected, settings: Settings, only: str = "") -> list[Check]:
    """Every check of the deployment, in report order. For a fleet, the cluster checks (its sinks,
    reachability, add-ons, admission check, release channel) run for each fleet cluster, each
    line naming the cluster; ``only`` (a fleet cluster's name or path) keeps one."""
    fleet = fleet_of(deployment, settings)
    chosen = [p for p in fleet if not only or only in (p, p.rsplit("/", 1)[-1])]
    if not chosen:
        raise TpuProvError(f"{only} is not a cluster of this deployment's fleet ({', '.join(fleet)})")
    checks = _section("apis", lambda: check_apis(expected, deployment.enabled_services()))
    functions = [
        *expected.roles,
        *(w.function for w in expected.functions if w.function not in expected.roles),
    ]
    for function in functions:
        checks += _section(f"role {function}", functools.partial(_role, deployment, expected, function))

    def wiring() -> list[Check]:
        urls = {w.function: deployment.function_url(w.function) for w in expected.functions}
        return check_wiring(expected, deployment.topics(), deployment.subscriptions(), urls)

    checks += _section("pubsub", wiring)
    checks += _section("reservation reads", lambda: reservation_read_checks(deployment, expected))
    for path in chosen:
        if len(fleet) == 1:
            checks += _cluster_checks(deployment, expected, settings)
        else:
            target = deployment if path == settings.cluster_path else deployment.at(path)
            checks += _named(_cluster_checks(target, expected, settings), path)
    checks += _section(
        "spending", lambda: [check_spending(Settings.from_env(deployment.function_env("provision")))]
    )
    return checks


# The functions that buy pools read a reservation before buying on it (infra/iam.tf node_pool_creators).
RESERVATION_READERS = ("provision", "reconcile")


def reservation_read_checks(deployment: Deployment, expected: Expected) -> list[Check]:
    """For each other project owning a reservation of the deployed CAPACITY_POLICY: whether the
    pool-creating functions may read it there (none when the policy names no shared one)."""
    try:
        deployed = Settings.from_env(deployment.function_env("provision"))
    except TpuProvError:
        return []  # the spending section says why the deployed settings cannot be read
    owners: dict[str, list[str]] = {}
    for option in capacity.parse_policy(deployed.capacity_policy) if deployed.capacity_policy else ():
        reservation = option.reservation
        if reservation is not None and reservation.project and reservation.project != deployed.project_id:
            owners.setdefault(reservation.project, []).append(reservation.base)
    return [
        check_reservation_reads(
            expected,
            project,
            reservations,
            {f: deployment.held_in(project, f) for f in RESERVATION_READERS},
        )
        for project, reservations in sorted(owners.items())
    ]


def _cluster_checks(deployment: Deployment, expected: Expected, settings: Settings) -> list[Check]:
    """What holds for one cluster: the sinks exporting its entries, reaching it as a function,
    its JobSet and Kueue, the admission check and its release channel."""

    def sinks() -> list[Check]:
        found = deployment.sinks()
        topics = {sink.topic for sink in found if sink.topic}
        return check_sinks(expected, found, {t: deployment.topic_publishers(t) for t in topics})

    checks = _section("sinks", sinks)
    checks += _section("cluster reachable", lambda: [check_reach(deployment.reach(REACH_AS))])
    upgrade = settings.addon_upgrade
    checks += _section(
        "jobset", lambda: [check_addon(deployment.addon(JOBSET), settings.jobset_version, upgrade)]
    )
    checks += _section(
        "kueue", lambda: [check_addon(deployment.addon(KUEUE), settings.kueue_version, upgrade)]
    )
    checks += _section(
        "admission check",
        lambda: [check_admission_check(deployment.admission_check(settings.admission_check_name))],
    )
    checks += _section("release channel", lambda: [check_release_channel(deployment.cluster())])
    return checks


def document(checks: list[Check]) -> dict[str, object]:
    """The JSON/YAML form."""
    return {
        "ok": all(c.ok for c in checks),
        "checks": [{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
    }


def render_table(checks: list[Check]) -> str:
    """One line per check; a last line counts the failures."""
    rows = [(c.name, "OK" if c.ok else "FAIL", c.detail) for c in checks]
    failed = sum(not c.ok for c in checks)
    verdict = "All checks passed." if not failed else f"{failed} of {len(checks)} checks failed."
    return output.table(("CHECK", "RESULT", "DETAIL"), rows) + f"\n{verdict}\n"


def exit_code(checks: list[Check]) -> int:
    """0 when everything holds, 1 otherwise."""
    return 0 if all(c.ok for c in checks) else 1
