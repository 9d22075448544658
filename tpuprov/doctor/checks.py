"""Pure checks of ``tpuprov doctor``: views of what is deployed in, one ``Check`` per line out.

Each failing line says what to run or change; the fix is usually "apply infra/" because Terraform
declares all of it, but the line names the exact resource so it can also be fixed by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shared.setup.manifests import compare_versions
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


def check_addon(view: AddonView, pinned: str) -> Check:
    """The add-on runs at the pinned version and its controller Deployment is Available."""
    name = view.component
    setup = "publish the setup message (tpuprov publish setup --wait 600)"
    if not view.installed:
        return Check(name, False, f"not installed (no Deployment {view.deployment}): {setup}")
    if view.version != pinned:
        order = compare_versions(view.version, pinned)
        if order is not None and order > 0:
            return Check(
                name,
                False,
                f"{view.version} runs, newer than the pinned {pinned}, and setup leaves it alone: set the "
                f"infra variable {view.component}_version to {view.version}, or reinstall {pinned}",
            )
        return Check(name, False, f"{view.version or 'an unknown version'} runs, pinned {pinned}: {setup}")
    if not view.available:
        return Check(
            name,
            False,
            f"{pinned} installed but {view.deployment} is not Available: kubectl describe deployment "
            f"-n {view.deployment.replace('/', ' ')}",
        )
    return Check(name, True, f"{pinned} (pinned), {view.deployment} Available")


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


def check_release_channel(cluster: ClusterInfo) -> Check:
    """What the cluster's release channel means for the pools the product creates."""
    if not cluster.release_channel:
        return Check(
            "release channel",
            True,
            "none: pools are created with auto-upgrade off and never upgrade on their own; upgrade them "
            'between runs (README "Upgrades and running slices")',
        )
    return Check(
        "release channel",
        True,
        f"{cluster.release_channel}: GKE requires auto-upgrade on its node pools, so pools are created with "
        "auto-upgrade and auto-repair on; an upgrade restarts the slice, so protect long runs with a "
        'maintenance exclusion of scope no_minor_or_node_upgrades (README "Upgrades and running slices")',
    )
