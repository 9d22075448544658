"""Run every check against a ``Deployment`` and render the report (``-o table|json|yaml``).

An adapter call that fails (no permission to read, an API down) becomes a failing line naming the
section and the reason; the other sections still run, so one report shows everything to fix.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from shared.core.errors import TpuProvError
from shared.core.settings import Settings
from shared.setup.manifests import JOBSET, KUEUE
from tpuprov import output
from tpuprov.doctor.checks import (
    Check,
    check_addon,
    check_admission_check,
    check_apis,
    check_reach,
    check_release_channel,
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


def diagnose(deployment: Deployment, expected: Expected, settings: Settings) -> list[Check]:
    """Every check of the deployment, in report order."""
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

    def sinks() -> list[Check]:
        found = deployment.sinks()
        topics = {sink.topic for sink in found if sink.topic}
        return check_sinks(expected, found, {t: deployment.topic_publishers(t) for t in topics})

    checks += _section("pubsub", wiring)
    checks += _section("sinks", sinks)
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
    checks += _section(
        "spending", lambda: [check_spending(Settings.from_env(deployment.function_env("provision")))]
    )
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
