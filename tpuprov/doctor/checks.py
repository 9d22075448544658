"""Pure checks of ``tpuprov doctor``: views of what is deployed in, one ``Check`` per line out.

Each failing line says what to run or change; the fix is usually "apply infra/" because Terraform
declares all of it, but the line names the exact resource so it can also be fixed by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shared.core.settings import Settings
from shared.setup.support import (
    DOWNGRADE,
    KEEP_NEWER,
    KEEP_UNKNOWN,
    SAME,
    UPGRADE,
    plan,
    support,
)
from shared.tpu.nodepools import ClusterInfo
from tpuprov.doctor.views import (
    PUBLISHER_ROLE,
    AddonView,
    AdmissionCheckView,
    Expected,
    ReachView,
    RoleView,
    SinkView,
    SubscriptionView,
)

APPLY = "apply infra/ (terraform apply)"


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it holds, and what is fine or to fix."""

    name: str
    ok: bool
    detail: str


def check_apis(expected: Expected, enabled: frozenset[str]) -> list[Check]:
    """Every service the product calls or is delivered through is enabled."""
    return [
        Check(f"api {api}", True, "enabled")
        if api in enabled
        else Check(
            f"api {api}", False, f"disabled: gcloud services enable {api} --project {expected.project}"
        )
        for api in expected.apis()
    ]


def check_role(expected: Expected, view: RoleView) -> Check:
    """The role bound to a function's service account grants exactly what its code reaches."""
    name, account = f"role {view.function}", expected.service_account(view.function)
    if not view.exists:
        return Check(name, False, f"{view.role} does not exist (or is deleted): {APPLY}")
    if not view.bound:
        return Check(name, False, f"{view.role} is not granted to {account}: {APPLY}")
    wanted = expected.roles.get(view.function)
    if wanted is None:  # a predefined role (setup_cluster's roles/container.admin): bound is enough
        return Check(name, True, f"{view.role} granted to {account}")
    missing = sorted(set(wanted) - view.permissions)
    extra = sorted(view.permissions - set(wanted))
    problems = []
    if missing:
        problems.append(
            f"lacks {', '.join(missing)}, which its code calls (infra/roles.json lists "
            f"{'them' if len(missing) > 1 else 'it'}): {APPLY} to update the role"
        )
    if extra:
        problems.append(f"also holds {', '.join(extra)}, which no code path calls: {APPLY} to drop them")
    if problems:
        return Check(name, False, f"{view.role} " + "; ".join(problems))
    return Check(name, True, f"{view.role} holds exactly the {len(wanted)} permissions its code calls")


def check_reservation_reads(
    expected: Expected, project: str, reservations: Sequence[str], held: Mapping[str, frozenset[str]]
) -> Check:
    """The functions that create pools may read the shared ``reservations`` of ``project``: they
    read each one (its blocks and sub-blocks too) before buying on it, checked there."""
    name = f"reservation reads {project}"
    wanted = sorted(p for p in expected.roles.get("provision", ()) if p.startswith("compute.reservation"))
    problems = []
    for function, permissions in held.items():
        missing = [p for p in wanted if p not in permissions and f"{p.split('.', 1)[0]}.*" not in permissions]
        if missing:
            problems.append(f"{function} lacks {', '.join(missing)}")
    where = ", ".join(reservations)
    if problems:
        return Check(
            name,
            False,
            f"{'; '.join(problems)} in {project}, which owns {where}: every create on it is refused "
            f"and redelivered until then; add {project} to reservation_projects in infra and apply",
        )
    return Check(name, True, f"{' and '.join(held)} may read {where} ({', '.join(wanted)})")


def _dead_letter_problems(expected: Expected, sub: SubscriptionView, dead_letter: str) -> list[str]:
    if not sub.dead_letter_topic:
        return [f"{sub.name} has no dead-letter policy: failed messages are redelivered forever; {APPLY}"]
    if sub.dead_letter_topic != dead_letter:
        return [f"{sub.name} dead-letters to {sub.dead_letter_topic}, not {dead_letter}: {APPLY}"]
    return []


