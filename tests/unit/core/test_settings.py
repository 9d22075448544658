"""Settings parsing: the occupancy/handover knobs, the spending statements and the setup clusters."""

from __future__ import annotations

import json

import pytest

from shared.core.errors import InvalidInputError
from shared.core.settings import Settings, TenantEntry


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (1, 120)),
        ({"CORDON_SETTLE_SECONDS": "0", "IDLE_POOL_SECONDS": "0"}, (0, 0)),
        ({"CORDON_SETTLE_SECONDS": "30", "IDLE_POOL_SECONDS": "3600"}, (30, 3600)),
    ],
    ids=["defaults", "off", "maxima"],
)
def test_occupancy_settings_parse(env: dict[str, str], expected: tuple[int, int]) -> None:
    settings = Settings.from_env(env)
    assert (settings.cordon_settle_seconds, settings.idle_pool_seconds) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORDON_SETTLE_SECONDS": "31"}, "CORDON_SETTLE_SECONDS=31 must be <= 30"),
        ({"IDLE_POOL_SECONDS": "7200"}, "IDLE_POOL_SECONDS=7200 must be <= 3600"),
        ({"IDLE_POOL_SECONDS": "-1"}, "IDLE_POOL_SECONDS=-1 must be >= 0"),
        ({"CORDON_SETTLE_SECONDS": "soon"}, "is not an integer"),
    ],
    ids=["settle-too-long", "idle-too-long", "negative", "not-a-number"],
)
def test_occupancy_settings_refuse_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Settings.from_env(env)


# --- stating the spending: TENANTS, KUEUE_ONLY, UNLIMITED_SPENDING ------------------------------


