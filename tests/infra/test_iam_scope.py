"""Who may do what where: the IAM grants of infra/ are scoped as far as IAM lets them.

* each function's custom role, and setup_cluster's Kubernetes Engine Admin, are bound with an IAM
  Condition that keeps their cluster permissions on the managed cluster (setup: and SETUP_CLUSTERS);
* every topic's publishers are named on that topic: its sinks, the operators, Cloud Scheduler on
  the reconcile topic, and nobody on the project;
* a deployment must state how much it may spend before Terraform applies it;
* the TPU nodes never run as Compute Engine's default service account.

The conditions and the validations are evaluated by terraform itself where it is installed (no
provider is needed: the condition module and the variable blocks are pure).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.app.deployment import ANY_CLUSTER, sink_clusters
from shared.core.settings import Settings
from tests.infra.hcl import (
    INFRA,
    conditioned_on,
    hcl_block,
    module,
    terraform_apply,
    terraform_json,
    terraform_outputs,
)

TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")
CLUSTER_TYPE = "container.googleapis.com/Cluster"
MANAGED = "projects/p1/locations/us-central2-b/clusters/tpu"


# --- the cluster conditions ---------------------------------------------------------------------

_CLAUSE = re.compile(
    r'^resource\.type != "(?P<type>[^"]+)"$'
    r'|^resource\.name == "(?P<name>[^"]+)"$'
    r'|^resource\.name\.startsWith\("(?P<prefix>[^"]+)"\)$'
)


def evaluate(expression: str, resource_type: str, resource_name: str) -> bool:
    """The condition's CEL for one resource: the only forms the module writes are OR-ed clauses of
    ``resource.type != T``, ``resource.name == N`` and ``resource.name.startsWith(P)``."""
    verdict = False
    for clause in expression.split(" || "):
        match = _CLAUSE.match(clause)
        assert match is not None, f"unexpected clause {clause!r}"
        if match["type"] is not None:
            verdict |= resource_type != match["type"]
        elif match["name"] is not None:
            verdict |= resource_name == match["name"]
        else:
            verdict |= resource_name.startswith(match["prefix"])
    return verdict


@pytest.fixture(scope="module")
def condition(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root calling modules/cluster_condition with the clusters given as a variable."""
    root = tmp_path_factory.mktemp("condition")
    (root / "main.tf").write_text(
        'variable "clusters" {\n  type = list(string)\n}\n\n'
        f'module "c" {{\n  source   = "{INFRA / "modules" / "cluster_condition"}"\n'
        "  clusters = var.clusters\n}\n\n"
        'output "expression" {\n  value = module.c.expression\n}\n\n'
        'output "names" {\n  value = module.c.names\n}\n'
    )
    return root


@needs_terraform
def test_the_condition_limits_cluster_permissions_to_the_clusters(condition: Path) -> None:
    extra = "projects/p1/locations/europe-west4/clusters/bootstrap"
    result = terraform_apply(condition, {"clusters": [MANAGED, extra]})
    assert result.returncode == 0, result.stdout + result.stderr
    expression = terraform_outputs(condition)["expression"]
    allowed = [
        (CLUSTER_TYPE, MANAGED),
        # IAM names a zonal cluster by zone (conditions-resource-attributes, "Resource name format").
        (CLUSTER_TYPE, "projects/p1/zones/us-central2-b/clusters/tpu"),
        (CLUSTER_TYPE, f"{MANAGED}/nodePools/js-train-0"),
        (CLUSTER_TYPE, extra),
        # Not a cluster: permissions checked on the project or Compute Engine resources are untouched.
        ("cloudresourcemanager.googleapis.com/Project", "projects/p1"),
        ("compute.googleapis.com/ResourcePolicy", "projects/p1/regions/us-central2/resourcePolicies/x"),
        ("", ""),
    ]
    refused = [
        (CLUSTER_TYPE, "projects/p1/locations/us-central2-b/clusters/other"),
        (CLUSTER_TYPE, "projects/p1/locations/us-central2-b/clusters/tpu-2"),
        (CLUSTER_TYPE, "projects/p2/locations/us-central2-b/clusters/tpu"),
        (CLUSTER_TYPE, "projects/p1/locations/us-central2-b/clusters/tp"),
        (CLUSTER_TYPE, ""),
    ]
    for resource in allowed:
        assert evaluate(expression, *resource), resource
    for resource in refused:
        assert not evaluate(expression, *resource), resource