def check_wiring(
    expected: Expected,
    topics: frozenset[str],
    subscriptions: Sequence[SubscriptionView],
    urls: Mapping[str, str],
) -> list[Check]:
    """Per function: its topic and dead-letter topic exist, a subscription delivers the topic to the
    function's service with a dead-letter policy to the right topic, and dead letters are kept."""
    by_name = {sub.name: sub for sub in subscriptions}
    checks = []
    for wiring in expected.functions:
        topic, dead_letter = wiring.topic(expected.prefix), wiring.dead_letter_topic(expected.prefix)
        service, url = expected.service(wiring.function), urls.get(wiring.function, "")
        endpoint = f"{url}/{expected.topic_path(topic)}"
        problems = [f"topic {t} does not exist: {APPLY}" for t in (topic, dead_letter) if t not in topics]
        if not url:
            problems.append(f"Cloud Run service {service} not found: {APPLY}")
        if expected.delivery == "eventarc":
            # Eventarc creates and names the subscription itself: find the one pushing to the service.
            feeding = [
                s for s in subscriptions if s.topic == topic and url and s.push_endpoint.startswith(url)
            ]
            sub = feeding[0] if feeding else None
            if sub is None:
                problems.append(f"no subscription of {topic} pushes to {service}: {APPLY} (Eventarc trigger)")
        else:
            sub = by_name.get(wiring.subscription(expected.prefix))
            if sub is None:
                problems.append(
                    f"subscription {wiring.subscription(expected.prefix)} does not exist: {APPLY}"
                )
            elif sub.topic != topic:
                problems.append(f"{sub.name} reads {sub.topic}, not {topic}: {APPLY}")
            elif url and sub.push_endpoint != endpoint:
                problems.append(
                    f"{sub.name} pushes to {sub.push_endpoint or '(pull)'}, not to {service} "
                    f"({endpoint}): {APPLY}"
                )
        if sub is not None:
            problems.extend(_dead_letter_problems(expected, sub, dead_letter))
        keeper = wiring.dead_letter_subscription(expected.prefix)
        if keeper not in by_name:
            problems.append(f"subscription {keeper} does not exist, so dead letters are dropped: {APPLY}")
        if problems:
            checks.append(Check(f"pubsub {wiring.function}", False, "; ".join(problems)))
            continue
        assert sub is not None
        checks.append(
            Check(
                f"pubsub {wiring.function}",
                True,
                f"{topic} -> {sub.name} -> {service}; dead letters to {dead_letter} after "
                f"{sub.max_delivery_attempts} attempts, kept in {keeper}",
            )
        )
    return checks


def check_sinks(
    expected: Expected, sinks: Sequence[SinkView], publishers: Mapping[str, frozenset[str]]
) -> list[Check]:
    """Each log sink exists, exports to its function's topic, and its writer identity may publish there."""
    by_name = {sink.name: sink for sink in sinks}
    waiting = {w.function: w.topic(expected.prefix) for w in expected.functions}
    checks = []
    for file_name, function in expected.sinks.items():
        name, topic = expected.sink_name(file_name), waiting[function]
        sink = by_name.get(name)
        if sink is None:
            checks.append(Check(f"sink {name}", False, f"does not exist: {APPLY}"))
        elif sink.topic != topic:
            checks.append(
                Check(
                    f"sink {name}", False, f"exports to {sink.topic or '(not a topic)'}, not {topic}: {APPLY}"
                )
            )
        elif sink.writer_identity not in publishers.get(topic, frozenset()):
            checks.append(
                Check(
                    f"sink {name}",
                    False,
                    f"its writer identity {sink.writer_identity} cannot publish to {topic}, so the sink "
                    f"exports nothing: gcloud pubsub topics add-iam-policy-binding {topic} --project "
                    f"{expected.project} --member={sink.writer_identity} --role={PUBLISHER_ROLE} "
                    f"(or {APPLY})",
                )
            )
        else:
            checks.append(
                Check(
                    f"sink {name}", True, f"-> {topic}; {sink.writer_identity} may publish ({PUBLISHER_ROLE})"
                )
            )
    return checks


def check_reach(view: ReachView) -> Check:
    """The cluster's API answers the function's identity through the configured endpoint."""
    name = "cluster reachable"
    if view.error:
        via = f" through the {view.endpoint} endpoint" if view.endpoint else ""
        return Check(name, False, f"as {view.function}{via}: {view.error}")
    return Check(name, True, f"as {view.function} through the {view.endpoint} endpoint")