def test_tenants_parse_into_entries_in_key_order() -> None:
    raw = (
        '{"team-a": {"chips": 64, "reservations": ["res-a", "projects/shared-proj/reservations/res-b"]},'
        ' "*": {"chips": 0}, "label:cost-center=42": {"reservations": []},'
        ' "team-b": {"chips": 8, "reservations": null}}'
    )
    settings = Settings.from_env({"TENANTS": raw})
    assert settings.tenants == raw
    assert settings.tenant_entries == (
        TenantEntry("*", chips=0),
        TenantEntry("label:cost-center=42", reservations=()),
        TenantEntry("team-a", 64, ("res-a", "projects/shared-proj/reservations/res-b")),
        # Terraform's jsonencode writes an unset optional attribute as null: the same as omitted.
        TenantEntry("team-b", 8, None),
    )
    assert settings.tenant_entries[1].label == ("cost-center", "42")
    assert settings.tenant_entries[2].label is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "setting TENANTS is not JSON"),
        ('["team-a"]', "setting TENANTS must be a JSON object, not a JSON list"),
        ('{"Team_A": {}}', 'setting TENANTS["Team_A"]: the key is a namespace'),
        ('{"label:team": {}}', 'setting TENANTS["label:team"]: a label entry is label:KEY=VALUE'),
        ('{"label:-bad=x": {}}', "TENANTS[\"label:-bad=x\"]: label key '-bad' has an invalid name part"),
        ('{"label:team=a b": {}}', "label value 'a b' is not a valid Kubernetes label value"),
        ('{"team-a": 8}', 'setting TENANTS["team-a"] must be an object'),
        (
            '{"team-a": {"cpus": 8}}',
            'setting TENANTS["team-a"]: unknown field "cpus" (allowed: chips, reservations)',
        ),
        ('{"team-a": {"chips": -1}}', 'setting TENANTS["team-a"].chips: -1 is not a whole number >= 0'),
        ('{"team-a": {"chips": 2.5}}', 'setting TENANTS["team-a"].chips: 2.5 is not'),
        ('{"team-a": {"chips": true}}', 'setting TENANTS["team-a"].chips: True is not'),
        ('{"team-a": {"chips": "8"}}', 'setting TENANTS["team-a"].chips: "8" is not'),
        ('{"team-a": {"reservations": "res-a"}}', 'setting TENANTS["team-a"].reservations must be a list'),
        (
            '{"team-a": {"reservations": ["Res_A"]}}',
            'TENANTS["team-a"].reservations: "Res_A" is not a reservation',
        ),
        ('{"team-a": {"reservations": ["projects/p/reservations/r"]}}', "is not a reservation name"),
        ('{"team-a": {"reservations": [3]}}', 'TENANTS["team-a"].reservations: 3 is not a reservation'),
    ],
    ids=[
        "not-json",
        "not-an-object",
        "bad-namespace",
        "label-without-value",
        "bad-label-key",
        "bad-label-value",
        "entry-not-an-object",
        "unknown-field",
        "negative-chips",
        "fractional-chips",
        "boolean-chips",
        "string-chips",
        "reservations-not-a-list",
        "bad-reservation",
        "bad-shared-reservation-project",
        "reservation-not-a-string",
    ],
)
def test_bad_tenants_are_refused_naming_the_entry(raw: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as refused:
        Settings.from_env({"TENANTS": raw})
    assert message in refused.value.why


def test_a_long_tenant_key_is_quoted_back_short() -> None:
    with pytest.raises(InvalidInputError) as refused:
        Settings(tenants='{"' + "X" * 5000 + '": {}}')
    assert len(refused.value.why) < 200


@pytest.mark.parametrize(
    ("env", "stated"),
    [
        ({}, False),
        ({"CHIP_BUDGET": "0", "TENANTS": "{}", "KUEUE_ONLY": "false", "UNLIMITED_SPENDING": "false"}, False),
        ({"CHIP_BUDGET": "512"}, True),
        ({"TENANTS": '{"team-a": {"chips": 0}}'}, True),
        ({"TENANTS": '{"*": {}}'}, True),
        ({"KUEUE_ONLY": "true"}, True),
        ({"UNLIMITED_SPENDING": "true"}, True),
    ],
    ids=["nothing", "all-off", "chip-budget", "tenant", "wildcard-tenant", "kueue-only", "unlimited"],
)
def test_spending_is_stated_by_any_of_the_four(env: dict[str, str], stated: bool) -> None:
    settings = Settings.from_env(env)
    assert settings.spending_stated is stated
    assert (Settings().kueue_only, Settings().unlimited_spending, Settings().tenants) == (False, False, "")


# --- which clusters setup_cluster may install on ------------------------------------------------


def test_setup_clusters_are_the_managed_one_and_the_listed_ones() -> None:
    settings = Settings.from_env(
        {
            "PROJECT_ID": "p",
            "LOCATION": "us-central2-b",
            "CLUSTER_NAME": "c",
            "SETUP_CLUSTERS": (
                "projects/p/locations/us-east5/clusters/d, projects/p/locations/us-central2-b/clusters/c"
            ),
        }
    )
    assert settings.setup_cluster_paths == (
        "projects/p/locations/us-central2-b/clusters/c",
        "projects/p/locations/us-east5/clusters/d",
    )
    assert Settings(project_id="p", location="l", cluster_name="c").setup_cluster_paths == (
        "projects/p/locations/l/clusters/c",
    )


@pytest.mark.parametrize(
    "entry", ["d", "projects/p/zones/z/clusters/d", "projects/p/locations/l/clusters/d/x"]
)
def test_a_setup_cluster_must_be_a_cluster_path(entry: str) -> None:
    with pytest.raises(InvalidInputError, match=r"SETUP_CLUSTERS entry .* is not projects/PROJECT/locations"):
        Settings.from_env({"SETUP_CLUSTERS": entry})


# --- the fleet ---------------------------------------------------------------------------------


def test_the_fleet_is_the_managed_cluster_and_the_listed_ones_each_reached_by_its_own_context() -> None:
    settings = Settings.from_env(
        {
            "PROJECT_ID": "p",
            "LOCATION": "us-central2-b",
            "CLUSTER_NAME": "c",
            "KUBECONFIG": "/k",
            "KUBE_API_ENDPOINT": "https://10.0.0.1",
            "FLEET_CLUSTERS": (
                "projects/q/locations/us-east5/clusters/d, projects/p/locations/us-central2-b/clusters/c"
            ),
        }
    )
    assert settings.fleet_paths == (
        "projects/p/locations/us-central2-b/clusters/c",
        "projects/q/locations/us-east5/clusters/d",
    )
    assert settings.for_cluster(settings.cluster_path) is settings
    other = settings.for_cluster("projects/q/locations/us-east5/clusters/d")
    assert (other.project_id, other.location, other.cluster_name) == ("q", "us-east5", "d")
    # Not the managed cluster's endpoint: the context gcloud get-credentials writes for it.
    assert (other.kube_api_endpoint, other.kube_context) == ("", "gke_q_us-east5_d")
    assert "projects/q/locations/us-east5/clusters/d" in settings.setup_cluster_paths
    assert Settings(project_id="p", location="l", cluster_name="c").fleet_paths == (
        "projects/p/locations/l/clusters/c",
    )


def test_a_fleet_cluster_must_be_a_cluster_path() -> None:
    with pytest.raises(
        InvalidInputError, match=r'FLEET_CLUSTERS entry "projects/p/zones/z" is not projects/PROJECT'
    ):
        Settings.from_env({"FLEET_CLUSTERS": "projects/p/zones/z"})


SECOND = "projects/q/locations/us-east5/clusters/d"


def fleet_env(overrides: object) -> dict[str, str]:
    return {
        "PROJECT_ID": "p",
        "LOCATION": "us-central2-b",
        "CLUSTER_NAME": "c",
        "FLEET_CLUSTERS": SECOND,
        "NODE_LOCATIONS": "us-central2-b",
        "CHIP_BUDGET": "64",
        "FLEET_OVERRIDES": json.dumps(overrides),
    }


def test_a_fleet_cluster_takes_its_overrides_and_the_defaults_for_the_rest() -> None:
    settings = Settings.from_env(
        fleet_env(
            {SECOND: {"NODE_LOCATIONS": ["us-east5-a", "us-east5-b"], "CHIP_BUDGET": 256, "DRAIN": True}}
        )
    )
    other = settings.for_cluster(SECOND)
    assert (other.node_locations, other.chip_budget, other.drain) == (("us-east5-a", "us-east5-b"), 256, True)
    assert other.disk_size_gb == settings.disk_size_gb  # not overridden: the default
    # the managed cluster keeps the defaults
    assert (settings.node_locations, settings.chip_budget, settings.drain) == (("us-central2-b",), 64, False)


def test_a_project_entry_sets_every_fleet_cluster_of_the_project_and_a_clusters_own_wins() -> None:
    labelled = "projects/team-b-proj/locations/us-east5/clusters/train"
    settings = Settings.from_env(
        {
            **fleet_env(
                {
                    "projects/q": {
                        "NODE_SERVICE_ACCOUNT": "nodes@q.iam.gserviceaccount.com",
                        "CHIP_BUDGET": 8,
                    },
                    SECOND: {"CHIP_BUDGET": 256},
                    "projects/team-b-proj": {
                        "NODE_SERVICE_ACCOUNT": "nodes@team-b-proj.iam.gserviceaccount.com"
                    },
                }
            ),
            "FLEET_PROJECTS": "team-b-proj",
        }
    )
    second = settings.for_cluster(SECOND)
    assert (second.node_service_account, second.chip_budget) == ("nodes@q.iam.gserviceaccount.com", 256)
    # A cluster of a FLEET_PROJECTS project labelled in later takes its project's account.
    assert settings.for_cluster(labelled).node_service_account == "nodes@team-b-proj.iam.gserviceaccount.com"
    assert settings.for_cluster(labelled).chip_budget == 64  # the default: no entry of its own sets it
    # The managed cluster's settings are the defaults themselves.
    assert settings.node_service_account == ""


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"projects/elsewhere": {"DRAIN": True}},
            r'names cluster "projects/elsewhere", .*nor projects/P of a fleet project \(q\)',
        ),
        ({"projects/q": {"CHIP_BUDGET": "many"}}, r'FLEET_OVERRIDES\["projects/q"\]: .*CHIP_BUDGET'),
        ({"projects/q": {"KUBE_CONTEXT": "x"}}, r'FLEET_OVERRIDES\["projects/q"\] key "KUBE_CONTEXT" is not'),
    ],
    ids=["not-a-fleet-project", "bad-value", "not-overridable"],
)
def test_a_bad_project_entry_stops_the_service_at_startup_naming_the_project(
    overrides: object, says: str
) -> None:
    with pytest.raises(InvalidInputError, match=says):
        Settings.from_env(fleet_env(overrides))


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {SECOND: {"GKE_API_ENDPOINT": "http://x"}},
            r'"projects/q/locations/us-east5/clusters/d"\] key "GKE_API_ENDPOINT" is not',
        ),
        (
            {SECOND: {"CHIP_BUDGET": "many"}},
            r'FLEET_OVERRIDES\["projects/q/locations/us-east5/clusters/d"\]: .*CHIP_BUDGET',
        ),
        ({SECOND: {"IDLE_POOL_SECONDS": 99999}}, r"d\"\]: setting IDLE_POOL_SECONDS=99999 must be <= 3600"),
        ({"projects/p/locations/us-central2-b/clusters/c": {"DRAIN": True}}, "not one of FLEET_CLUSTERS"),
        ({"projects/z/locations/l/clusters/unknown": {}}, "not one of FLEET_CLUSTERS"),
        ([1], "must be an object"),
    ],
    ids=[
        "not-overridable",
        "bad-int",
        "above-maximum",
        "managed-cluster",
        "outside",
        "not-object",
    ],
)
def test_a_bad_override_stops_the_service_at_startup_naming_the_cluster_and_the_key(
    overrides: object, says: str
) -> None:
    with pytest.raises(InvalidInputError, match=says):
        Settings.from_env(fleet_env(overrides))


