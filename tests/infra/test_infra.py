"""Offline checks of infra/: formatting, static analysis, wiring, IAM and the image.

Nothing here talks to Google Cloud or the Terraform registry: the .tf files are parsed with
python-hcl2 and checked structurally, and ``terraform fmt`` and ``checkov`` run when installed.
The Cloud Build files are checked in tests/infra/test_cloudbuild.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.core.settings import Settings
from tests.infra.hcl import INFRA, ROOT, TF_ENV, WIRING, conditioned_on, first, loads, module

SINK_WIRING = {
    "pending-tpu-pods": "provision",
    "nodepool-operations": "provision",
    "workload-quota-reserved": "provision",
    "jobset-lifecycle": "release",
    "cluster-created": "setup_cluster",
}
BROAD_ROLES = {"roles/owner", "roles/editor", "roles/container.admin", "roles/container.clusterAdmin"}
REQUIRED_ENV = {
    "PROJECT_ID",
    "LOCATION",
    "CLUSTER_NAME",
    "NODE_LOCATIONS",
    "NODE_SERVICE_ACCOUNT",
    "NAMESPACE_ALLOWLIST",
    "ALLOWED_ACCELERATORS",
    "MAX_CHIPS_PER_SLICE",
    "CHIP_BUDGET",
    "DRAIN",
    "MAX_EVENT_AGE_SECONDS",
    "RELEASE_GRACE_SECONDS",
    "SUSPEND_GRACE_SECONDS",
    "TPU7X_WORKLOAD_POLICY",
    "MANIFESTS_DIR",
    "JOBSET_VERSION",
    "KUEUE_VERSION",
}

MODULE_DIRS = ["", "modules/pubsub", "modules/sink", "modules/aggregated_sink", "modules/function"]


# --- formatting and static analysis ------------------------------------------------------------


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_fmt(tmp_path: Path) -> None:
    result = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(INFRA)],
        capture_output=True,
        text=True,
        env=TF_ENV,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # fmt ignores *.example; check the example tfvars as a .tfvars file.
    example = tmp_path / "example.tfvars"
    shutil.copy(INFRA / "terraform.tfvars.example", example)
    result = subprocess.run(
        ["terraform", "fmt", "-check", "-diff", str(example)], capture_output=True, text=True, env=TF_ENV
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _checkov() -> str | None:
    # checkov pins packaging<24 and botocore (python-dateutil<3), which the project's .venv cannot
    # hold, so it usually lives in a venv of its own.
    candidates = [
        os.environ.get("CHECKOV_BIN", ""),
        str(ROOT / ".venv-checkov" / "bin" / "checkov"),
        shutil.which("checkov") or "",
        str(Path(sys.executable).parent / "checkov"),
    ]
    return next((c for c in candidates if c and Path(c).is_file() and os.access(c, os.X_OK)), None)


@pytest.mark.slow
@pytest.mark.skipif(
    _checkov() is None, reason="checkov is not installed (pip install checkov, or set CHECKOV_BIN)"
)
def test_checkov_has_no_failed_checks() -> None:
    result = subprocess.run(
        [str(_checkov()), "-d", str(INFRA), "--compact", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert reports, result.stderr
    for report in reports:
        failed = report["results"]["failed_checks"]
        assert failed == [], [(c["check_id"], c["resource"], c["file_path"]) for c in failed]
        for skipped in report["results"]["skipped_checks"]:
            # Every suppression is written inline with its reason.
            assert len(skipped.get("check_result", {}).get("suppress_comment", "").strip()) > 10, skipped


# --- variables and outputs ---------------------------------------------------------------------


@pytest.mark.parametrize("directory", MODULE_DIRS, ids=[d or "root" for d in MODULE_DIRS])
def test_every_variable_is_typed_and_described(directory: str) -> None:
    variables = module(directory).variables
    assert variables
    for name, body in variables.items():
        assert body.get("type"), f"{directory or 'root'}: variable {name} has no type"
        assert len(str(body.get("description", ""))) > 10, (
            f"{directory or 'root'}: variable {name} undescribed"
        )


def test_outputs_cover_topics_and_service_urls() -> None:
    outputs = module().outputs
    for name in ("topics", "dead_letter_topics", "service_urls"):
        assert outputs[name]["description"]
    assert "module.pubsub" in outputs["topics"]["value"]
    assert "service_uri" in outputs["service_urls"]["value"]


def test_tfvars_example_sets_only_declared_variables() -> None:
    example = loads((INFRA / "terraform.tfvars.example").read_text())
    declared = set(module().variables)
    assert set(example) <= declared, set(example) - declared
    required = {n for n, body in module().variables.items() if "default" not in body}
    assert required <= set(example), required - set(example)


def test_image_must_be_a_digest() -> None:
    condition = first(module().variables["image"]["validation"])["condition"]
    pattern = re.search(r'regex\("([^"]+)"', condition)
    assert pattern is not None
    regex = pattern.group(1).replace("\\\\", "\\")
    assert re.search(regex, "us-docker.pkg.dev/p/r/i@sha256:" + "a" * 64)
    assert not re.search(regex, "us-docker.pkg.dev/p/r/i:latest")


# --- the function table and its wiring ----------------------------------------------------------


def test_function_table_matches_the_product_wiring() -> None:
    functions = module().locals["functions"]
    assert {name: (f["source"], f["topic"]) for name, f in functions.items()} == WIRING
    for name, fn in functions.items():
        source = ROOT / fn["source"]
        assert source.is_file(), f"{name}: {fn['source']} does not exist"
        assert re.search(rf"^def {fn['target']}\(", source.read_text(), re.M), (
            f"{name}: no def {fn['target']}"
        )


def test_topic_names_and_dead_letters() -> None:
    root = module()
    prefix = root.variables["topic_prefix"]["default"]
    assert prefix == "tpuprov"
    pubsub_call = root.modules["pubsub"]
    assert pubsub_call["for_each"] == "${local.functions}"
    assert pubsub_call["topic_name"] == "${var.topic_prefix}-${each.value.topic}"
    names = {f"{prefix}-{fn['topic']}" for fn in root.locals["functions"].values()}
    assert names == {
        "tpuprov-pending-pods",
        "tpuprov-jobset-lifecycle",
        "tpuprov-reconcile",
        "tpuprov-setup",
        "tpuprov-kueue",
    }
    pubsub = module("modules/pubsub")
    assert pubsub.resource("google_pubsub_topic", "source")["name"] == "${var.topic_name}"
    assert pubsub.resource("google_pubsub_topic", "dead_letter")["name"] == "${var.topic_name}-dead-letter"
    keeper = pubsub.resource("google_pubsub_subscription", "dead_letter")
    assert keeper["topic"] == "${google_pubsub_topic.dead_letter.id}"
    assert "push_config" not in keeper, "dead letters must be kept on a pull subscription"
    assert first(keeper["expiration_policy"])["ttl"] == ""
    grant = pubsub.resource("google_pubsub_topic_iam_member", "dead_letter_publisher")
    assert (grant["topic"], grant["role"], grant["member"]) == (
        "${google_pubsub_topic.dead_letter.name}",
        "roles/pubsub.publisher",
        "${var.pubsub_service_agent}",
    )


def test_each_sink_reads_its_filter_file_and_feeds_its_functions_topic() -> None:
    root = module()
    assert root.locals["sinks"] == SINK_WIRING
    call = root.modules["sink"]
    assert call["for_each"] == "${local.sinks}"
    assert (
        call["filter"]
        == '${templatefile("${path.module}/../sinks/${each.key}.filter", local.sink_template_vars)}'
    )
    assert call["topic_id"] == "${module.pubsub[each.value].topic_id}"
    assert set(root.locals["sink_template_vars"]) == {"project_id", "clusters"}
    assert root.locals["sink_template_vars"]["project_id"] == "${var.project_id}"
    assert "local.fleet" in root.locals["sink_template_vars"]["clusters"]  # its value: test_iam_scope
    for name in SINK_WIRING:
        assert (ROOT / "sinks" / f"{name}.filter").is_file()

    sink = module("modules/sink")
    body = sink.resource("google_logging_project_sink", "this")
    assert body["destination"] == "pubsub.googleapis.com/${var.topic_id}"
    assert body["filter"] == "${var.filter}"
    assert body["unique_writer_identity"] is True
    grant = sink.resource("google_pubsub_topic_iam_member", "writer")
    assert (grant["topic"], grant["role"], grant["member"]) == (
        "${var.topic_id}",
        "roles/pubsub.publisher",
        "${google_logging_project_sink.this.writer_identity}",
    )
    assert len(sink.of_type("google_pubsub_topic_iam_member")) == 1


def test_each_function_is_fed_by_its_own_topic() -> None:
    call = module().modules["function"]
    assert call["for_each"] == "${local.functions}"
    assert call["topic_id"] == "${module.pubsub[each.key].topic_id}"
    assert call["topic_name"] == "${module.pubsub[each.key].topic_name}"
    assert call["dead_letter_topic_id"] == "${module.pubsub[each.key].dead_letter_topic_id}"
    assert call["service_account_email"] == "${google_service_account.runtime[each.key].email}"
    assert (call["function_source"], call["function_target"]) == (
        "${each.value.source}",
        "${each.value.target}",
    )
    assert call["env"] == "${local.function_env}"


def test_push_subscription_targets_its_service_with_retry_and_dead_letter() -> None:
    fn = module("modules/function")
    sub = fn.resource("google_pubsub_subscription", "push")
    assert sub["topic"] == "${var.topic_id}"
    push = first(sub["push_config"])
    assert push["push_endpoint"].startswith("${google_cloud_run_v2_service.this.uri}/")
    oidc = first(push["oidc_token"])
    assert oidc == {
        "service_account_email": "${google_service_account.invoker[0].email}",
        "audience": "${google_cloud_run_v2_service.this.uri}",
    }
    retry = first(sub["retry_policy"])
    assert (retry["minimum_backoff"], retry["maximum_backoff"]) == ("10s", "600s")
    dead = first(sub["dead_letter_policy"])
    assert dead == {
        "dead_letter_topic": "${var.dead_letter_topic_id}",
        "max_delivery_attempts": "${var.max_delivery_attempts}",
    }
    assert sub["message_retention_duration"] == "${var.message_retention}"
    assert first(sub["expiration_policy"])["ttl"] == ""
    subscriber = fn.resource("google_pubsub_subscription_iam_member", "dead_letter_subscriber")
    assert (subscriber["subscription"], subscriber["role"], subscriber["member"]) == (
        "${google_pubsub_subscription.push[0].name}",
        "roles/pubsub.subscriber",
        "${var.pubsub_service_agent}",
    )
    invoker = fn.resource("google_cloud_run_v2_service_iam_member", "invoker")
    assert (invoker["name"], invoker["role"], invoker["member"]) == (
        "${google_cloud_run_v2_service.this.name}",
        "roles/run.invoker",
        "serviceAccount:${google_service_account.invoker[0].email}",
    )
    # The push path is the default delivery; tests/infra/test_monitoring.py checks the eventarc one.
    for type_, name in (
        ("google_service_account", "invoker"),
        ("google_cloud_run_v2_service_iam_member", "invoker"),
        ("google_service_account_iam_member", "token_creator"),
        ("google_pubsub_subscription", "push"),
        ("google_pubsub_subscription_iam_member", "dead_letter_subscriber"),
    ):
        assert fn.resource(type_, name)["count"] == "${local.push ? 1 : 0}", (type_, name)
    assert fn.locals["push"] == '${var.delivery == "push"}'
    assert module().variables["delivery"]["default"] == "push"
    bounded = {name: body["retention"] for name, body in module().locals["functions"].items()}
    for name, retention in bounded.items():
        assert 600 <= int(retention.rstrip("s")) <= 7 * 86400, name


def test_cloud_run_service_is_internal_and_scales_to_zero() -> None:
    service = module("modules/function").resource("google_cloud_run_v2_service", "this")
    assert service["ingress"] == "INGRESS_TRAFFIC_INTERNAL_ONLY"
    template = first(service["template"])
    assert template["service_account"] == "${var.service_account_email}"
    assert first(template["scaling"])["min_instance_count"] == 0
    container = first(template["containers"])
    assert container["image"] == "${var.image}"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"FUNCTION_TARGET": "${var.function_target}", "FUNCTION_SOURCE": "${var.function_source}"}
    functions = module().locals["functions"]
    for name in ("provision", "release"):
        assert 8 <= functions[name]["concurrency"] <= 20, name
        assert functions[name]["timeout_seconds"] <= 120, name
    for name in ("setup_cluster", "apply_kueue", "reconcile"):
        assert functions[name]["concurrency"] == 1, name
        assert functions[name]["max_instances"] == 1, name
    assert functions["setup_cluster"]["timeout_seconds"] >= 300
    assert all(f["timeout_seconds"] <= 3600 and f["max_instances"] >= 1 for f in functions.values())


def test_no_public_invoker_anywhere() -> None:
    for directory in MODULE_DIRS:
        text = module(directory).text
        assert "allUsers" not in text and "allAuthenticatedUsers" not in text, directory
        assert "INGRESS_TRAFFIC_ALL" not in text, directory


def test_function_env_matches_settings() -> None:
    env = module().locals["function_env"]
    assert set(env) >= REQUIRED_ENV
    fields = {field.name.upper() for field in dataclasses.fields(Settings)}
    assert set(env) <= fields, set(env) - fields


def test_reconcile_tick_every_five_minutes() -> None:
    root = module()
    job = root.resource("google_cloud_scheduler_job", "reconcile")
    assert first(job["pubsub_target"])["topic_name"] == '${module.pubsub["reconcile"].topic_id}'
    assert job["schedule"] == "${var.reconcile_schedule}"
    assert root.variables["reconcile_schedule"]["default"] == "*/5 * * * *"


# --- IAM ---------------------------------------------------------------------------------------


def test_broad_roles_only_on_the_setup_function() -> None:
    root = module()
    grants = root.of_type("google_project_iam_member")
    # The dedicated node service account's least-privilege roles (tests/infra/test_iam_scope.py).
    node_roles = grants.pop("node_roles")
    assert node_roles["member"] == "serviceAccount:${google_service_account.nodes[0].email}"
    # The same roles for each other fleet project's node account (tests/infra/test_fleet.py).
    fleet_node_roles = grants.pop("fleet_node_roles")
    assert fleet_node_roles["member"] == (
        "serviceAccount:${google_service_account.fleet_nodes[each.value.project].email}"
    )
    assert "var.node_service_account_roles" in module().locals["fleet_node_roles"]
    # The other fleet projects' copies (tests/infra/test_iam_scope.py): the same roles, bound to the
    # same accounts; Kubernetes Engine Admin there to the setup function only.
    fleet_admin = grants.pop("fleet_setup_cluster_admin")
    assert fleet_admin["role"] == "roles/container.admin"
    assert fleet_admin["member"] == 'serviceAccount:${google_service_account.runtime["setup_cluster"].email}'
    fleet_roles = grants.pop("fleet_function")
    assert fleet_roles["role"] == "${google_project_iam_custom_role.fleet_function[each.key].id}"
    # The reservation reads in the projects owning shared reservations (tests/infra/test_fleet.py).
    readers = grants.pop("reservation_reader")
    assert readers["role"] == "${google_project_iam_custom_role.reservation_reader[each.value.project].id}"
    seen_event_grant = False
    for name, grant in grants.items():
        member = grant["member"]
        assert member.startswith("serviceAccount:${google_service_account.runtime["), (name, member)
        if grant["role"] in BROAD_ROLES:
            assert member == 'serviceAccount:${google_service_account.runtime["setup_cluster"].email}', name
            assert grant["role"] == "roles/container.admin"
            # Held on the managed cluster and SETUP_CLUSTERS only, never on every cluster of the project.
            assert conditioned_on(grant) == "module.setup_cluster_condition.expression"
        else:
            # Per-function custom roles, bound to the same function's account.
            assert grant["role"] == "${google_project_iam_custom_role.function[each.key].id}", name
            assert grant["for_each"] == "${local.custom_role_permissions}"
            assert member == "serviceAccount:${google_service_account.runtime[each.key].email}"
            seen_event_grant = True
    assert seen_event_grant
    assert root.locals["custom_role_permissions"] == '${jsondecode(file("${path.module}/roles.json"))}'
    assert "setup_cluster" not in json.loads((INFRA / "roles.json").read_text())
    for directory in MODULE_DIRS:
        for type_, _ in module(directory).resources:
            assert not type_.endswith(("_iam_binding", "_iam_policy")), (
                f"authoritative IAM in {directory}: {type_}"
            )
        for role in BROAD_ROLES - {"roles/container.admin"}:
            assert role not in module(directory).text, (directory, role)
    # The setup function's, in this project and in each other fleet project.
    assert module().text.count("roles/container.admin") == 2


# --- image -------------------------------------------------------------------------------------


def test_dockerfile_serves_the_selected_function() -> None:
    dockerfile = (INFRA / "image" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    assert "COPY build/manifests/ manifests/" in dockerfile and "WORKDIR /app" in dockerfile
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    for flag in (
        '--source=\\"$FUNCTION_SOURCE\\"',
        '--target=\\"$FUNCTION_TARGET\\"',
        "--signature-type=cloudevent",
    ):
        assert flag in cmd
    assert re.search(r"^USER \d+", dockerfile, re.M), "run as a non-root user"


# --- what the push subscription delivers -------------------------------------------------------

RECORDER = """
import json
import os

