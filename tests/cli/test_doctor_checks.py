"""``tpuprov doctor``'s pure checks and the production adapter's parsing: whole-object table tests.

Each case is the views one deployment yields and the exact ``Check`` lines doctor prints for them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from google.cloud.logging_v2.types import LogSink
from google.iam.v1 import policy_pb2
from google.pubsub_v1.types import Subscription

from shared.core.settings import Settings
from shared.tpu.nodepools import ClusterInfo
from tpuprov.doctor.checks import (
    APPLY,
    Check,
    check_addon,
    check_apis,
    check_reach,
    check_release_channel,
    check_reservation_reads,
    check_role,
    check_sinks,
    check_spending,
    check_wiring,
)
from tpuprov.doctor.google import enabled_names, role_view, sink_view
from tpuprov.doctor.readers import publishers_in, subscription_view
from tpuprov.doctor.run import reservation_read_checks
from tpuprov.doctor.views import (
    AddonView,
    Expected,
    ReachView,
    RoleView,
    SinkView,
    SubscriptionView,
    function_roles,
)

E = Expected("p")
RELEASE = function_roles()["release"]
ROLE = "projects/p/roles/tpuprov_release"
SA = "tpuprov-release@p.iam.gserviceaccount.com"
WRITER = "serviceAccount:service-1@gcp-sa-logging.iam.gserviceaccount.com"


def test_the_packaged_roles_are_infra_roles_json() -> None:
    import json
    from pathlib import Path

    infra = json.loads((Path(__file__).parents[2] / "infra" / "roles.json").read_text())
    assert function_roles() == {f: tuple(p) for f, p in infra.items()}


@pytest.mark.parametrize(
    ("expected", "enabled", "failing"),
    [
        (E, {"container", "compute", "run", "pubsub", "logging"}, []),
        (E, {"container", "run", "pubsub", "logging"}, ["compute"]),
        (
            dataclasses.replace(E, delivery="eventarc"),
            {"container", "compute", "run", "pubsub", "logging"},
            ["eventarc"],
        ),
    ],
    ids=["all", "compute-off", "eventarc-delivery-needs-eventarc"],
)
def test_apis(expected: Expected, enabled: set[str], failing: list[str]) -> None:
    checks = check_apis(expected, frozenset(f"{s}.googleapis.com" for s in enabled))
    assert [c.name for c in checks if not c.ok] == [f"api {s}.googleapis.com" for s in failing]
    for s in failing:
        assert (
            Check(
                f"api {s}.googleapis.com",
                False,
                f"disabled: gcloud services enable {s}.googleapis.com --project p",
            )
            in checks
        )


@pytest.mark.parametrize(
    ("view", "want"),
    [
        (
            RoleView("release", ROLE, True, frozenset(RELEASE), True),
            Check(
                "role release", True, f"{ROLE} holds exactly the {len(RELEASE)} permissions its code calls"
            ),
        ),
        (
            RoleView("release", ROLE, True, frozenset(RELEASE) - {"container.nodes.update"}, True),
            Check(
                "role release",
                False,
                f"{ROLE} lacks container.nodes.update, which its code calls (infra/roles.json lists it): "
                f"{APPLY} to update the role",
            ),
        ),
        (
            RoleView("release", ROLE, True, frozenset(RELEASE) | {"container.nodePools.create"}, True),
            Check(
                "role release",
                False,
                f"{ROLE} also holds container.nodePools.create, which no code path "
                f"calls: {APPLY} to drop them",
            ),
        ),
        (
            RoleView("release", ROLE, False, frozenset(), True),
            Check("role release", False, f"{ROLE} does not exist (or is deleted): {APPLY}"),
        ),
        (
            RoleView("release", ROLE, True, frozenset(RELEASE), False),
            Check("role release", False, f"{ROLE} is not granted to {SA}: {APPLY}"),
        ),
        (
            RoleView("setup_cluster", "roles/container.admin", True, frozenset(), True),
            Check(
                "role setup_cluster",
                True,
                "roles/container.admin granted to tpuprov-setup@p.iam.gserviceaccount.com",
            ),
        ),
    ],
    ids=["exact", "missing", "extra", "no-role", "unbound", "setup-predefined"],
)
def test_role(view: RoleView, want: Check) -> None:
    assert check_role(E, view) == want


def _healthy_subscriptions() -> list[SubscriptionView]:
    subs = []
    for w in E.functions:
        subs.append(
            SubscriptionView(
                w.subscription(),
                w.topic(),
                f"https://{E.service(w.function)}-x.a.run.app/projects/p/topics/{w.topic()}",
                w.dead_letter_topic(),
                10,
            )
        )
        subs.append(SubscriptionView(w.dead_letter_subscription(), w.dead_letter_topic(), "", "", 0))
    return subs


TOPICS = frozenset(t for w in E.functions for t in (w.topic(), w.dead_letter_topic()))
URLS = {w.function: f"https://{E.service(w.function)}-x.a.run.app" for w in E.functions}


def _release_line(
    subs: list[SubscriptionView], topics: frozenset[str] = TOPICS, urls: dict[str, str] = URLS
) -> Check:
    return next(c for c in check_wiring(E, topics, subs, urls) if c.name == "pubsub release")


def _replace(subs: list[SubscriptionView], name: str, **changes: Any) -> list[SubscriptionView]:
    return [dataclasses.replace(s, **changes) if s.name == name else s for s in subs]


def test_wiring_of_a_healthy_deployment() -> None:
    checks = check_wiring(E, TOPICS, _healthy_subscriptions(), URLS)
    assert all(c.ok for c in checks) and len(checks) == 5
    assert _release_line(_healthy_subscriptions()) == Check(
        "pubsub release",
        True,
        "tpuprov-jobset-lifecycle -> tpuprov-release-push -> tpuprov-release; dead letters to "
        "tpuprov-jobset-lifecycle-dead-letter after 10 attempts, kept in "
        "tpuprov-jobset-lifecycle-dead-letter-pull",
    )


@pytest.mark.parametrize(
    ("subs", "topics", "urls", "detail"),
    [
        (
            [s for s in _healthy_subscriptions() if s.name != "tpuprov-release-push"],
            TOPICS,
            URLS,
            f"subscription tpuprov-release-push does not exist: {APPLY}",
        ),
        (
            _replace(_healthy_subscriptions(), "tpuprov-release-push", dead_letter_topic=""),
            TOPICS,
            URLS,
            "tpuprov-release-push has no dead-letter policy: failed messages are redelivered forever; "
            f"{APPLY}",
        ),
        (
            _replace(_healthy_subscriptions(), "tpuprov-release-push", dead_letter_topic="other"),
            TOPICS,
            URLS,
            f"tpuprov-release-push dead-letters to other, not tpuprov-jobset-lifecycle-dead-letter: {APPLY}",
        ),
        (
            _replace(_healthy_subscriptions(), "tpuprov-release-push", push_endpoint="https://old.example/x"),
            TOPICS,
            URLS,
            "tpuprov-release-push pushes to https://old.example/x, not to tpuprov-release "
            f"(https://tpuprov-release-x.a.run.app/projects/p/topics/tpuprov-jobset-lifecycle): {APPLY}",
        ),
        (
            _healthy_subscriptions(),
            TOPICS - {"tpuprov-jobset-lifecycle-dead-letter"},
            URLS,
            f"topic tpuprov-jobset-lifecycle-dead-letter does not exist: {APPLY}",
        ),
        (
            _healthy_subscriptions(),
            TOPICS,
            {**URLS, "release": ""},
            f"Cloud Run service tpuprov-release not found: {APPLY}",
        ),
        (
            [s for s in _healthy_subscriptions() if s.name != "tpuprov-jobset-lifecycle-dead-letter-pull"],
            TOPICS,
            URLS,
            "subscription tpuprov-jobset-lifecycle-dead-letter-pull does not exist, so dead letters are "
            f"dropped: {APPLY}",
        ),
    ],
    ids=[
        "no-subscription",
        "no-dead-letter",
        "wrong-dead-letter",
        "pushes-elsewhere",
        "no-dlq-topic",
        "no-service",
        "no-keeper",
    ],
)
def test_wiring_faults(
    subs: list[SubscriptionView], topics: frozenset[str], urls: dict[str, str], detail: str
) -> None:
    assert _release_line(subs, topics, urls) == Check("pubsub release", False, detail)


def test_eventarc_delivery_finds_the_trigger_subscription_by_its_push_target() -> None:
    e = dataclasses.replace(E, delivery="eventarc")
    subs = [
        dataclasses.replace(s, name=f"eventarc-us-central1-{s.name}") if s.name.endswith("-push") else s
        for s in _healthy_subscriptions()
    ]
    assert all(c.ok for c in check_wiring(e, TOPICS, subs, URLS))


SINK = "tpuprov-jobset-lifecycle"


@pytest.mark.parametrize(
    ("sinks", "publishers", "want"),
    [
        (
            [SinkView(SINK, "tpuprov-jobset-lifecycle", WRITER)],
            {"tpuprov-jobset-lifecycle": frozenset({WRITER})},
            Check(
                f"sink {SINK}",
                True,
                f"-> tpuprov-jobset-lifecycle; {WRITER} may publish (roles/pubsub.publisher)",
            ),
        ),
        (
            [SinkView(SINK, "tpuprov-jobset-lifecycle", WRITER)],
            {"tpuprov-jobset-lifecycle": frozenset()},
            Check(
                f"sink {SINK}",
                False,
                f"its writer identity {WRITER} cannot publish to tpuprov-jobset-lifecycle, so the sink "
                "exports nothing: gcloud pubsub topics add-iam-policy-binding tpuprov-jobset-lifecycle "
                f"--project p --member={WRITER} --role=roles/pubsub.publisher (or {APPLY})",
            ),
        ),
        ([], {}, Check(f"sink {SINK}", False, f"does not exist: {APPLY}")),
        (
            [SinkView(SINK, "", WRITER)],
            {},
            Check(f"sink {SINK}", False, f"exports to (not a topic), not tpuprov-jobset-lifecycle: {APPLY}"),
        ),
    ],
    ids=["granted", "grant-missing", "no-sink", "not-pubsub"],
)
def test_sinks(sinks: list[SinkView], publishers: dict[str, frozenset[str]], want: Check) -> None:
    assert next(c for c in check_sinks(E, sinks, publishers) if c.name == want.name) == want


K = "kueue-system/kueue-controller-manager"
J = "jobset-system/jobset-controller-manager"
SETUP = "publish the setup message (tpuprov publish setup --wait 600)"
TESTED_KUEUE = "supported: tested, in the range v0.17-v0.19"


@pytest.mark.parametrize(
    ("view", "pinned", "upgrade", "want"),
    [
        (
            AddonView("kueue", K, True, "v0.19.2", True),
            "v0.19.2",
            "keep-newer",
            Check("kueue", True, f"v0.19.2 (pinned), {TESTED_KUEUE}; {K} Available"),
        ),
        (
            AddonView("kueue", K, False, "", False),
            "v0.19.2",
            "keep-newer",
            Check("kueue", False, f"not installed (no Deployment {K}): {SETUP}"),
        ),
        (
            AddonView("kueue", K, True, "v0.18.0", True),
            "v0.19.2",
            "keep-newer",
            Check(
                "kueue",
                False,
                "v0.18.0 runs (supported: the v0.18 line, tested at v0.18.4), older than the pinned v0.19.2: "
                f"{SETUP} to upgrade it",
            ),
        ),
        (
            AddonView("kueue", K, True, "v0.16.0", True),
            "v0.19.2",
            "keep-newer",
            Check(
                "kueue",
                False,
                "v0.16.0 runs (unsupported: older than the range v0.17-v0.19), older than the pinned "
                f"v0.19.2: {SETUP} to upgrade it",
            ),
        ),
        (
            AddonView("kueue", K, True, "v0.20.0", True),
            "v0.19.2",
            "keep-newer",
            Check(
                "kueue",
                False,
                "v0.20.0 runs (unsupported: newer than the range v0.17-v0.19), newer than the pinned "
                f"v0.19.2, and setup leaves it alone: set ADDON_UPGRADE=pinned and {SETUP} to install "
                "v0.19.2",
            ),
        ),
        (
            AddonView("jobset", J, True, "v0.11.1", True),
            "v0.10.1",
            "keep-newer",
            Check(
                "jobset",
                True,
                "v0.11.1, newer than the pinned v0.10.1, kept (ADDON_UPGRADE=keep-newer), supported: tested, "
                f"in the range v0.10-v0.12; {J} Available",
            ),
        ),
        (
            AddonView("jobset", J, True, "v0.11.1", True),
            "v0.10.1",
            "pinned",
            Check(
                "jobset",
                False,
                "v0.11.1 runs (supported: tested, in the range v0.10-v0.12), newer than the pinned v0.10.1; "
                f"ADDON_UPGRADE=pinned replaces it with v0.10.1: {SETUP}",
            ),
        ),
        (
            AddonView("jobset", J, True, "main", True),
            "v0.10.1",
            "pinned",
            Check(
                "jobset",
                False,
                "main runs (unsupported: not a release version (supported: v0.10-v0.12)), and setup leaves a "
                "build it cannot place alone: replace it with a release in the supported range, or delete "
                f"Deployment {J} and {SETUP} to install v0.10.1",
            ),
        ),
        (
            AddonView("jobset", J, True, "v0.10.1", False),
            "v0.10.1",
            "keep-newer",
            Check(
                "jobset",
                False,
                f"v0.10.1 (pinned) installed but {J} is not Available: "
                "kubectl describe deployment -n jobset-system jobset-controller-manager",
            ),
        ),
    ],
    ids=[
        "ok",
        "absent",
        "older",
        "older-unsupported",
        "newer-unsupported",
        "newer-kept",
        "newer-pinned",
        "unknown",
        "unavailable",
    ],
)
def test_addon(view: AddonView, pinned: str, upgrade: str, want: Check) -> None:
    assert check_addon(view, pinned, upgrade) == want


def test_addon_defaults_to_keep_newer() -> None:
    assert check_addon(AddonView("jobset", J, True, "v0.12.0", True), "v0.10.1").ok


def test_reach() -> None:
    assert check_reach(ReachView("provision", "dns gke-1.us-east5.gke.goog", "")) == Check(
        "cluster reachable", True, "as provision through the dns gke-1.us-east5.gke.goog endpoint"
    )
    assert check_reach(
        ReachView("provision", "", "cluster c offers no usable control-plane endpoint")
    ) == Check("cluster reachable", False, "as provision: cluster c offers no usable control-plane endpoint")


def test_release_channel_says_what_it_means_for_pools() -> None:
    enrolled = check_release_channel(ClusterInfo("c", "l", "", "", release_channel="REGULAR"))
    assert enrolled.ok and enrolled.detail.startswith("REGULAR: GKE requires auto-upgrade on its node pools")
    assert "no_minor_or_node_upgrades" in enrolled.detail
    none = check_release_channel(ClusterInfo("c", "l", "", ""))
    assert none.ok and none.detail.startswith("none: pools are created with auto-upgrade off")


# -- the production adapter's parsing of Google's answers -----------------------------------------


def test_service_usage_page() -> None:
    page = {
        "services": [
            {
                "name": "projects/123/services/container.googleapis.com",
                "config": {"name": "container.googleapis.com"},
                "state": "ENABLED",
            },
            {"name": "projects/123/services/pubsub.googleapis.com", "state": "ENABLED"},
        ],
        "nextPageToken": "x",
    }
    assert enabled_names(page) == ["container.googleapis.com", "pubsub.googleapis.com"]


@pytest.mark.parametrize(
    ("answer", "policy", "want"),
    [
        (
            {"name": ROLE, "includedPermissions": ["a", "b"]},
            {"bindings": [{"role": ROLE, "members": [f"serviceAccount:{SA}"]}]},
            RoleView("release", ROLE, True, frozenset({"a", "b"}), True),
        ),
        (
            {"name": ROLE, "includedPermissions": ["a"], "deleted": True},
            {"bindings": []},
            RoleView("release", ROLE, False, frozenset({"a"}), False),
        ),
        (
            None,
            {"bindings": [{"role": ROLE, "members": ["user:x@example.com"]}]},
            RoleView("release", ROLE, False, frozenset(), False),
        ),
    ],
    ids=["bound", "deleted", "absent"],
)
def test_role_view(answer: dict[str, Any] | None, policy: dict[str, Any], want: RoleView) -> None:
    assert role_view("release", ROLE, answer, policy, f"serviceAccount:{SA}") == want


def test_sink_and_subscription_and_policy_protos() -> None:
    sink = LogSink(
        name=SINK,
        destination="pubsub.googleapis.com/projects/p/topics/tpuprov-jobset-lifecycle",
        writer_identity=WRITER,
    )
    assert sink_view(sink) == SinkView(SINK, "tpuprov-jobset-lifecycle", WRITER)
    bucket = LogSink(name="b", destination="logging.googleapis.com/projects/p/locations/global/buckets/b")
    assert sink_view(bucket).topic == ""
    sub = Subscription(
        name="projects/p/subscriptions/tpuprov-release-push",
        topic="projects/p/topics/tpuprov-jobset-lifecycle",
        push_config={"push_endpoint": "https://r/projects/p/topics/tpuprov-jobset-lifecycle"},
        dead_letter_policy={"dead_letter_topic": "projects/p/topics/d", "max_delivery_attempts": 10},
    )
    assert subscription_view(sub) == SubscriptionView(
        "tpuprov-release-push",
        "tpuprov-jobset-lifecycle",
        "https://r/projects/p/topics/tpuprov-jobset-lifecycle",
        "d",
        10,
    )
    policy = policy_pb2.Policy(
        bindings=[
            policy_pb2.Binding(role="roles/pubsub.publisher", members=[WRITER]),
            policy_pb2.Binding(role="roles/pubsub.viewer", members=["user:x"]),
        ]
    )
    assert publishers_in(policy) == frozenset({WRITER})


@pytest.mark.parametrize(
    ("env", "ok", "detail"),
    [
        ({}, False, "no spending limit stated, so provision buys nothing"),
        ({"UNLIMITED_SPENDING": "true"}, True, "UNLIMITED_SPENDING (stated on purpose)"),
        ({"CHIP_BUDGET": "512"}, True, "CHIP_BUDGET 512 chips in all"),
        ({"KUEUE_ONLY": "true"}, True, "KUEUE_ONLY: Kueue's ClusterQueue quotas"),
        (
            {"TENANTS": '{"team-a": {"chips": 256, "reservations": ["res-a"]}, "label:team=ml": {}}'},
            True,
            'TENANTS["label:team=ml"]: no chip limit, no reservation; TENANTS["team-a"]: 256 chips, res-a; '
            "any other namespace: nothing",
        ),
    ],
    ids=["nothing-stated", "unlimited", "budget", "kueue-only", "tenants"],
)
def test_doctor_says_who_may_spend_what(env: dict[str, str], ok: bool, detail: str) -> None:
    check = check_spending(Settings.from_env({"PROJECT_ID": "p", **env}))
    assert (check.name, check.ok) == ("spending", ok)
    assert detail in check.detail


def test_doctor_names_the_project_whose_shared_reservation_the_functions_cannot_read() -> None:
    reads = (
        "compute.reservationBlocks.list",
        "compute.reservationSubBlocks.list",
        "compute.reservations.get",
    )
    held = {"provision": frozenset(reads), "reconcile": frozenset({"compute.reservations.get"})}
    check = check_reservation_reads(Expected("p"), "owner-proj", ["projects/owner-proj/reservations/r"], held)
    assert (check.name, check.ok) == ("reservation reads owner-proj", False)
    assert check.detail == (
        "reconcile lacks compute.reservationBlocks.list, compute.reservationSubBlocks.list in owner-proj, "
        "which owns projects/owner-proj/reservations/r: every create on it is refused and redelivered "
        "until then; add owner-proj to reservation_projects in infra and apply"
    )
    granted = check_reservation_reads(
        Expected("p"), "owner-proj", ["projects/owner-proj/reservations/r"], {"provision": frozenset(reads)}
    )
    assert granted.ok and granted.detail.startswith("provision may read projects/owner-proj/reservations/r")


class _Owners:
    """A deployment whose provision runs with ``policy`` and whose functions hold ``held`` anywhere."""

    def __init__(self, policy: str, held: frozenset[str]) -> None:
        self.policy, self.held = policy, held
        self.asked: list[tuple[str, str]] = []

    def function_env(self, function: str) -> dict[str, str]:
        return {"PROJECT_ID": "p", "UNLIMITED_SPENDING": "true", "CAPACITY_POLICY": self.policy}

    def held_in(self, project: str, function: str) -> frozenset[str]:
        self.asked.append((project, function))
        return self.held


def test_doctor_checks_each_project_owning_a_reservation_of_the_deployed_policy() -> None:
    policy = "reservation:projects/owner-proj/reservations/r1, reservation:local, spot"
    deployment = _Owners(policy, frozenset({"compute.*"}))
    [check] = reservation_read_checks(deployment, Expected("p"))  # type: ignore[arg-type]
    assert (check.name, check.ok) == ("reservation reads owner-proj", True)
    # Only the pool-creating functions, only in the owner project: the local reservation is home.
    assert deployment.asked == [("owner-proj", "provision"), ("owner-proj", "reconcile")]
    assert reservation_read_checks(_Owners("spot", frozenset()), Expected("p")) == []  # type: ignore[arg-type]
