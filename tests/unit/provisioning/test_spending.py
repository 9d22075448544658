"""Who may spend what, as a tenant meets it on the pending-pod path: the budget each create is
charged to (named in its Event), a budget that runs out mid-JobSet, and a reservation reached through
the ``tpuprov.dev/capacity-policy`` annotation that the namespace's TENANTS entry does not list."""

from __future__ import annotations

import json
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from tests.unit.provisioning.releases import CLUSTER, SETTINGS, now, submit

TENANTS = {"team-a": {"chips": 8, "reservations": ["res-a"]}}
SPENDING = SETTINGS.with_overrides(unlimited_spending=False, tenants=json.dumps(TENANTS))


def _pending(gke: FakeGke, kube: FakeKube, jobset: dict[str, Any]) -> None:
    pods = submit(kube, jobset)
    Provisioner(Services(SPENDING, gke, kube)).handle_pending_pod(
        "team-a", pods[0]["metadata"]["name"], now()
    )


def _messages(kube: FakeKube, reason: str, name: str) -> list[str]:
    return [e["message"] for e in kube.events if e["reason"] == reason and e["name"] == name]


def test_each_create_names_its_budget_and_the_one_past_it_is_refused(gke: FakeGke, kube: FakeKube) -> None:
    # Two 8-chip v6e 2x4 slices against an 8-chip budget: one is bought, the other refused.
    _pending(gke, kube, tpu_jobset("two", "team-a", replicas=2, topology="2x4"))

    assert len(gke.managed_names(CLUSTER)) == 1
    [requested] = _messages(kube, labels.REASON_REQUESTED, "two")
    assert 'charged to TENANTS["team-a"]' in requested
    # On the JobSet (kubectl describe jobset) as on the pod.
    refused = _messages(kube, labels.REASON_REFUSED, "two")
    assert any('TENANTS["team-a"] chip budget exceeded: 8 chips held + 8 requested > 8' in m for m in refused)


def test_a_reservation_named_by_the_capacity_policy_annotation_is_checked_against_tenants(
    gke: FakeGke, kube: FakeKube
) -> None:
    # The annotation is the tenant's: naming another team's reservation there buys nothing.
    policy = {labels.CAPACITY_POLICY: "reservation:res-b"}
    _pending(gke, kube, tpu_jobset("theirs", "team-a", replicas=1, topology="2x4", annotations=policy))

    assert gke.managed_names(CLUSTER) == []
    refused = _messages(kube, labels.REASON_REFUSED, "theirs")
    assert any('TENANTS["team-a"] does not list reservation res-b' in m for m in refused), refused