import functions_framework


@functions_framework.cloud_event
def record(cloud_event):
    with open(os.environ["RECORD_TO"], "a") as out:
        record = {"attributes": dict(cloud_event.get_attributes()), "data": cloud_event.data}
        out.write(json.dumps(record) + "\\n")
"""


def test_functions_framework_accepts_the_push_subscriptions_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """modules/function pushes the raw Pub/Sub body (no Eventarc) to <uri>/projects/P/topics/T;
    functions-framework must turn it into the CloudEvent the functions decode."""
    import functions_framework
    from cloudevents.http import CloudEvent

    from shared.events import entries as logentries
    from shared.events.envelope import ClusterId, PodUnschedulable, decode_cloud_event

    source = tmp_path / "main.py"
    source.write_text(RECORDER)
    monkeypatch.setenv("RECORD_TO", str(tmp_path / "received.jsonl"))
    app = functions_framework.create_app("record", str(source), "cloudevent")
    cluster = ClusterId("p1", "us-central2-b", "c1")
    entry = logentries.pod_event_entry(cluster, "team-a", "train-0", "", controller=("JobSet", "train"))
    body = {"message": logentries.pubsub_message(entry), "subscription": "projects/p1/subscriptions/x-push"}

    response = app.test_client().post("/projects/p1/topics/tpuprov-pending-pods", json=body)

    assert response.status_code == 200, response.get_data(as_text=True)
    [line] = (tmp_path / "received.jsonl").read_text().splitlines()
    record = json.loads(line)
    event = CloudEvent(record["attributes"], record["data"])
    assert event["type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert event["source"] == "//pubsub.googleapis.com/projects/p1/topics/tpuprov-pending-pods"
    decoded = decode_cloud_event(event).event
    assert isinstance(decoded, PodUnschedulable)
    assert (decoded.cluster, decoded.namespace, decoded.pod) == (cluster, "team-a", "train-0")
