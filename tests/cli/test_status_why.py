"""``tpuprov status`` and ``tpuprov why`` against the emulators: golden table and JSON, and explanations.

The cluster is built the way the product builds it: pools are created through the production GKE
adapter from the same derivation provision runs (``slice_request`` -> ``build_node_pool``), one of
them stocks out in the GKE emulator, and pods, nodes and JobSets are objects in the Kubernetes API.
JobSet uids are fixed and the clock is pinned, so names, ages and costs are stable. Set
``UPDATE_GOLDEN=1`` to rewrite the golden files after an intended change (and review the diff).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.jobsets import tpu_jobset
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import connect
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.release.releaser import Releaser
from shared.tpu.jobsets import JobSet, expand_jobs, expand_pods, link_pods
from shared.tpu.nodes import Node
from shared.tpu.slices import build_node_pool, slice_request
from tpuprov import status
from tpuprov.cluster import ClusterView
from tpuprov.main import main
from tpuprov.why import explain

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).parent / "golden"
NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
CREATED = "2026-11-23T09:30:00Z"  # every node was created 2.5 h before NOW


def _uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _completed(jobset: dict[str, Any]) -> dict[str, Any]:
    jobset["status"] = {
        "conditions": [
            {
                "type": "Completed",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",  # the controller's (a required field)
                "lastTransitionTime": CREATED,
            }
        ]
    }
    return jobset


def _node(name: str, pool: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {labels.NODEPOOL: pool, **(extra or {})}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
def cluster(world: Any) -> dict[str, Any]:
    """Four JobSets' worth of pools in the states an operator meets, and a refused pod."""
    api = GkeNodePoolAPI(endpoint=world.gke.url)
    kube = world.kube
    train = tpu_jobset(
        "train", "team-a", replicas=1, accelerator="tpu-v5-lite-podslice", topology="2x4", uid=_uid(1)
    )
    done = _completed(
        tpu_jobset(
            "done", "team-a", replicas=1, accelerator="tpu-v5-lite-podslice", topology="2x4", uid=_uid(2)
        )
    )
    gone = tpu_jobset(
        "gone", "team-b", replicas=1, accelerator="tpu-v5-lite-podslice", topology="2x4", uid=_uid(3)
    )
    starved = tpu_jobset(
        "starved", "team-b", replicas=1, accelerator="tpu-v6e-slice", topology="2x2", uid=_uid(4)
    )
    bad = tpu_jobset(
        "bad",
        "team-b",
        replicas=1,
        accelerator="tpu-v6e-slice",
        topology="2x2",
        uid=_uid(5),
        selectors={"tpuprov.dev/jobset-name": "forged"},
    )
    # The API server assigns uids; the pools must be derived from the JobSets as stored.
    train, done, starved, bad = (kube.put(js) for js in (train, done, starved, bad))
    pools: dict[str, str] = {}
    cluster_info = api.get_cluster(world.settings.cluster_path)
    world.gke.set_op_delay(0)
    for jobset in (train, done, gone, starved):
        if jobset is starved:
            world.gke.stockout(message="GCE_STOCKOUT: no capacity for ct6e-standard-4t in us-central2-b")
        pod = expand_pods(jobset)[0]
        spec, _ = build_node_pool(world.settings, slice_request(pod), cluster_info)
        api.create_node_pool(world.settings.cluster_path, spec, "test")
        pools[jobset["metadata"]["name"]] = spec.name
    world.gke.finish_operations()
    # train runs on its own pool, and one more of its pods on the deleted JobSet's (spot) pool.
    # Their Jobs first, as the JobSet controller makes them: a pod counts on a pool only through its
    # Job (labels prove nothing), and the API server assigns the Jobs' uids.
    jobs = [kube.put(job) for js in (train, starved, bad) for job in expand_jobs(js)]
    train_pods = link_pods(expand_pods(train, pending=False), jobs)
    nodes = [_node(f"{pools[k]}-n{i}", pools[k]) for k in ("train", "done", "gone") for i in range(2)]
    nodes[4]["metadata"]["labels"][labels.SPOT] = "true"
    for node in nodes:
        kube.put(node)
    for i, pod in enumerate(train_pods):
        pod["spec"]["nodeName"] = nodes[i]["metadata"]["name"]
        pod["status"] = {"phase": "Running"}
        kube.put(pod)
    extra = link_pods(expand_pods(train, pending=False), jobs)[0]
    extra["metadata"]["name"] = "train-slice-0-extra"
    extra["spec"]["nodeName"] = nodes[4]["metadata"]["name"]
    extra["status"] = {"phase": "Running"}
    kube.put(extra)
    for jobset in (starved, bad):
        kube.put(link_pods(expand_pods(jobset), jobs)[0])
    # Release for the deleted JobSet, as its audit entry triggers it: train runs on that pool, so the
    # product hands the pool over to train instead of deleting it.
    release = str(world.kube.kubeconfig_for("release"))  # as the release function's identity
    settings = world.settings.with_overrides(cordon_settle_seconds=0, kubeconfig=release)
    released = Releaser(settings, api, connect(settings, lambda: api)).release("team-b", "gone", "", "test")
    assert released == []
    world.gke.finish_operations()
    # The CLI runs as the operator, with the cluster's admin kubeconfig.
    operator = world.settings.with_overrides(kubeconfig=str(world.kube.kubeconfig))
    return {"pools": pools, "view": ClusterView(operator)}


