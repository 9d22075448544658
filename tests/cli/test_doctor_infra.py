"""What ``tpuprov doctor`` expects is what infra/ deploys: names, roles, grants and APIs read from the
Terraform, so a rename in infra/ fails here instead of making doctor report a healthy deployment broken."""

from __future__ import annotations

import re

from shared.app.deployment import ACCOUNTS
from tests.infra.hcl import INFRA, module
from tpuprov.doctor.views import PUBLISHER_ROLE, SETUP_ROLE, Expected


def _text(path: str) -> str:
    return (INFRA / path).read_text(encoding="utf-8")


def test_service_accounts_roles_and_their_bindings() -> None:
    infra = module()
    functions = infra.locals["functions"]
    assert {f: spec["short"] for f, spec in functions.items()} == ACCOUNTS
    runtime = infra.resource("google_service_account", "runtime")
    assert runtime["account_id"] == "${var.topic_prefix}-${each.value.short}"
    role = infra.resource("google_project_iam_custom_role", "function")
    assert role["role_id"] == '${replace(var.topic_prefix, "-", "_")}_${each.key}'
    assert infra.resource("google_project_iam_member", "setup_cluster_admin")["role"] == SETUP_ROLE
    e = Expected("my-project", "tp-x")
    assert e.service_account("setup_cluster") == "tp-x-setup@my-project.iam.gserviceaccount.com"
    assert e.role_name("release") == "projects/my-project/roles/tp_x_release"
    assert e.role_name("setup_cluster") == SETUP_ROLE


def test_sinks_and_their_writer_grant() -> None:
    main = _text("main.tf")
    assert re.search(r'module "sink" \{.*?name\s+= "\$\{var\.topic_prefix\}-\$\{each\.key\}"', main, re.S)
    writer = module("modules/sink").resource("google_pubsub_topic_iam_member", "writer")
    assert writer["role"] == PUBLISHER_ROLE
    assert writer["member"] == "${google_logging_project_sink.this.writer_identity}"
    assert Expected("p", "tp-x").sink_name("jobset-lifecycle") == "tp-x-jobset-lifecycle"


def test_every_api_doctor_requires_is_one_infra_enables_or_the_cluster_needs() -> None:
    block = re.search(r'resource "google_project_service" "apis" \{(.*?)\n\}', _text("main.tf"), re.S)
    assert block is not None
    enabled = set(re.findall(r'"([a-z]+\.googleapis\.com)"', block.group(1)))
    # Compute Engine too: the functions create tpu7x workload policies through it.
    for delivery in ("push", "eventarc"):
        assert set(Expected("p", delivery=delivery).apis()) - enabled == set()