def check_addon(view: AddonView, pinned: str, upgrade: str = KEEP_NEWER) -> Check:
    """The add-on runs a supported version (``shared.setup.support``) that setup keeps as it is
    (the pinned one, or a newer one with ADDON_UPGRADE=keep-newer), and its Deployment is Available.
    The line names the installed version and whether it is supported."""
    name = view.component
    setup = "publish the setup message (tpuprov publish setup --wait 600)"
    if not view.installed:
        return Check(name, False, f"not installed (no Deployment {view.deployment}): {setup}")
    running = view.version or "an unknown version"
    said = support(view.component, view.version).detail
    action = plan(view.version, pinned, upgrade)
    if action == UPGRADE:
        return Check(
            name, False, f"{running} runs ({said}), older than the pinned {pinned}: {setup} to upgrade it"
        )
    if action == DOWNGRADE:
        return Check(
            name,
            False,
            f"{running} runs ({said}), newer than the pinned {pinned}; ADDON_UPGRADE=pinned replaces it with "
            f"{pinned}: {setup}",
        )
    if action == KEEP_UNKNOWN:
        return Check(
            name,
            False,
            f"{running} runs ({said}), and setup leaves a build it cannot place alone: replace it with a "
            f"release in the supported range, or delete Deployment {view.deployment} and {setup} to "
            f"install {pinned}",
        )
    if not support(view.component, view.version).supported:
        return Check(
            name,
            False,
            f"{running} runs ({said}), newer than the pinned {pinned}, and setup leaves it alone: set "
            f"ADDON_UPGRADE=pinned and {setup} to install {pinned}",
        )
    kept = " (pinned)"
    if action != SAME:
        kept = f", newer than the pinned {pinned}, kept (ADDON_UPGRADE={upgrade})"
    if not view.available:
        return Check(
            name,
            False,
            f"{running}{kept} installed but {view.deployment} is not Available: kubectl describe deployment "
            f"-n {view.deployment.replace('/', ' ')}",
        )
    return Check(name, True, f"{running}{kept}, {said}; {view.deployment} Available")


def check_admission_check(view: AdmissionCheckView) -> Check:
    """The product's Kueue admission check: unused, or Active for the ClusterQueues that use it."""
    name = "admission check"
    queues = ", ".join(view.queues)
    if not view.exists and not view.queues:
        return Check(
            name, True, f"{view.name} not used: queued JobSets get their slices by the pending-pod path"
        )
    if not view.exists:
        return Check(
            name,
            False,
            f"ClusterQueue(s) {queues} name AdmissionCheck {view.name}, which does not exist, so Kueue "
            "admits nothing there: apply a queue configuration with tpuSlicesCheck (tpuprov publish kueue)",
        )
    if not view.active:
        return Check(
            name,
            False,
            f"{view.name} is not Active ({view.message}), so Kueue keeps ClusterQueue(s) {queues or '-'} "
            "inactive: the reconcile function keeps it Active; check that it runs (Cloud Scheduler) and can "
            "reach the cluster, or remove tpuSlicesCheck from the queue configuration",
        )
    return Check(name, True, f"{view.name} Active for ClusterQueue(s) {queues or '-'}")


def check_spending(settings: Settings) -> Check:
    """Who may spend what, as the provision function is deployed: fails when nothing is stated (then
    provision buys nothing at all)."""
    name = "spending"
    if not settings.spending_stated:
        return Check(
            name,
            False,
            "no spending limit stated, so provision buys nothing: set chip_budget, tenants, kueue_only or "
            f"unlimited_spending and {APPLY}",
        )
    said = []
    if settings.unlimited_spending:
        said.append("UNLIMITED_SPENDING (stated on purpose)")
    if settings.kueue_only:
        said.append("KUEUE_ONLY: Kueue's ClusterQueue quotas")
    if settings.chip_budget:
        said.append(f"CHIP_BUDGET {settings.chip_budget} chips in all")
    for entry in settings.tenant_entries:
        chips = "no chip limit" if entry.chips is None else f"{entry.chips} chips"
        reservations = ", ".join(entry.reservations) if entry.reservations else "no reservation"
        said.append(f'TENANTS["{entry.key}"]: {chips}, {reservations}')
    if settings.tenant_entries and not any(e.key == "*" for e in settings.tenant_entries):
        said.append("any other namespace: nothing")
    if settings.namespace_allowlist:
        said.append(f"only namespaces {', '.join(settings.namespace_allowlist)}")
    return Check(name, True, "; ".join(said))


def check_release_channel(cluster: ClusterInfo) -> Check:
    """What the cluster's release channel means for the pools the product creates."""
    if not cluster.release_channel:
        return Check(
            "release channel",
            True,
            "none: pools are created with auto-upgrade off and never upgrade on their own; upgrade them "
            'between runs (docs/functions.md "Upgrades and running slices")',
        )
    return Check(
        "release channel",
        True,
        f"{cluster.release_channel}: GKE requires auto-upgrade on its node pools, so pools are created with "
        "auto-upgrade and auto-repair on; an upgrade restarts the slice, so protect long runs with a "
        "maintenance exclusion of scope no_minor_or_node_upgrades "
        '(docs/functions.md "Upgrades and running slices")',
    )