@needs_terraform
def test_the_condition_needs_cluster_paths(condition: Path) -> None:
    for bad in ([], ["projects/p1/zones/us-central2-b/clusters/tpu"], ["tpu"]):
        result = terraform_apply(condition, {"clusters": bad})
        assert result.returncode != 0 and "Invalid value for variable" in result.stderr, bad


def test_each_function_role_and_the_setup_admin_are_bound_with_a_cluster_condition() -> None:
    root = module()
    grant = root.resource("google_project_iam_member", "function")
    assert conditioned_on(grant) == "module.managed_cluster_condition.expression"
    admin = root.resource("google_project_iam_member", "setup_cluster_admin")
    assert conditioned_on(admin) == "module.setup_cluster_condition.expression"
    # Unconditioned only when project_id is itself one of the label-discovered fleet projects.
    assert root.locals["discovers_here"] == "${contains(var.fleet_projects, var.project_id)}"
    assert root.modules["managed_cluster_condition"]["clusters"] == "${local.fleet}"
    assert root.locals["fleet"] == "${distinct(concat([local.managed_cluster], var.fleet_clusters))}"
    assert (
        root.modules["setup_cluster_condition"]["clusters"]
        == "${distinct(concat(local.fleet, var.setup_clusters))}"
    )
    assert root.locals["managed_cluster"] == (
        "projects/${var.project_id}/locations/${var.cluster_location}/clusters/${var.cluster_name}"
    )
    for name, body in root.modules.items():
        if name.endswith("_cluster_condition"):
            assert body["source"] == "./modules/cluster_condition"
    # setup_cluster accepts exactly the clusters its grant covers (shared.app.setup_handlers).
    env = root.locals["function_env"]
    assert env["SETUP_CLUSTERS"] == '${join(",", var.setup_clusters)}'
    # The functions manage exactly the clusters the grants and the sinks cover.
    assert env["FLEET_CLUSTERS"] == '${join(",", var.fleet_clusters)}'
    # Every Kubernetes Engine Admin grant in this project is the conditioned one; the other is
    # made in the other fleet projects only.
    admins = {
        name: g
        for name, g in root.of_type("google_project_iam_member").items()
        if g["role"] == "roles/container.admin"
    }
    assert admins.pop("setup_cluster_admin") == admin
    assert [(g["for_each"], g["project"]) for g in admins.values()] == [
        ("${local.other_fleet_projects}", "${each.value}")
    ]


@needs_terraform
@pytest.mark.parametrize(
    ("clusters", "accepted"),
    [
        ([], True),
        (["projects/my-project/locations/us-east5/clusters/other"], True),
        (["projects/someone-else/locations/us-east5/clusters/other"], False),
        (["projects/my-project/zones/us-east5-a/clusters/other"], False),
    ],
    ids=["none", "same-project", "other-project", "zones-form"],
)
@pytest.mark.parametrize("variable", ["setup_clusters", "fleet_clusters"])
def test_setup_and_fleet_clusters_are_clusters_of_the_deployments_project(
    tmp_path: Path, clusters: list[str], accepted: bool, variable: str
) -> None:
    variables = INFRA / "variables.tf"
    (tmp_path / "main.tf").write_text(
        hcl_block(variables, 'variable "project_id"')
        + "\n\n"
        + hcl_block(variables, f'variable "{variable}"')
        + "\n"
    )
    result = terraform_apply(tmp_path, {"project_id": "my-project", variable: clusters})
    assert (result.returncode == 0) is accepted, result.stdout + result.stderr


@needs_terraform
def test_the_sinks_name_the_fleet_as_the_sandbox_does(tmp_path: Path) -> None:
    # Terraform's own evaluation of sink_template_vars.clusters over a fleet, against the clause
    # the sandbox's log router filters with (shared.app.deployment.sink_clusters).
    fleet = [
        "projects/p/locations/us-central2-b/clusters/home",
        "projects/p/locations/us-east5/clusters/second",
    ]
    template = module().locals["sink_template_vars"]["clusters"].removeprefix("${").removesuffix("}")
    template = template.replace("local.fleet", json.dumps(fleet)).replace("var.project_id", '"p"')
    template = template.replace("local.any_cluster", json.dumps(module().locals["any_cluster"]))
    named = template.replace("var.fleet_projects", json.dumps(["other-project"]))
    assert terraform_json(named, tmp_path) == sink_clusters(fleet)
    # The deployment's own project discovered by label: every cluster's entries, as the router's.
    every = template.replace("var.fleet_projects", json.dumps(["p"]))
    assert terraform_json(every, tmp_path) == ANY_CLUSTER


