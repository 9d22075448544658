"""The fleet's other projects in infra/: one aggregated sink instead of a sink per project, and a node
service account in each project.

* With ``fleet_sink_parent`` set, each sink file becomes one non-intercepting folder or organization
  sink (children included) whose filter names the other fleet projects and nothing else, the
  per-project copies are not made, and each writer identity may publish to its own topic only.
  The filter Terraform renders is evaluated with the sandbox's Cloud Logging evaluator against the
  per-project filters it stands for.
* Every other fleet project gets a ``<prefix>-nodes`` account with ``node_service_account_roles``
  there (or the one ``fleet_node_service_accounts`` names), and only the pool-creating functions
  may act as it.

Terraform itself evaluates the verbatim locals and variable blocks where it is installed (no
provider is needed: they are pure).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.logging.filter import load_filter, parse_filter
from shared.app.deployment import ANY_CLUSTER
from shared.cloud.permissions import CALLS
from shared.core.settings import Settings
from shared.events import entries as logentries
from shared.events.envelope import ClusterId
from tests.infra.hcl import (
    INFRA,
    first,
    hcl_block,
    module,
    terraform_apply,
    terraform_outputs,
)
from tests.infra.test_sinks import create_cluster_entry
from tests.paths import REPO

TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
SINKS = REPO / "sinks"
AGGREGATED = "modules/aggregated_sink"
HOME = "home-project"  # project_id
FLEET = ["fleet-alpha", "fleet-beta"]  # the other fleet projects
OUTSIDER = "outside-project"  # beneath the same folder, not in the fleet
UID = "6f1c3c52-8b4e-4a57-9d1a-0c8f3b1e2d44"


def _local(path: Path, name: str) -> str:
    """The verbatim HCL of one (possibly multi-line) local of ``path``."""
    text = path.read_text()
    start = re.search(rf"^  {name} = ", text, re.M)
    assert start is not None, name
    if text[start.end()] == '"':  # a one-line string
        return text[start.end() : text.index("\n", start.end())]
    depth, i, in_string = 0, start.end(), False
    while True:
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "\n" and depth == 0:
            return text[start.end() : i]
        else:
            depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(ch, 0)
        i += 1


def _variables(*names: str) -> str:
    return "\n\n".join(hcl_block(INFRA / "variables.tf", f'variable "{name}"') for name in names) + "\n\n"


# --- the aggregated sinks -----------------------------------------------------------------------


def test_the_aggregated_sink_is_non_intercepting_includes_children_and_fills_its_topic() -> None:
    sink = module(AGGREGATED)
    folder = sink.resource("google_logging_folder_sink", "this")
    organization = sink.resource("google_logging_organization_sink", "this")
    assert folder["count"] == '${local.kind == "folders" ? 1 : 0}'
    assert organization["count"] == '${local.kind == "organizations" ? 1 : 0}'
    # The provider's arguments: folder (bare id or folders/ID), org_id (the bare number only).
    assert folder["folder"] == organization["org_id"] == "${local.id}"
    assert sink.locals["kind"] == '${split("/", var.parent)[0]}'
    assert sink.locals["id"] == '${split("/", var.parent)[1]}'
    for body in (folder, organization):
        assert body["include_children"] is True
        assert body["intercept_children"] is False  # the child projects' sinks keep their entries
        assert body["destination"] == "pubsub.googleapis.com/${var.topic_id}"
        assert body["filter"] == "${var.filter}"
        assert body["name"] == "${var.name}"
        assert "exclusions" not in body and "disabled" not in body
    # One grant: publisher on the sink's own topic, to the sink's writer identity.
    assert list(sink.of_type("google_pubsub_topic_iam_member")) == ["writer"]
    writer = sink.resource("google_pubsub_topic_iam_member", "writer")
    assert (writer["topic"], writer["role"], writer["member"]) == (
        "${var.topic_id}",
        "roles/pubsub.publisher",
        "${local.writer_identity}",
    )
    assert writer["project"] == '${split("/", var.topic_id)[1]}'
    assert sink.locals["writer_identity"] == (
        "${one(concat(google_logging_folder_sink.this[*].writer_identity, "
        "google_logging_organization_sink.this[*].writer_identity))}"
    )
    assert sink.outputs["writer_identity"]["value"] == "${local.writer_identity}"
    # Nothing else: no project, folder or organization grant.
    assert set(sink.resources) == {
        ("google_logging_folder_sink", "this"),
        ("google_logging_organization_sink", "this"),
        ("google_pubsub_topic_iam_member", "writer"),
    }


def test_the_root_makes_either_the_aggregated_sinks_or_the_per_project_copies() -> None:
    root = module()
    call = root.modules["fleet_parent_sink"]
    assert call["source"] == "./" + AGGREGATED
    assert call["for_each"] == "${local.fleet_parent_sinks}"
    assert call["parent"] == "${var.fleet_sink_parent}"
    assert call["name"] == "${var.topic_prefix}-${each.key}"
    assert call["filter"] == "${each.value.filter}"
    assert call["topic_id"] == "${module.pubsub[each.value.function].topic_id}"
    assert root.locals["fleet_parent_sinks"].endswith(
        '} if var.fleet_sink_parent != "" && length(local.other_fleet_projects) > 0}}'
    )
    # The per-project copies only without a parent; project_id's own sinks always.
    assert root.locals["fleet_sink_projects"] == (
        '${var.fleet_sink_parent == "" ? local.other_fleet_projects : toset([])}'
    )
    assert root.locals["fleet_sinks"].startswith(
        "${{for pair in setproduct(sort(local.fleet_sink_projects), sort(keys(local.sinks)))"
    )
    assert root.modules["fleet_sink"]["for_each"] == "${local.fleet_sinks}"
    assert root.modules["sink"]["for_each"] == "${local.sinks}"
    output = root.outputs["fleet_parent_sink_writer_identities"]
    assert output["value"] == "${{for name, sink in module.fleet_parent_sink : name => sink.writer_identity}}"


def test_the_filters_name_their_project_only_in_the_forms_the_aggregated_filter_rewrites() -> None:
    # main.tf's fleet_parent_sinks turns exactly these two into lists of the fleet's projects; a
    # file naming its project any other way would keep the placeholder in the aggregated filter.
    forms = ('logName="projects/${project_id}/logs/', 'resource.labels.project_id="${project_id}"')
    for path in sorted(SINKS.glob("*.filter")):
        text = path.read_text()
        assert 'resource.labels.project_id="${project_id}"' in text, path.name
        assert text.count("${project_id}") == sum(text.count(form) for form in forms), path.name


@pytest.fixture(scope="module")
def sink_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """main.tf's sink locals and the three variables they read, verbatim, beside a copy of sinks/."""
    top = tmp_path_factory.mktemp("fleet-sinks")
    shutil.copytree(SINKS, top / "sinks")
    root = top / "infra"  # templatefile() reads ${path.module}/../sinks
    root.mkdir()
    main, iam = INFRA / "main.tf", INFRA / "iam.tf"
    names = ("sinks", "any_cluster", "fleet_sink_projects", "fleet_sinks", "fleet_sink_placeholder")
    (root / "main.tf").write_text(
        _variables("project_id", "fleet_projects", "fleet_sink_parent")
        + "locals {\n"
        + f"  other_fleet_projects = {_local(iam, 'other_fleet_projects')}\n"
        + "".join(f"  {name} = {_local(main, name)}\n" for name in names)
        + f"  fleet_parent_sinks = {_local(main, 'fleet_parent_sinks')}\n"
        + "}\n\n"
        + 'output "fleet_sinks" {\n  value = local.fleet_sinks\n}\n\n'
        + 'output "fleet_parent_sinks" {\n  value = local.fleet_parent_sinks\n}\n'
    )
    return root