def test_a_fleet_clusters_misspelled_capacity_policy_stops_the_runtime_at_startup() -> None:
    from shared.app.entry import Runtime  # where the policy grammar (shared.tpu.capacity) is checked

    settings = Settings.from_env(fleet_env({SECOND: {"CAPACITY_POLICY": "spot@nowhere"}}))
    with pytest.raises(
        InvalidInputError, match=r'FLEET_OVERRIDES\["projects/q/.*/d"\]: setting CAPACITY_POLICY'
    ):
        Runtime(settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FLEET_PROJECTS": "team-b-proj,Team_C"}, r'FLEET_PROJECTS entry "Team_C" is not a project id'),
        ({"FLEET_LABEL": "tpuprov"}, r'FLEET_LABEL="tpuprov" is not KEY=VALUE'),
        ({"FLEET_LABEL": "TPU=yes"}, r'FLEET_LABEL="TPU=yes" is not KEY=VALUE'),
        ({"FLEET_DISCOVERY_SECONDS": "0"}, r"FLEET_DISCOVERY_SECONDS=0 must be >= 1"),
        (
            {
                "FLEET_PROJECTS": "team-b-proj",
                "FLEET_OVERRIDES": '{"projects/team-c-proj/locations/l/clusters/x": {}}',
            },
            r"not one of FLEET_CLUSTERS .* nor a cluster of FLEET_PROJECTS \(team-b-proj\)",
        ),
    ],
    ids=["project-id", "no-value", "upper-case-key", "zero-ttl", "override-outside-the-projects"],
)
def test_label_discovery_settings_are_checked_at_startup(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Settings.from_env(env)


def test_a_cluster_of_a_fleet_project_may_take_overrides_before_it_is_labelled() -> None:
    path = "projects/team-b-proj/locations/us-east5/clusters/train"
    settings = Settings.from_env(
        {"FLEET_PROJECTS": "team-b-proj", "FLEET_OVERRIDES": json.dumps({path: {"CHIP_BUDGET": 64}})}
    )
    assert settings.discoverable(path) and not settings.discoverable("projects/x-proj/locations/l/clusters/c")
    assert settings.for_cluster(path).chip_budget == 64
    assert settings.fleet_label_pair == ("tpuprov", "enabled")