def test_each_other_fleet_project_gets_every_sink_and_every_role() -> None:
    root = module()
    # Every other fleet project, unless one aggregated sink per file replaces the copies
    # (fleet_sink_parent; tests/infra/test_fleet.py).
    assert root.locals["fleet_sinks"].startswith(
        "${{for pair in setproduct(sort(local.fleet_sink_projects), sort(keys(local.sinks)))"
    )
    assert root.locals["fleet_sink_projects"] == (
        '${var.fleet_sink_parent == "" ? local.other_fleet_projects : toset([])}'
    )
    sink = root.modules["fleet_sink"]
    assert sink["for_each"] == "${local.fleet_sinks}" and sink["project_id"] == "${each.value.project}"
    assert sink["topic_id"] == "${module.pubsub[local.sinks[each.value.sink]].topic_id}"
    # The writer identity publishes to the topic in the topic's project, not the sink's.
    writer = module("modules/sink").resource("google_pubsub_topic_iam_member", "writer")
    assert writer["project"] == '${split("/", var.topic_id)[1]}'
    role = root.resource("google_project_iam_custom_role", "fleet_function")
    assert role["permissions"] == "${local.custom_role_permissions[each.value.function]}"
    binding = root.resource("google_project_iam_member", "fleet_function")
    assert binding["member"] == "serviceAccount:${google_service_account.runtime[each.value.function].email}"
    assert (
        root.locals["other_fleet_projects"] == "${setsubtract(toset(var.fleet_projects), [var.project_id])}"
    )


# --- topic publishers ---------------------------------------------------------------------------


def test_each_topic_names_its_publishers_and_the_project_names_none() -> None:
    pubsub = module("modules/pubsub")
    grant = pubsub.resource("google_pubsub_topic_iam_member", "publisher")
    assert (grant["for_each"], grant["topic"], grant["role"], grant["member"]) == (
        "${var.publishers}",
        "${google_pubsub_topic.source.name}",
        "roles/pubsub.publisher",
        "${each.value}",
    )
    assert pubsub.variables["publishers"]["default"] == {}
    root = module()
    assert root.modules["pubsub"]["publishers"] == "${local.topic_publishers[each.key]}"
    publishers = root.locals["topic_publishers"]
    # Operators on every topic; Cloud Scheduler's service agent on the reconcile topic only.
    assert "for name, fn in local.functions" in publishers and "toset(var.operators)" in publishers
    assert '"cloud-scheduler" = local.scheduler_service_agent' in publishers
    assert 'if name == "reconcile"' in publishers
    assert root.locals["scheduler_service_agent"] == (
        "serviceAccount:service-${data.google_project.this.number}@gcp-sa-cloudscheduler.iam.gserviceaccount.com"
    )
    assert root.variables["operators"]["default"] == []
    # No publish right anywhere on the project, in any module.
    directories = ("", "modules/pubsub", "modules/sink", "modules/aggregated_sink", "modules/function")
    for directory in (*directories, "modules/cluster_condition"):
        for type_, name in module(directory).resources:
            body = module(directory).resources[(type_, name)]
            if type_ == "google_project_iam_member":
                assert "pubsub" not in str(body.get("role", "")), (directory, name)
    # A sink's writer identity may publish to its own topic only (modules/sink, and
    # modules/aggregated_sink for fleet_sink_parent).
    for directory in ("modules/sink", "modules/aggregated_sink"):
        sink_grant = module(directory).resource("google_pubsub_topic_iam_member", "writer")
        assert sink_grant["topic"] == "${var.topic_id}", directory