def _fleet_sinks(root: Path, fleet_projects: list[str], parent: str) -> dict[str, Any]:
    result = terraform_apply(
        root, {"project_id": HOME, "fleet_projects": fleet_projects, "fleet_sink_parent": parent}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return terraform_outputs(root)


@needs_terraform
def test_without_a_parent_each_other_fleet_project_gets_every_sink(sink_root: Path) -> None:
    outputs = _fleet_sinks(sink_root, [HOME, *FLEET], "")
    assert outputs["fleet_parent_sinks"] == {}
    assert set(outputs["fleet_sinks"]) == {
        f"{project}/{path.stem}" for project in FLEET for path in SINKS.glob("*.filter")
    }


@needs_terraform
@pytest.mark.parametrize("parent", ["folders/123456789", "organizations/42"])
def test_with_a_parent_one_aggregated_sink_per_file_replaces_the_copies(sink_root: Path, parent: str) -> None:
    outputs = _fleet_sinks(sink_root, [HOME, *FLEET], parent)
    assert outputs["fleet_sinks"] == {}
    sinks = outputs["fleet_parent_sinks"]
    assert {name: sink["function"] for name, sink in sinks.items()} == module().locals["sinks"]
    for name, sink in sinks.items():
        assert HOME not in sink["filter"], name  # project_id's own sinks export its entries
        assert "placeholder" not in sink["filter"], name
        parse_filter(sink["filter"])  # within the subset the sandbox's router evaluates


ENTRIES: list[Callable[[ClusterId], dict[str, Any]]] = [
    lambda c: logentries.pod_event_entry(c, "team-a", "t-0", UID, controller=("JobSet", "t")),
    lambda c: logentries.pod_event_entry(c, "team-a", "t-0", UID, controller=None),
    lambda c: logentries.pod_event_entry(c, "team-a", "web-1", UID, controller=("Deployment", "web")),
    lambda c: logentries.pod_event_entry(
        c, "team-a", "t-0", UID, reason="Scheduled", controller=("JobSet", "t")
    ),
    lambda c: logentries.jobset_event_entry(c, "team-a", "train", UID),
    lambda c: logentries.jobset_event_entry(c, "team-a", "train", UID, reason="SuspendedJobs"),
    lambda c: logentries.jobset_delete_audit_entry(c, "team-a", "train"),
    lambda c: logentries.jobset_delete_audit_entry(c, "team-a", "train", status_code=7),
    lambda c: logentries.nodepool_operation_entry(c, "tpu-a"),
    lambda c: logentries.nodepool_operation_entry(c, "tpu-a", last=False),
    lambda c: logentries.workload_event_entry(c, "team-a", "jobset-t-1", UID),
    lambda c: create_cluster_entry(c),
    lambda c: create_cluster_entry(c, last=False),
]
CLUSTERS = [
    ClusterId(FLEET[0], "us-central2-b", "tpu-a"),
    ClusterId(FLEET[1], "us-east5", "tpu-b"),  # a regional one
    ClusterId(HOME, "us-central2-b", "home"),
    ClusterId(OUTSIDER, "us-central2-b", "tpu-a"),
]


@needs_terraform
def test_the_aggregated_filter_exports_what_the_per_project_copies_would(sink_root: Path) -> None:
    """Entry by entry, each aggregated sink keeps exactly what one of the per-project sinks (the same
    file rendered for each other fleet project, every cluster) would: the fleet projects' matching
    entries, and nothing of project_id or of a project outside the fleet."""
    sinks = _fleet_sinks(sink_root, [HOME, *FLEET], "folders/123456789")["fleet_parent_sinks"]
    exported: dict[str, set[str]] = {}
    for name, sink in sinks.items():
        aggregated = parse_filter(sink["filter"])
        copies = [
            load_filter(SINKS / f"{name}.filter", {"project_id": project, "clusters": ANY_CLUSTER})
            for project in FLEET
        ]
        for cluster in CLUSTERS:
            for index, build in enumerate(ENTRIES):
                entry = build(cluster)
                expected = any(copy.matches(entry) for copy in copies)
                assert aggregated.matches(entry) is expected, (name, cluster, index)
                if expected:
                    exported.setdefault(name, set()).add(cluster.project)
    # Not vacuous: every sink exports from both fleet projects, and never from the others.
    assert exported == {name: set(FLEET) for name in sinks}


@needs_terraform
def test_the_aggregated_filter_stays_within_cloud_loggings_limit_for_a_large_fleet(sink_root: Path) -> None:
    # 100 fleet projects with 30-character ids (the longest Resource Manager allows).
    projects = [f"fleet-{n:03d}-" + "x" * 16 + "-end" for n in range(100)]
    assert all(len(p) == 30 for p in projects)
    sinks = _fleet_sinks(sink_root, [HOME, *projects], "organizations/42")["fleet_parent_sinks"]
    assert max(len(sink["filter"]) for sink in sinks.values()) <= 20000


@needs_terraform
def test_the_aggregated_sink_refuses_a_filter_cloud_logging_would(tmp_path: Path) -> None:
    (tmp_path / "main.tf").write_text(hcl_block(INFRA / AGGREGATED / "main.tf", 'variable "filter"'))
    assert terraform_apply(tmp_path, {"filter": "x" * 20000}).returncode == 0
    refused = terraform_apply(tmp_path, {"filter": "x" * 20001})
    assert refused.returncode != 0 and "20,000 characters" in refused.stderr, refused.stderr


@needs_terraform
@pytest.mark.parametrize(
    ("parent", "fleet_projects", "accepted"),
    [
        ("", [], True),
        ("", [HOME], True),
        ("folders/123456789", [HOME, *FLEET], True),
        ("organizations/42", FLEET, True),
        ("folders/abc", FLEET, False),
        ("123456789", FLEET, False),
        ("folders/123/", FLEET, False),
        ("projects/fleet-alpha", FLEET, False),
        ("organizations/42", [HOME], False),  # no other project: the filter would name none
        ("folders/123456789", [], False),
    ],
)
def test_the_parent_is_a_folder_or_organization_with_projects_to_export(
    tmp_path: Path, parent: str, fleet_projects: list[str], accepted: bool
) -> None:
    (tmp_path / "main.tf").write_text(_variables("project_id", "fleet_projects", "fleet_sink_parent"))
    variables = {"project_id": HOME, "fleet_projects": fleet_projects, "fleet_sink_parent": parent}
    result = terraform_apply(tmp_path, variables)
    assert (result.returncode == 0) is accepted, result.stdout + result.stderr
    if not accepted:
        assert "Invalid value for variable" in result.stderr


def test_the_parent_validation_pattern() -> None:
    validation = module().variables["fleet_sink_parent"]["validation"][0]
    assert "^(folders|organizations)/[0-9]+$" in validation["condition"]
    assert module().variables["fleet_sink_parent"]["default"] == ""
    module_validation = first(module(AGGREGATED).variables["parent"]["validation"])
    assert "^(folders|organizations)/[0-9]+$" in module_validation["condition"]


# --- the nodes' service account of each other fleet project -------------------------------------


def test_each_other_fleet_project_gets_its_own_least_privilege_node_account() -> None:
    root = module()
    assert root.locals["fleet_node_accounts_created"] == (
        "${setsubtract(local.other_fleet_projects, keys(var.fleet_node_service_accounts))}"
    )
    account = root.resource("google_service_account", "fleet_nodes")
    assert account["for_each"] == "${local.fleet_node_accounts_created}"
    assert (account["project"], account["account_id"]) == ("${each.value}", "${var.topic_prefix}-nodes")
    roles = root.resource("google_project_iam_member", "fleet_node_roles")
    assert roles["for_each"] == "${local.fleet_node_roles}"
    assert (roles["project"], roles["role"], roles["member"]) == (
        "${each.value.project}",
        "${each.value.role}",
        "serviceAccount:${google_service_account.fleet_nodes[each.value.project].email}",
    )
    # The same roles as this project's node account (no basic role: that variable's validation).
    assert "sort(var.node_service_account_roles)" in root.locals["fleet_node_roles"]
    assert "sort(local.fleet_node_accounts_created)" in root.locals["fleet_node_roles"]
    assert root.outputs["fleet_node_service_accounts"]["value"] == "${local.fleet_node_service_accounts}"
    assert "google_service_account.fleet_nodes[project].email" in root.locals["fleet_node_service_accounts"]
    assert "var.fleet_node_service_accounts" in root.locals["fleet_node_service_accounts"]


def test_only_the_pool_creating_functions_may_act_as_a_node_account() -> None:
    root = module()
    creators = root.locals["node_pool_creators"]
    assert creators == ["provision", "reconcile"]
    users = root.of_type("google_service_account_iam_member")
    assert set(users) == {"node_service_account_user", "fleet_node_service_account_user"}
    home = users["node_service_account_user"]
    assert home["for_each"] == "${toset(local.node_pool_creators)}"
    assert home["member"] == "serviceAccount:${google_service_account.runtime[each.key].email}"
    fleet = users["fleet_node_service_account_user"]
    assert fleet["for_each"] == "${local.fleet_node_users}"
    assert root.locals["fleet_node_users"].startswith(
        "${{for pair in setproduct(sort(local.other_fleet_projects), local.node_pool_creators)"
    )
    assert fleet["member"] == "serviceAccount:${google_service_account.runtime[each.value.function].email}"
    for grant in users.values():
        assert grant["role"] == "roles/iam.serviceAccountUser"
        assert "condition" not in grant and "dynamic" not in grant


OVERRIDE_LOCALS = ("fleet_node_overrides", "fleet_overrides")


def _fleet_overrides_env() -> str:
    """The HCL infra/main.tf sets FLEET_OVERRIDES to, in local.function_env."""
    found = re.search(r"^    FLEET_OVERRIDES\s+= (.+)$", (INFRA / "main.tf").read_text(), re.M)
    assert found is not None, "local.function_env sets no FLEET_OVERRIDES"
    return found.group(1)


FLEET_OVERRIDES_ENV = _fleet_overrides_env()


@pytest.fixture(scope="module")
def node_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iam.tf's node-account locals and the service account ids of the grants, provider-free: each
    created account's email is what IAM gives <account_id>@<project>.iam.gserviceaccount.com."""
    root = tmp_path_factory.mktemp("fleet-nodes")
    iam = INFRA / "iam.tf"
    created = "google_service_account.fleet_nodes[project].email"
    accounts = _local(iam, "fleet_node_service_accounts")
    assert created in accounts
    accounts = accounts.replace(created, '"tpuprov-nodes@${project}.iam.gserviceaccount.com"')
    grant = module().resource("google_service_account_iam_member", "fleet_node_service_account_user")
    service_account_id = grant["service_account_id"].removeprefix("${").removesuffix("}")
    names = ("node_pool_creators", "other_fleet_projects", "fleet_node_accounts_created")
    (root / "main.tf").write_text(
        _variables(
            "project_id",
            "fleet_projects",
            "node_service_account_roles",
            "fleet_node_service_accounts",
            "fleet_overrides",
        )
        + "locals {\n"
        + "".join(f"  {name} = {_local(iam, name)}\n" for name in names)
        + "".join(f"  {name} = {_local(INFRA / 'main.tf', name)}\n" for name in OVERRIDE_LOCALS)
        + f"  fleet_node_service_accounts = {accounts}\n"
        + f"  fleet_node_roles = {_local(iam, 'fleet_node_roles')}\n"
        + f"  fleet_node_users = {_local(iam, 'fleet_node_users')}\n"
        + "}\n\n"
        + 'output "accounts" {\n  value = local.fleet_node_service_accounts\n}\n\n'
        + 'output "created" {\n  value = local.fleet_node_accounts_created\n}\n\n'
        + f'output "fleet_overrides_env" {{\n  value = {FLEET_OVERRIDES_ENV}\n}}\n\n'
        + 'output "roles" {\n  value = local.fleet_node_roles\n}\n\n'
        + 'output "users" {\n'
        + "  value = { for key, user in local.fleet_node_users : key => {\n"
        + "    function           = user.function\n"
        + f"    service_account_id = {service_account_id.replace('each.value', 'user')}\n"
        + "  } }\n}\n"
    )
    return root


@needs_terraform
def test_node_accounts_are_made_where_none_is_named_and_granted_to_the_pool_creators(node_root: Path) -> None:
    shared = "tpu-nodes@shared-nodes-proj.iam.gserviceaccount.com"
    variables = {
        "project_id": HOME,
        "fleet_projects": [HOME, *FLEET],
        "node_service_account_roles": [
            "roles/container.defaultNodeServiceAccount",
            "roles/artifactregistry.reader",
        ],
        "fleet_node_service_accounts": {FLEET[1]: shared},
    }
    result = terraform_apply(node_root, variables)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = terraform_outputs(node_root)
    alpha = f"tpuprov-nodes@{FLEET[0]}.iam.gserviceaccount.com"
    # project_id keeps node_service_account; the named project keeps its account, the other gets one.
    assert outputs["created"] == [FLEET[0]]
    assert outputs["accounts"] == {FLEET[0]: alpha, FLEET[1]: shared}
    assert outputs["roles"] == {
        f"{FLEET[0]}/{role}": {"project": FLEET[0], "role": role}
        for role in variables["node_service_account_roles"]
    }
    # actAs on each project's account for provision and reconcile only, addressed in the account's
    # own project (the shared one is not in its fleet project).
    assert outputs["users"] == {
        f"{project}/{function}": {
            "function": function,
            "service_account_id": f"projects/{owner}/serviceAccounts/{email}",
        }
        for project, owner, email in ((FLEET[0], FLEET[0], alpha), (FLEET[1], "shared-nodes-proj", shared))
        for function in ("provision", "reconcile")
    }


@needs_terraform
def test_without_other_fleet_projects_no_node_account_is_made(node_root: Path) -> None:
    result = terraform_apply(
        node_root,
        {
            "project_id": HOME,
            "fleet_projects": [HOME],
            "node_service_account_roles": [],
            "fleet_node_service_accounts": {},
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = terraform_outputs(node_root)
    assert (outputs["created"], outputs["accounts"], outputs["roles"], outputs["users"]) == ([], {}, {}, {})


@needs_terraform
@pytest.mark.parametrize(
    ("accounts", "accepted"),
    [
        ({}, True),
        ({FLEET[0]: "tpu-nodes@fleet-alpha.iam.gserviceaccount.com"}, True),
        ({FLEET[0]: "tpu-nodes@shared-nodes-proj.iam.gserviceaccount.com"}, True),
        ({HOME: "tpu-nodes@home-project.iam.gserviceaccount.com"}, False),  # node_service_account's
        ({OUTSIDER: "tpu-nodes@outside-project.iam.gserviceaccount.com"}, False),  # not a fleet project
        ({FLEET[0]: "123456789012-compute@developer.gserviceaccount.com"}, False),  # Compute's default
        ({FLEET[0]: "tpu-nodes"}, False),
    ],
    ids=[
        "none",
        "own-project",
        "shared-project",
        "project-id",
        "outsider",
        "compute-default",
        "not-an-email",
    ],
)
def test_named_node_accounts_are_user_managed_accounts_of_other_fleet_projects(
    tmp_path: Path, accounts: dict[str, str], accepted: bool
) -> None:
    (tmp_path / "main.tf").write_text(
        _variables("project_id", "fleet_projects", "fleet_node_service_accounts")
    )
    variables = {
        "project_id": HOME,
        "fleet_projects": [HOME, *FLEET],
        "fleet_node_service_accounts": accounts,
    }
    result = terraform_apply(tmp_path, variables)
    assert (result.returncode == 0) is accepted, result.stdout + result.stderr
    if not accepted:
        assert "Invalid value for variable" in result.stderr


@needs_terraform
def test_each_fleet_projects_node_account_reaches_the_services_under_the_users_overrides(
    node_root: Path,
) -> None:
    mine = "team-nodes@fleet-beta.iam.gserviceaccount.com"
    beta_cluster = f"projects/{FLEET[1]}/locations/us-east5-b/clusters/train"
    variables = {
        "project_id": HOME,
        "fleet_projects": [HOME, *FLEET],
        "node_service_account_roles": ["roles/container.defaultNodeServiceAccount"],
        "fleet_node_service_accounts": {},
        "fleet_overrides": {
            f"projects/{FLEET[0]}": {"CHIP_BUDGET": "64"},
            beta_cluster: {"NODE_SERVICE_ACCOUNT": mine},
        },
    }
    result = terraform_apply(node_root, variables)
    assert result.returncode == 0, result.stdout + result.stderr
    env = terraform_outputs(node_root)["fleet_overrides_env"]
    # What the services make of it (shared.core.settings, validated at startup as on Cloud Run).
    settings = Settings.from_env(
        {
            "PROJECT_ID": HOME,
            "LOCATION": "us-east5-b",
            "CLUSTER_NAME": "home",
            "FLEET_PROJECTS": ",".join([HOME, *FLEET]),
            "FLEET_OVERRIDES": env,
        }
    )
    alpha = settings.for_cluster(f"projects/{FLEET[0]}/locations/us-west4-a/clusters/any")
    beta_other = settings.for_cluster(f"projects/{FLEET[1]}/locations/us-west4-a/clusters/other")
    # A cluster labelled in later runs its nodes as its own project's account, and takes the user's
    # project entry too; a cluster's own entry wins over what the project's says.
    assert (alpha.node_service_account, alpha.chip_budget) == (
        f"tpuprov-nodes@{FLEET[0]}.iam.gserviceaccount.com",
        64,
    )
    assert beta_other.node_service_account == f"tpuprov-nodes@{FLEET[1]}.iam.gserviceaccount.com"
    assert settings.for_cluster(beta_cluster).node_service_account == mine


def test_a_reservation_owner_project_gets_only_the_reservation_reads_for_the_pool_creators() -> None:
    root = module()
    role = root.resource("google_project_iam_custom_role", "reservation_reader")
    assert (role["for_each"], role["project"], role["permissions"]) == (
        "${local.reservation_owners}",
        "${each.value}",
        "${local.reservation_reads}",
    )
    member = root.resource("google_project_iam_member", "reservation_reader")
    assert member["for_each"] == "${local.reservation_readers}"
    assert member["member"] == "serviceAccount:${google_service_account.runtime[each.value.function].email}"


@pytest.fixture(scope="module")
def reservation_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """iam.tf's reservation-reader locals over the real roles.json, provider-free."""
    root = tmp_path_factory.mktemp("reservation-readers")
    iam = INFRA / "iam.tf"
    shutil.copy(INFRA / "roles.json", root / "roles.json")
    names = ("custom_role_permissions", "node_pool_creators", "reservation_reads", "reservation_owners")
    (root / "main.tf").write_text(
        _variables("project_id", "fleet_projects", "reservation_projects")
        + "locals {\n"
        + "".join(f"  {name} = {_local(iam, name)}\n" for name in names)
        + f"  reservation_readers = {_local(iam, 'reservation_readers')}\n"
        + "}\n\n"
        + 'output "reads" {\n  value = local.reservation_reads\n}\n\n'
        + 'output "readers" {\n  value = local.reservation_readers\n}\n'
    )
    return root


@needs_terraform
def test_reservation_readers_are_bound_in_owner_projects_outside_the_fleet(reservation_root: Path) -> None:
    variables = {
        "project_id": HOME,
        "fleet_projects": [FLEET[0]],
        "reservation_projects": [HOME, FLEET[0], "res-owner-proj"],
    }
    result = terraform_apply(reservation_root, variables)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = terraform_outputs(reservation_root)
    # Exactly what the adapter's one call needs (shared.cloud.permissions), nothing of GKE's.
    assert outputs["reads"] == sorted(CALLS["ReservationAPI.get_reservation"])
    # The home and fleet projects hold the whole roles already: only the outside owner gets one.
    assert outputs["readers"] == {
        f"res-owner-proj/{function}": {"project": "res-owner-proj", "function": function}
        for function in ("provision", "reconcile")
    }