def _rows(view: ClusterView) -> list[status.PoolRow]:
    # The API server stamps nodes with the wall clock: pin them to the fixture's time.
    nodes = [dataclasses.replace(node, created=CREATED) for node in view.nodes()]
    prices = status.Prices.load()
    return status.pool_rows(
        view.pools(), view.jobsets(), view.pods(), nodes, prices, NOW, view.settings, jobs=view.jobs()
    )


def _golden(name: str, text: str) -> None:
    # Pool names end in a hash of the JobSet's uid, which the API server assigns: mask it.
    text = re.sub(r"(tpu-[a-z0-9-]+-)[0-9a-f]{16}\b", r"\1################", text)
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_status_table_matches_golden(cluster: dict[str, Any]) -> None:
    _golden("status.txt", status.render_table(_rows(cluster["view"]), status.Prices.load()))


def test_status_json_matches_golden(cluster: dict[str, Any]) -> None:
    _golden("status.json", status.render_json(_rows(cluster["view"]), status.Prices.load()))


def test_status_rows_say_who_owns_who_runs_and_what_leaks(cluster: dict[str, Any]) -> None:
    rows = {r.name: r for r in _rows(cluster["view"])}
    rows.update({r.owner: r for r in _rows(cluster["view"]) if not r.handed_over_from})
    assert rows["team-a/train"].running == ("team-a/train",) and not rows["team-a/train"].leak
    assert rows["team-a/done"].owner_state == "completed" and rows["team-a/done"].leak
    # The deleted JobSet's pool, busy with another JobSet's pod, was handed over to it: not a leak.
    handed = next(r for r in rows.values() if r.handed_over_from == "gone")
    assert (handed.owner, handed.owner_state, handed.running) == (
        "team-a/train",
        "running",
        ("team-a/train",),
    )
    assert not handed.leak and handed.capacity == "spot"
    assert rows["team-b/starved"].state == "ERROR" and "GCE_STOCKOUT" in rows["team-b/starved"].message