@needs_terraform
def test_topic_publishers_render_per_topic(tmp_path: Path) -> None:
    root = module()
    (tmp_path / "main.tf").write_text(
        hcl_block(INFRA / "variables.tf", 'variable "operators"')
        + "\n\nlocals {\n"
        + "  functions = {\n"
        + "    provision = {}, release = {}, reconcile = {}, setup_cluster = {}, apply_kueue = {}\n  }\n"
        + '  scheduler_service_agent = "serviceAccount:scheduler"\n'
        + f"  topic_publishers = {_hcl_local(root, 'topic_publishers')}\n"
        + "}\n\n"
        + 'output "publishers" {\n  value = local.topic_publishers\n}\n'
    )
    ops = ["group:tpu-ops@example.com", "user:oncall@example.com", "group:tpu-ops@example.com"]
    result = terraform_apply(tmp_path, {"operators": ops})
    assert result.returncode == 0, result.stdout + result.stderr
    rendered = terraform_outputs(tmp_path)["publishers"]
    humans = {
        "group:tpu-ops@example.com": "group:tpu-ops@example.com",
        "user:oncall@example.com": "user:oncall@example.com",
    }
    assert rendered == {
        "provision": humans,
        "release": humans,
        "setup_cluster": humans,
        "apply_kueue": humans,
        "reconcile": {**humans, "cloud-scheduler": "serviceAccount:scheduler"},
    }
    refused = terraform_apply(tmp_path, {"operators": ["ops@example.com"]})
    assert refused.returncode != 0 and "Invalid value for variable" in refused.stderr


def _hcl_local(root: Any, name: str) -> str:
    """The verbatim HCL of one local of infra/main.tf (multi-line), for a provider-free root."""
    text = (INFRA / "main.tf").read_text()
    start = re.search(rf"^  {name} = ", text, re.M)
    assert start is not None
    depth, i = 0, start.end()
    while True:
        depth += {"{": 1, "(": 1, "[": 1, "}": -1, ")": -1, "]": -1}.get(text[i], 0)
        if depth == 0 and text[i] in "})]":
            return text[start.end() : i + 1]
        i += 1


# --- stating the spending -----------------------------------------------------------------------

SPENDING_VARIABLES = ("chip_budget", "tenants", "kueue_only", "unlimited_spending")


