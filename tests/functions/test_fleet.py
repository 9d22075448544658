"""Wire level: one deployment serving several clusters (FLEET_CLUSTERS), each delivery on the
cluster its event names.

The GKE emulator knows three clusters; two of them ("home", the managed one, and "second") are
served by the real API server (a kubeconfig context each, named as ``gcloud container clusters
get-credentials`` names them), the third ("down") by a port nothing listens on. A fourth cluster
is outside the fleet.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.emulators.iam import Iam, load_roles
from sandbox.emulators.sockets import free_port
from sandbox.jobsets import tpu_jobset
from sandbox.kube import kubeconfig
from sandbox.kube.api import ApiError
from sandbox.polling import eventually
from sandbox.stack.config import REPO_ROOT
from sandbox.testing.fixtures.kube import KubeHandle
from sandbox.testing.fnclient import LoggedFunction, served_function
from sandbox.testing.gke import rest_client
from shared.core import labels
from shared.core.settings import Settings, fleet_context
from shared.events import entries as logentries
from shared.events.envelope import ClusterId
from tests.functions.deliveries import pending_event
from tpuprov.cluster import fleet_clusters
from tpuprov.doctor.run import fleet_of
from tpuprov.main import main

pytestmark = pytest.mark.integration

PROJECT, LOCATION = "test-proj", "us-central2-b"
HOME = ClusterId(PROJECT, LOCATION, "home")
SECOND = ClusterId(PROJECT, LOCATION, "second")
DOWN = ClusterId(PROJECT, LOCATION, "down")
OUTSIDER = ClusterId("someone-else", LOCATION, "theirs")
# A cluster of a FLEET_PROJECTS project, in the fleet only while it carries the fleet label.
LABELLED = ClusterId("team-b-proj", "us-east5-a", "train")
MANAGED = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"


@pytest.fixture
def gke() -> Iterator[GkeEmulator]:
    seeds = [
        ClusterSeed(c.project, c.location, c.name, locations=(c.location,))
        for c in (HOME, SECOND, DOWN, LABELLED)
    ]
    emulator = GkeEmulator(seeds, op_delay=0)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


def fleet_kubeconfig(kube: KubeHandle, function: str, folder: Path) -> Path:
    """The function's kubeconfig with a context per fleet cluster: home is the current context,
    second and labelled the same API server under their gcloud names, down a port nothing
    listens on."""
    base = kube.kubeconfig_for(function)
    same = kubeconfig.load(base)
    dead = copy.deepcopy(same)
    for cluster in dead["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    contexts = {fleet_context(c.project, c.location, c.name): same for c in (SECOND, LABELLED)}
    contexts[fleet_context(DOWN.project, DOWN.location, DOWN.name)] = dead
    return kubeconfig.with_contexts(base, contexts, folder / f"kubeconfig-fleet-{function}")


def label_into_fleet(gke: GkeEmulator, cluster: ClusterId) -> None:
    """Label ``cluster`` into the fleet as `gcloud container clusters update --update-labels` does:
    setResourceLabels with the fingerprint of the labels it replaces."""
    client = rest_client(gke.url)
    found = client.get_cluster(name=cluster.path)
    client.set_labels(
        request={
            "name": cluster.path,
            "resource_labels": {**found.resource_labels, "tpuprov": "enabled"},
            "label_fingerprint": found.label_fingerprint,
        }
    )


@pytest.fixture
def serve(gke: GkeEmulator, kube_server: KubeHandle, tmp_path: Path) -> Any:
    def start(function: str, overrides: str = "", **more: Any) -> Any:
        settings = Settings(
            **more,
            fleet_overrides=overrides,
            unlimited_spending=True,
            project_id=HOME.project,
            location=HOME.location,
            cluster_name=HOME.name,
            fleet_clusters=(SECOND.path, DOWN.path),
            gke_api_endpoint=gke.url,
            kubeconfig=str(fleet_kubeconfig(kube_server, function, tmp_path)),
            event_coalesce_seconds=0,
            # apply_kueue's bounds: an unreachable cluster's apply gives up in seconds, not minutes
            setup_timeout_seconds=5,
            setup_webhook_retry_seconds=1,
            setup_poll_interval_ms=10,
        )
        return served_function(function, settings, f"tpuprov-{function}")

    return start


def names(gke: GkeEmulator, cluster: ClusterId) -> list[str]:
    return sorted(p["name"] for p in gke.pools(cluster.path))


def test_each_delivery_creates_the_pool_in_the_cluster_its_event_names(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-a", "team-a", replicas=1))
    function: LoggedFunction
    with serve("provision") as function:
        assert function.function.post_entry(pending_event(pods[0], cluster=SECOND)).status_code == 200
        [created] = function.events("provision.created")
    [pool] = gke.pools(SECOND.path)
    assert names(gke, HOME) == [] and names(gke, DOWN) == []
    assert pool["config"]["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
    assert created["cluster"] == SECOND.path  # every line of the delivery names its cluster


def test_status_and_why_read_the_fleet_cluster_they_are_pointed_at(
    gke: GkeEmulator,
    kube_server: KubeHandle,
    serve: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-s", "team-a", replicas=1))
    with serve("provision") as function:
        assert function.function.post_entry(pending_event(pods[0], cluster=SECOND)).status_code == 200
    [pool] = names(gke, SECOND)
    # The operator's shell: the managed cluster, the fleet, and a kubeconfig holding each cluster's
    # context as `gcloud container clusters get-credentials` names it.
    admin = kube_server.kubeconfig
    contexts = {fleet_context(SECOND.project, SECOND.location, SECOND.name): kubeconfig.load(admin)}
    merged = kubeconfig.with_contexts(admin, contexts, tmp_path / "operator-kubeconfig")
    env = {
        "PROJECT_ID": HOME.project,
        "LOCATION": HOME.location,
        "CLUSTER_NAME": HOME.name,
        "FLEET_CLUSTERS": f"{SECOND.path},{DOWN.path}",
        "GKE_API_ENDPOINT": gke.url,
        "KUBECONFIG": str(merged),
        "UNLIMITED_SPENDING": "true",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def status(*more: str) -> tuple[int, dict[str, Any]]:
        capsys.readouterr()
        code = main(["status", "-o", "json", *more])
        return code, json.loads(capsys.readouterr().out)

    # Without a flag: every cluster of the fleet, one section each. "down" has no context in this
    # kubeconfig (and nothing listens for it): said, the others shown, exit 2.
    code, fleet = status()
    by_cluster = {c["cluster"]: c for c in fleet["clusters"]}
    assert code == 2 and list(by_cluster) == [HOME.path, SECOND.path, DOWN.path]
    assert by_cluster[HOME.path]["pools"] == []  # the managed cluster has none
    assert [row["name"] for row in by_cluster[SECOND.path]["pools"]] == [pool]
    assert by_cluster[DOWN.path]["error"] and "pools" not in by_cluster[DOWN.path]
    assert main(["status"]) == 2
    table = capsys.readouterr()
    assert f"== Cluster {SECOND.path}\n" in table.out and pool in table.out
    assert f"tpuprov status: {DOWN.path}: " in table.err
    code, second = status("--fleet-cluster", SECOND.name)
    assert code == 0 and [row["name"] for row in second["pools"]] == [pool]
    code, by_path = status("--fleet-cluster", SECOND.path)
    assert [row["name"] for row in by_path["pools"]] == [pool]
    assert main(["status", "--fleet-cluster", "theirs"]) == 2
    assert "is not a cluster of the fleet" in capsys.readouterr().err
    # why reads the JobSet in the cluster it is pointed at and names the pool it got there.
    assert main(["why", "team-a/fleet-s", "--jobset", "--fleet-cluster", SECOND.name]) in (0, 1)
    assert pool in capsys.readouterr().out
    # Without the flag why follows the JobSet over the fleet: home and second share one API
    # server here, so both hold it; each paragraph names its cluster, and "down" is said on stderr.
    assert main(["why", "team-a/fleet-s", "--jobset"]) == 0
    said = capsys.readouterr()
    [second_said] = [line for line in said.out.splitlines() if line.startswith("[second] ")]
    assert pool in second_said and "[home] " in said.out
    assert f"tpuprov why: {DOWN.path}: " in said.err
    assert main(["why", "team-a/nowhere", "--jobset"]) == 2
    assert "not found in any cluster of the fleet" in capsys.readouterr().err


def test_an_unreachable_cluster_is_redelivered_and_delays_no_other(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-b", "team-a", replicas=1))
    with serve("provision") as function:
        down = function.function.post_entry(pending_event(pods[0], cluster=DOWN))
        home = function.function.post_entry(pending_event(pods[0], cluster=HOME))
        [retry] = function.events("delivery.retry")
    assert down.status_code == 503  # its own message comes back; nothing is lost
    assert retry["cluster"] == DOWN.path
    assert home.status_code == 200
    assert len(names(gke, HOME)) == 1 and names(gke, DOWN) == []


def test_an_event_of_a_cluster_outside_the_fleet_is_acknowledged_counted_and_costs_no_call(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-c", "team-a", replicas=1))
    with serve("provision") as function:
        for _ in range(3):
            assert function.function.post_entry(pending_event(pods[0], cluster=OUTSIDER)).status_code == 200
        said = function.events("provision.ignored")
    assert gke.calls == []  # not one GKE request, not even the cluster lookup
    # Said once at INFO; the repeats only at DEBUG (not in the deployed log), with their count.
    [first] = said
    assert first["count"] == 1 and OUTSIDER.path in first["message"]
    assert HOME.path in first["message"] and SECOND.path in first["message"]


def test_a_reconcile_tick_sweeps_every_fleet_cluster_and_a_failing_one_stops_none(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-d", "team-a", replicas=1))
    with serve("provision") as function:
        for cluster in (HOME, SECOND):
            assert function.function.post_entry(pending_event(pods[0], cluster=cluster)).status_code == 200
    assert len(names(gke, HOME)) == 1 and len(names(gke, SECOND)) == 1
    kube_server.delete("jobset.x-k8s.io/v1alpha2", "jobsets", "team-a", "fleet-d")

    with serve("reconcile") as function:
        tick = function.post(b"{}")  # Cloud Scheduler's tick: the payload does not matter
        failed = function.events("reconcile.failed")
    # The JobSet is gone: both reachable clusters' pools go in the same tick, whatever "down" does.
    assert names(gke, HOME) == [] and names(gke, SECOND) == []
    assert [f["cluster"] for f in failed] == [DOWN.path]
    assert tick.status_code == 503  # redelivered for the cluster that failed


DISCOVERY_SECONDS = 2  # FLEET_DISCOVERY_SECONDS for the test below (the deployed default is 300)


def test_a_cluster_labelled_into_the_fleet_is_served_within_the_ttl_without_a_redeploy(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-f", "team-a", replicas=1))
    with serve(
        "provision", fleet_projects=("team-b-proj",), fleet_discovery_seconds=DISCOVERY_SECONDS
    ) as function:
        # Not labelled: acknowledged, said, and no pool (one listing of the project answers).
        assert function.function.post_entry(pending_event(pods[0], cluster=LABELLED)).status_code == 200
        assert names(gke, LABELLED) == [] and function.events("provision.ignored")
        label_into_fleet(gke, LABELLED)
        labelled_at = time.monotonic()

        def served() -> bool:
            response = function.function.post_entry(pending_event(pods[0], cluster=LABELLED))
            assert response.status_code == 200
            return bool(names(gke, LABELLED))

        # The same deployment, no restart: served once the project's listing is older than the TTL.
        eventually(served, 10 * DISCOVERY_SECONDS, "the labelled cluster to be served", interval=0.5)
        joined = function.events("fleet.discovered")
    assert time.monotonic() - labelled_at <= 10 * DISCOVERY_SECONDS
    assert any(f"joined {LABELLED.path}" in line["message"] for line in joined)
    assert names(gke, HOME) == [] and names(gke, SECOND) == []


def test_doctor_and_status_cover_a_cluster_labelled_into_the_fleet(
    gke: GkeEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deployed provision function's environment, as doctor reads it from Cloud Run.
    deployed = {
        "PROJECT_ID": HOME.project,
        "LOCATION": HOME.location,
        "CLUSTER_NAME": HOME.name,
        "FLEET_CLUSTERS": SECOND.path,
        "FLEET_PROJECTS": LABELLED.project,
        "UNLIMITED_SPENDING": "true",
    }

    class Deployed:
        def function_env(self, function: str) -> dict[str, str]:
            assert function == "provision"
            return deployed

    operator = Settings(
        project_id=HOME.project, location=HOME.location, cluster_name=HOME.name, gke_api_endpoint=gke.url
    )
    assert fleet_of(cast(Any, Deployed()), operator) == (HOME.path, SECOND.path)
    for key, value in {**deployed, "GKE_API_ENDPOINT": gke.url}.items():
        monkeypatch.setenv(key, value)
    assert [s.cluster_path for s in fleet_clusters(Settings.from_env())] == [HOME.path, SECOND.path]
    label_into_fleet(gke, LABELLED)
    # Labelled: the next doctor and status runs check and show it, no redeploy.
    assert fleet_of(cast(Any, Deployed()), operator) == (HOME.path, SECOND.path, LABELLED.path)
    [labelled] = [s for s in fleet_clusters(Settings.from_env()) if s.cluster_path == LABELLED.path]
    assert labelled.kube_api_endpoint == "" and labelled.project_id == LABELLED.project


@pytest.mark.parametrize("bound_there", [False, True], ids=["role-in-home-project-only", "role-in-both"])
def test_a_fleet_project_serves_only_where_infra_binds_the_functions_roles(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any, bound_there: bool
) -> None:
    # The GKE emulator's IAM grants each function the permissions infra/roles.json gives its role,
    # per project as infra/iam.tf binds them: in the home project, and (fleet_function) in each
    # other fleet project, here the labelled cluster's.
    fleet_projects = (LABELLED.project,) if bound_there else ()
    iam = Iam.for_functions(load_roles(REPO_ROOT), HOME.project, fleet_projects=fleet_projects)
    label_into_fleet(gke, LABELLED)  # by the platform team, before the functions' IAM is enforced
    gke.set_iam(iam)
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-iam", "team-a", replicas=1))
    with serve(
        "provision", fleet_projects=(LABELLED.project,), emulator_access_token=iam.token_for("provision")
    ) as function:
        home = function.function.post_entry(pending_event(pods[0], cluster=HOME))
        labelled = function.function.post_entry(pending_event(pods[0], cluster=LABELLED))
        denied = function.events("permission.denied")
    assert home.status_code == 200 and len(names(gke, HOME)) == 1  # one project's denial stops no other
    if bound_there:
        assert labelled.status_code == 200 and len(names(gke, LABELLED)) == 1
        return
    # Not bound in the labelled cluster's project: GKE's real denial, the delivery comes back (the
    # pod is not lost while the grant is missing) and nothing is created there.
    assert labelled.status_code != 200 and names(gke, LABELLED) == []
    [denial] = denied
    assert (denial["permission"], denial["role"]) == ("container.clusters.list", "provision")
    assert f"projects/{LABELLED.project}" in denial["message"], denial["message"]


def test_a_fleet_clusters_own_settings_decide_its_deliveries(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    # FLEET_OVERRIDES: the second cluster is being drained; the managed one keeps the defaults.
    _, pods = kube_server.submit_jobset(tpu_jobset("fleet-e", "team-a", replicas=1))
    with serve("provision", json.dumps({SECOND.path: {"DRAIN": True}})) as function:
        for cluster in (SECOND, HOME):
            assert function.function.post_entry(pending_event(pods[0], cluster=cluster)).status_code == 200
        refused = [e for e in function.events("provision.refused") if e.get("cluster") == SECOND.path]
    assert names(gke, SECOND) == [] and len(names(gke, HOME)) == 1
    assert refused and "drain" in refused[0]["message"].lower()


def _queues_message(cluster: ClusterId | None, sent: int) -> dict[str, Any]:
    """An empty publish (the deployed default queues) with the ``cluster`` attribute naming ``cluster``."""
    return {
        "messageId": str(2000 + sent),
        "publishTime": "2026-01-05T10:00:00Z",
        "attributes": {"cluster": cluster.path} if cluster is not None else {},
    }


def test_apply_kueue_applies_to_the_cluster_the_message_names_and_refuses_an_outsider(
    gke: GkeEmulator, kube_server: KubeHandle, serve: Any
) -> None:
    def queues() -> list[str]:
        return sorted(
            q["metadata"]["name"]
            for q in kube_server.list("kueue.x-k8s.io/v1beta2", "clusterqueues", label_selector=MANAGED)
        )

    def listed() -> tuple[list[str]] | None:
        try:
            return (queues(),)
        except ApiError as exc:  # Kueue's CRDs freshly served: "storage is (re)initializing"
            if exc.status != 429:
                raise
            return None

    [before] = eventually(listed, 30, "the ClusterQueue API to serve")
    with serve("apply_kueue") as function:
        outsider = function.function.post_message(_queues_message(OUTSIDER, 1))
        bad = function.function.post_message({**_queues_message(None, 2), "attributes": {"cluster": "c"}})
        assert queues() == before  # refused without a write
        down = function.function.post_message(_queues_message(DOWN, 3))
        assert queues() == before  # the unreachable cluster's queues went nowhere else
        home = function.function.post_message(_queues_message(None, 4))
        acked = function.events("delivery.acked")
        applied = function.events("kueue.applied")
    assert (outsider.status_code, bad.status_code) == (200, 200)  # acknowledged: redelivery won't help
    assert OUTSIDER.path in acked[0]["message"] and "nothing applied" in acked[0]["message"]
    assert "projects/P/locations/L/clusters/C" in acked[1]["message"]
    assert down.status_code == 503  # redelivered until "down" answers; nothing lost
    assert home.status_code == 200 and [a["cluster"] for a in applied] == [HOME.path]
    assert queues() != before


def test_setup_installs_on_a_cluster_created_with_the_fleet_label_at_once(
    gke: GkeEmulator, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cluster of a FLEET_PROJECTS project: its CreateCluster entry arrives as it comes up, long
    # before the fleet's cached listing would be refreshed, so setup asks GKE there and then. The
    # installer is a recorder: which cluster would be set up is what this test is about.
    from shared.app import setup_handlers

    installed: list[str] = []

    class Recorded:
        changed = True

        def summary(self) -> str:
            return "recorded"

    class RecordingInstaller:
        def __init__(self, objects: object, settings: Settings) -> None:
            pass

        def install(self, cluster: str = "") -> Recorded:
            installed.append(cluster)
            return Recorded()

    monkeypatch.setattr(setup_handlers, "Installer", RecordingInstaller)
    # The deployed TTL: without the fresh listing the labelled cluster would wait five minutes.
    with serve("setup_cluster", fleet_projects=(LABELLED.project,), fleet_discovery_seconds=300) as function:
        unlabelled = function.function.post_entry(logentries.cluster_operation_entry(LABELLED))
        assert installed == [] and function.events("setup.ignored")
        label_into_fleet(gke, LABELLED)
        labelled = function.function.post_entry(logentries.cluster_operation_entry(LABELLED))
        outsider = function.function.post_entry(logentries.cluster_operation_entry(OUTSIDER))
        done = function.events("setup.done")
    assert (unlabelled.status_code, labelled.status_code, outsider.status_code) == (200, 200, 200)
    assert installed == [LABELLED.path]
    assert [d["cluster"] for d in done] == [LABELLED.path]