def test_status_command_json_and_leaks(
    cluster: dict[str, Any], world: Any, monkeypatch: Any, capsys: Any
) -> None:
    for key, value in {
        "PROJECT_ID": world.settings.project_id,
        "LOCATION": world.settings.location,
        "CLUSTER_NAME": world.settings.cluster_name,
        "GKE_API_ENDPOINT": world.gke.url,
        "KUBECONFIG": str(world.kube.kubeconfig),
    }.items():
        monkeypatch.setenv(key, value)
    assert main(["status", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["pools"] == 4 and doc["totals"]["leaks"] == 1
    assert doc["admission_check"] is None  # no Kueue check on this cluster: no section
    assert main(["status", "-o", "yaml"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    # Ages and costs so far follow the wall clock between the two calls; everything else is the same.
    volatile = ("age_seconds", "cost_so_far")
    assert [{k: v for k, v in p.items() if k not in volatile} for p in as_yaml["pools"]] == [
        {k: v for k, v in p.items() if k not in volatile} for p in doc["pools"]
    ]
    assert main(["status", "--leaks"]) == 1, "--leaks exits 1 when it finds one (for scripts and alerts)"
    out = capsys.readouterr().out
    assert cluster["pools"]["done"] in out and cluster["pools"]["train"] not in out
    # Deployed with a long release grace, the completed JobSet's pool is kept on purpose: no leak.
    monkeypatch.setenv("RELEASE_GRACE_SECONDS", str(10**9))
    assert main(["status", "--leaks"]) == 0
    assert capsys.readouterr().out == "No leaked TPU node pools.\n"
    assert main(["status", "-o", "json"]) == 0
    [done] = [p for p in json.loads(capsys.readouterr().out)["pools"] if p["owner"] == "team-a/done"]
    assert (done["next"], done["leak"]) == ("keep", False)
    assert done["why"].startswith("JobSet team-a/done completed") and "grace is 1000000000s" in done["why"]


def _why(view: ClusterView, namespace: str, name: str) -> str:
    pod = view.pod(namespace, name)
    return explain(
        pod,
        view.jobset(namespace, pod.labels[labels.JOBSET_NAME]),
        view.events_about("Pod", namespace, name, pod.uid),
        view.pools(),
        view.nodes(),
        view.settings,
        view.cluster(),
    )


def test_why_explains_each_case(cluster: dict[str, Any]) -> None:
    view = cluster["view"]
    running = _why(view, "team-a", "train-slice-0-0-r0")
    assert "has its slice" in running and cluster["pools"]["train"] in running
    stocked_out = _why(view, "team-b", "starved-slice-0-0-r0")
    assert "GKE could not create its pool" in stocked_out and "GCE_STOCKOUT" in stocked_out
    assert "reconcile" in stocked_out
    refused = _why(view, "team-b", "bad-slice-0-0-r0")
    assert refused.startswith("Pod team-b/bad-slice-0-0-r0 was refused a slice") and "reserved" in refused


def test_why_command_for_a_jobset_and_a_missing_pod(
    cluster: dict[str, Any], world: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setenv("PROJECT_ID", world.settings.project_id)
    monkeypatch.setenv("LOCATION", world.settings.location)
    monkeypatch.setenv("CLUSTER_NAME", world.settings.cluster_name)
    monkeypatch.setenv("GKE_API_ENDPOINT", world.gke.url)
    monkeypatch.setenv("KUBECONFIG", str(world.kube.kubeconfig))
    assert main(["why", "--jobset", "team-b/starved"]) == 0
    text = capsys.readouterr().out
    assert "GCE_STOCKOUT" in text
    assert main(["why", "--jobset", "team-b/starved", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"pod": "team-b/starved-slice-0-0-r0", "explanation": text.rstrip("\n")}
    ]
    assert main(["why", "team-b/nope"]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_flex_start_pool_without_nodes_shows_as_waiting_and_costs_nothing() -> None:
    from shared.tpu.nodepools import NodePoolInfo

    owner = {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: "team-a",
        labels.OWNER_NAME: "flex",
    }
    pool = NodePoolInfo(
        name="tpu-flex-slice-0-1",
        status="RUNNING",
        machine_type="ct6e-standard-4t",
        node_count=4,
        labels=owner,
        node_locations=("us-east5-b",),
        flex_start=True,
    )
    prices = status.Prices({"v6e": {"flex-start": 1.0, "on-demand": 2.7}})
    now = datetime.datetime.now(tz=datetime.UTC)
    jobset = tpu_jobset("flex", "team-a")
    [row] = status.pool_rows([pool], [JobSet.parse(jobset)], [], [], prices, now, Settings())
    assert (row.state, row.nodes, row.capacity, row.cost_per_hour) == ("WAITING", 0, "flex-start", 0.0)
    node = Node("n1", {labels.NODEPOOL: pool.name})
    [row] = status.pool_rows([pool], [JobSet.parse(jobset)], [], [node], prices, now, Settings())
    assert (row.state, row.nodes) == ("RUNNING", 1) and row.cost_per_hour


def test_status_notes_pools_built_under_settings_since_changed(cluster: dict[str, Any]) -> None:
    # The operator has since given the nodes their own service account and bigger disks; the pools
    # GKE reports were built before (read back through the real client from the GKE emulator).
    view = cluster["view"]
    changed = view.settings.with_overrides(
        node_service_account="tpu-nodes@test-proj.iam.gserviceaccount.com", disk_size_gb=200
    )
    nodes = [dataclasses.replace(node, created=CREATED) for node in view.nodes()]
    prices = status.Prices.load()
    rows = status.pool_rows(
        view.pools(), view.jobsets(), view.pods(), nodes, prices, NOW, changed, jobs=view.jobs()
    )
    same = {(r.name, r.leak, r.next) for r in _rows(view)}
    assert {(r.name, r.leak, r.next) for r in rows} == same  # drift is no leak and changes no fate
    assert {r.drift for r in rows} == {
        (
            "NODE_SERVICE_ACCOUNT: default -> tpu-nodes@test-proj.iam.gserviceaccount.com",
            "DISK_SIZE_GB: 100 -> 200",
        )
    }
    _golden("status_drift.txt", status.render_table(rows, prices))
    assert all(
        p["drift"] == list(rows[0].drift) for p in json.loads(status.render_json(rows, prices))["pools"]
    )