@pytest.fixture(scope="module")
def spending(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four spending variables, verbatim, and what the functions get of them."""
    root = tmp_path_factory.mktemp("spending")
    blocks = [hcl_block(INFRA / "variables.tf", f'variable "{name}"') for name in SPENDING_VARIABLES]
    env = module().locals["function_env"]
    assert (env["TENANTS"], env["KUEUE_ONLY"], env["UNLIMITED_SPENDING"], env["CHIP_BUDGET"]) == (
        "${jsonencode(var.tenants)}",
        "${tostring(var.kueue_only)}",
        "${tostring(var.unlimited_spending)}",
        "${tostring(var.chip_budget)}",
    )
    (root / "main.tf").write_text(
        "\n\n".join(blocks)
        + '\n\noutput "env" {\n  value = {\n'
        + "    CHIP_BUDGET        = tostring(var.chip_budget)\n"
        + "    TENANTS            = jsonencode(var.tenants)\n"
        + "    KUEUE_ONLY         = tostring(var.kueue_only)\n"
        + "    UNLIMITED_SPENDING = tostring(var.unlimited_spending)\n"
        + "  }\n}\n"
    )
    return root


TENANTS = {
    "team-a": {"chips": 64, "reservations": ["res-a", "projects/shared-proj/reservations/res-b"]},
    "label:cost-center=42": {"chips": 16},
    "*": {"chips": 0},
}


@needs_terraform
@pytest.mark.parametrize(
    ("variables", "refusal"),
    [
        ({}, "State the spending limit"),
        ({"chip_budget": 0, "tenants": {}, "kueue_only": False}, "State the spending limit"),
        ({"chip_budget": 1024}, ""),
        ({"tenants": TENANTS}, ""),
        ({"tenants": {"team-b": {}}}, ""),
        ({"kueue_only": True}, ""),
        ({"unlimited_spending": True}, ""),
        ({"chip_budget": -8, "unlimited_spending": True}, "whole number of chips"),
        ({"chip_budget": 1.5}, "whole number of chips"),
        ({"tenants": {"Team_A": {"chips": 1}}}, "A tenants key is a namespace"),
        ({"tenants": {"team-a": {"chips": -1}}}, "chips is a whole number"),
        ({"tenants": {"team-a": {"reservations": ["Res_A"]}}}, "reservations are reservation names"),
    ],
    ids=[
        "nothing-stated",
        "all-off",
        "chip-budget",
        "tenants",
        "tenant-without-limits",
        "kueue-only",
        "unlimited-on-purpose",
        "negative-budget",
        "fractional-budget",
        "bad-tenant-key",
        "negative-tenant-chips",
        "bad-reservation",
    ],
)
def test_terraform_refuses_a_deployment_that_states_no_spending(
    spending: Path, variables: dict[str, Any], refusal: str
) -> None:
    result = terraform_apply(spending, variables)
    if refusal:
        assert result.returncode != 0, result.stdout
        assert "Invalid value for variable" in result.stderr and refusal in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        # What Terraform hands the functions is what the product reads (shared.core.settings).
        env = {name: str(value) for name, value in terraform_outputs(spending)["env"].items()}
        assert Settings.from_env(env).spending_stated


@needs_terraform
def test_the_tenants_json_terraform_writes_is_the_products_tenants(spending: Path) -> None:
    result = terraform_apply(spending, {"tenants": TENANTS})
    assert result.returncode == 0, result.stderr
    settings = Settings.from_env(terraform_outputs(spending)["env"])
    assert [(t.key, t.chips, t.reservations) for t in settings.tenant_entries] == [
        ("*", 0, None),  # optional attributes left out come through as null: no limit stated
        ("label:cost-center=42", 16, None),
        ("team-a", 64, ("res-a", "projects/shared-proj/reservations/res-b")),
    ]
    assert (settings.kueue_only, settings.unlimited_spending, settings.chip_budget) == (False, False, 0)


def test_terraform_requires_the_version_that_allows_cross_variable_validations() -> None:
    assert re.search(r'required_version = ">= 1\.9"', (INFRA / "versions.tf").read_text())


# --- the nodes' service account -----------------------------------------------------------------


def test_the_nodes_run_as_a_dedicated_least_privilege_account_unless_one_is_named() -> None:
    root = module()
    account = root.resource("google_service_account", "nodes")
    assert account["count"] == '${var.node_service_account == "" ? 1 : 0}'
    assert account["account_id"] == "${var.topic_prefix}-nodes"
    roles = root.resource("google_project_iam_member", "node_roles")
    assert roles["for_each"] == (
        '${var.node_service_account == "" ? toset(var.node_service_account_roles) : toset([])}'
    )
    assert (roles["role"], roles["member"]) == (
        "${each.value}",
        "serviceAccount:${google_service_account.nodes[0].email}",
    )
    # GKE's minimum role for a node service account, and nothing else by default.
    assert root.variables["node_service_account_roles"]["default"] == [
        "roles/container.defaultNodeServiceAccount"
    ]
    assert root.locals["node_service_account"] == (
        '${var.node_service_account != "" ? var.node_service_account : google_service_account.nodes[0].email}'
    )
    # Always passed to the functions, so a pool never falls back to Compute Engine's default account.
    assert root.locals["function_env"]["NODE_SERVICE_ACCOUNT"] == "${local.node_service_account}"
    assert root.locals["node_pool_creators"] == ["provision", "reconcile"]
    user = root.resource("google_service_account_iam_member", "node_service_account_user")
    assert (
        user["service_account_id"]
        == "projects/${var.project_id}/serviceAccounts/${local.node_service_account}"
    )
    assert user["role"] == "roles/iam.serviceAccountUser"


@needs_terraform
@pytest.mark.parametrize(
    ("roles", "accepted"),
    [
        (["roles/container.defaultNodeServiceAccount"], True),
        (["roles/container.defaultNodeServiceAccount", "roles/artifactregistry.reader"], True),
        (["roles/editor"], False),
        (["roles/owner"], False),
    ],
    ids=["minimum", "with-image-pulls", "editor", "owner"],
)
def test_the_node_account_gets_no_basic_role(tmp_path: Path, roles: list[str], accepted: bool) -> None:
    (tmp_path / "main.tf").write_text(
        hcl_block(INFRA / "variables.tf", 'variable "node_service_account_roles"')
    )
    result = terraform_apply(tmp_path, {"node_service_account_roles": roles})
    assert (result.returncode == 0) is accepted, result.stdout + result.stderr
