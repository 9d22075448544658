"""The sandbox Kubernetes API: watches, direct state access, callbacks, faults, deletion, scopes."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client, watch
from kubernetes.client import ApiClient, ApiException

from sandbox.emulators.kube.api import KubeApiServer
from tests.sandbox import standin_kube


# The stand-in's own tests: the suite-wide kube_server is the real API server.
@pytest.fixture
def kube_server() -> Iterator[KubeApiServer]:
    yield from standin_kube.server()


@pytest.fixture
def kube_client(kube_server: KubeApiServer) -> Iterator[ApiClient]:
    yield from standin_kube.api_client(kube_server)


JOBSETS = ("jobset.x-k8s.io", "v1alpha2")
SPEC = {"containers": [{"name": "main", "image": "busybox"}]}


@pytest.fixture
def core(kube_client: client.ApiClient) -> Any:
    return client.CoreV1Api(kube_client)


def _cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def _events(stream: Iterator[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(event["type"], event["object"].metadata.name) for event in stream]


class LiveWatch:
    """A watch consumed on a thread, so a test can write while it runs."""

    def __init__(self, server: KubeApiServer, func: Any, *args: Any, **kwargs: Any) -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(func, args, kwargs), daemon=True)
        watches = server.count("GET", "watch=true")
        self._thread.start()
        deadline = time.monotonic() + 5
        while server.count("GET", "watch=true") == watches and time.monotonic() < deadline:
            time.sleep(0.01)  # wait until the server has the watch before the test writes
        time.sleep(0.05)

    def _run(self, func: Any, args: Any, kwargs: Any) -> None:
        for event in self._watch.stream(func, *args, **kwargs):
            self.events.put((event["type"], event["raw_object"]))

    def next(self, timeout: float = 5.0) -> tuple[str, dict[str, Any]]:
        return self.events.get(timeout=timeout)

    def join(self) -> None:
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_watch_ends_after_timeout_seconds(core: Any) -> None:
    core.create_namespaced_config_map("default", _cm("before"))
    started = time.monotonic()

    events = _events(watch.Watch().stream(core.list_namespaced_config_map, "default", timeout_seconds=1))

    assert 0.9 <= time.monotonic() - started < 5
    assert events == [("ADDED", "before")]  # the current state comes first, as synthetic ADDED events


def test_watch_from_a_resource_version_sends_only_newer_events(core: Any) -> None:
    core.create_namespaced_config_map("default", _cm("old"))
    since = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("new"))
    core.patch_namespaced_config_map("old", "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("new", "default")

    stream = watch.Watch().stream(
        core.list_namespaced_config_map,
        "default",
        resource_version=since,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
    )

    assert _events(stream) == [("ADDED", "new"), ("MODIFIED", "old"), ("DELETED", "new")]


def test_live_watch_with_label_selector(kube_server: KubeApiServer, core: Any) -> None:
    live = LiveWatch(
        kube_server, core.list_namespaced_config_map, "default", label_selector="team=a", timeout_seconds=1
    )
    core.create_namespaced_config_map("default", _cm("other", {"team": "b"}))
    core.create_namespaced_config_map("default", _cm("mine", {"team": "a"}))
    core.patch_namespaced_config_map("mine", "default", {"metadata": {"labels": {"team": "b"}}})

    first, second = live.next(), live.next()
    live.join()

    assert (first[0], first[1]["metadata"]["name"]) == ("ADDED", "mine")
    # Leaving the selection is reported as DELETED, as the real API server does.
    assert (second[0], second[1]["metadata"]["labels"]) == ("DELETED", {"team": "b"})
    assert live.events.empty()


def test_event_field_selector_watch(kube_server: KubeApiServer, core: Any) -> None:
    selector = "involvedObject.name=p1"
    live = LiveWatch(
        kube_server, core.list_namespaced_event, "default", field_selector=selector, timeout_seconds=1
    )
    for name, target in (("e1", "p1"), ("e2", "p2")):
        body = {
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": target, "namespace": "default"},
        }
        core.create_namespaced_event("default", body)

    etype, obj = live.next()
    live.join()

    assert (etype, obj["metadata"]["name"]) == ("ADDED", "e1")
    assert live.events.empty()


def test_direct_writes_bump_resource_versions_and_reach_watchers(
    kube_server: KubeApiServer, core: Any
) -> None:
    live = LiveWatch(kube_server, core.list_namespaced_pod, "default", timeout_seconds=1)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": SPEC}
    stored = kube_server.put(pod)
    running = kube_server.patch_status("v1", "pods", "default", "p", {"phase": "Running"})
    copy = kube_server.get("v1", "Pod", "default", "p")
    assert copy is not None
    copy["metadata"]["labels"] = {"mutated": "locally"}
    deleted = kube_server.delete("v1", "pods", "default", "p")

    kinds = [live.next()[0] for _ in range(3)]
    live.join()

    assert int(running["metadata"]["resourceVersion"]) > int(stored["metadata"]["resourceVersion"])
    assert running["status"]["phase"] == "Running"
    assert kinds == ["ADDED", "MODIFIED", "DELETED"]
    assert deleted is True
    assert kube_server.delete("v1", "pods", "default", "p") is False
    assert kube_server.get("v1", "pods", "default", "p") is None


def test_direct_list_filters_by_namespace_and_labels(kube_server: KubeApiServer) -> None:
    for name, team in (("a", "x"), ("b", "y")):
        kube_server.put(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"t": team}}}
        )
    kube_server.put(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kube-system"}}
    )

    assert [o["metadata"]["name"] for o in kube_server.list("v1", "configmaps", "default")] == ["a", "b"]
    assert [o["metadata"]["name"] for o in kube_server.list("v1", "configmaps", label_selector="t=y")] == [
        "b"
    ]
    assert len(kube_server.list("v1", "configmaps")) == 3


def test_on_change_reports_every_write_in_order(kube_server: KubeApiServer, core: Any) -> None:
    seen: list[tuple[str, str, str]] = []
    kube_server.on_change(lambda etype, obj: seen.append((etype, obj["kind"], obj["metadata"]["name"])))

    core.create_namespaced_config_map("default", _cm("c1"))
    core.patch_namespaced_config_map("c1", "default", {"data": {"k": "v"}})
    core.patch_namespaced_config_map("c1", "default", {"data": {"k": "v"}})  # a no-op: not a write
    core.delete_namespaced_config_map("c1", "default")
    kube_server.wait_for_callbacks()

    assert seen == [
        ("ADDED", "ConfigMap", "c1"),
        ("MODIFIED", "ConfigMap", "c1"),
        ("DELETED", "ConfigMap", "c1"),
    ]


def test_set_down_answers_503_until_back_up(kube_server: KubeApiServer, core: Any) -> None:
    kube_server.set_down(True)
    with pytest.raises(ApiException) as caught:
        core.list_namespace()
    kube_server.set_down(False)

    assert caught.value.status == 503
    assert json.loads(caught.value.body or "{}")["reason"] == "ServiceUnavailable"
    assert core.list_namespace().items


def test_fail_next_hits_only_matching_requests(
    kube_client: client.ApiClient, kube_server: KubeApiServer
) -> None:
    custom: Any = client.CustomObjectsApi(kube_client)
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {},
    }
    message = 'Internal error occurred: failed calling webhook "mjobset.kb.io"'
    kube_server.fail_next(
        2, 500, match=lambda method, path: method == "POST" and "/jobsets" in path, message=message
    )

    failures = []
    for _ in range(2):
        with pytest.raises(ApiException) as caught:
            custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
        failures.append((caught.value.status, json.loads(caught.value.body or "{}")["message"]))
    listed = custom.list_namespaced_custom_object(*JOBSETS, "default", "jobsets")  # GETs are not matched
    created = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)

    assert failures == [(500, message), (500, message)]
    assert listed["items"] == []
    assert created["metadata"]["name"] == "js"


def test_requests_are_recorded_and_counted(kube_server: KubeApiServer, core: Any) -> None:
    kube_server.clear_requests()
    core.create_namespaced_config_map("default", _cm("c1"))
    core.list_namespaced_config_map("default", label_selector="a=b")

    assert kube_server.requests == [
        ("POST", "/api/v1/namespaces/default/configmaps"),
        ("GET", "/api/v1/namespaces/default/configmaps?labelSelector=a%3Db"),
    ]
    assert kube_server.count("post", "/configmaps") == 1
    assert kube_server.count(path_contains="labelSelector") == 1
    assert kube_server.count() == 2


def test_deleting_a_namespace_terminates_it_then_removes_its_contents() -> None:
    with KubeApiServer(namespace_delete_delay=0.3) as server:
        api = server.api_client()
        try:
            core: Any = client.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": "team"}})
            core.create_namespaced_config_map("team", _cm("inside"))
            core.create_namespaced_config_map("default", _cm("outside"))

            core.delete_namespace("team")
            terminating = core.read_namespace("team")
            with pytest.raises(ApiException) as refused:
                core.create_namespaced_config_map("team", _cm("late"))
            kept_meanwhile = server.get("v1", "configmaps", "team", "inside")
            deadline = time.monotonic() + 5
            while server.get("v1", "namespaces", None, "team") and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            api.close()

        assert terminating.status.phase == "Terminating"
        assert terminating.metadata.deletion_timestamp is not None
        assert refused.value.status == 403
        assert kept_meanwhile is not None
        assert server.get("v1", "namespaces", None, "team") is None
        assert server.list("v1", "configmaps", "team") == []
        assert server.get("v1", "configmaps", "default", "outside") is not None


@pytest.mark.parametrize(
    ("policy", "survives"), [("Background", False), ("Orphan", True)], ids=["cascade", "orphan"]
)
def test_owner_references_are_garbage_collected(
    kube_client: client.ApiClient, kube_server: KubeApiServer, core: Any, policy: str, survives: bool
) -> None:
    custom: Any = client.CustomObjectsApi(kube_client)
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {},
    }
    owner = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
    ref = {"apiVersion": owner["apiVersion"], "kind": "JobSet", "name": "js", "uid": owner["metadata"]["uid"]}
    core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": [ref]}})

    custom.delete_namespaced_custom_object(*JOBSETS, "default", "jobsets", "js", propagation_policy=policy)

    assert (kube_server.get("v1", "configmaps", "default", "child") is not None) is survives


def test_a_dependent_created_after_its_owner_was_deleted_is_collected(
    kube_client: client.ApiClient, kube_server: KubeApiServer, core: Any
) -> None:
    # A controller acting on a read from before the delete (the JobSet controller creating pods
    # for a JobSet just deleted) must not leave orphans behind.
    custom: Any = client.CustomObjectsApi(kube_client)
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "late"},
        "spec": {},
    }
    owner = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": "JobSet",
        "name": "late",
        "uid": owner["metadata"]["uid"],
    }
    custom.delete_namespaced_custom_object(*JOBSETS, "default", "jobsets", "late")

    core.create_namespaced_config_map("default", {"metadata": {"name": "orphan", "ownerReferences": [ref]}})
    assert kube_server.get("v1", "configmaps", "default", "orphan") is None

    # An owner that exists under that name but is a different object (recreated) does not count.
    custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
    core.create_namespaced_config_map("default", {"metadata": {"name": "stale", "ownerReferences": [ref]}})
    assert kube_server.get("v1", "configmaps", "default", "stale") is None
    # Nor is anything collected whose owner is there.
    live = custom.get_namespaced_custom_object(*JOBSETS, "default", "jobsets", "late")
    ref = {**ref, "uid": live["metadata"]["uid"]}
    core.create_namespaced_config_map("default", {"metadata": {"name": "kept", "ownerReferences": [ref]}})
    assert kube_server.get("v1", "configmaps", "default", "kept") is not None


def test_delete_with_finalizers_marks_then_removes(core: Any) -> None:
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "held", "finalizers": ["sandbox/hold"]}}
    )
    options = client.V1DeleteOptions(propagation_policy="Foreground")
    core.delete_namespaced_config_map("held", "default", body=options)
    marked = core.read_namespaced_config_map("held", "default")
    core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})

    assert marked.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_config_map("held", "default")
    assert caught.value.status == 404


def test_delete_collection_by_label_selector(core: Any) -> None:
    for name, team in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        core.create_namespaced_config_map("default", {"metadata": {"name": name, "labels": {"team": team}}})

    core.delete_collection_namespaced_config_map("default", label_selector="team=a")

    assert [cm.metadata.name for cm in core.list_namespaced_config_map("default").items] == ["b1"]


def test_cluster_scoped_and_namespaced_paths(
    kube_client: client.ApiClient, kube_server: KubeApiServer
) -> None:
    rbac: Any = client.RbacAuthorizationV1Api(kube_client)
    core: Any = client.CoreV1Api(kube_client)
    role = rbac.create_cluster_role({"metadata": {"name": "reader", "namespace": "default"}, "rules": []})
    core.create_namespace({"metadata": {"name": "other"}})
    core.create_namespaced_pod("default", {"metadata": {"name": "p1"}, "spec": SPEC})
    core.create_namespaced_pod("other", {"metadata": {"name": "p2"}, "spec": SPEC})

    wrong_scope = requests.get(
        f"{kube_server.url}/apis/rbac.authorization.k8s.io/v1/namespaces/default/clusterroles/reader",
        timeout=5,
    )
    everywhere = core.list_pod_for_all_namespaces().items

    assert role.metadata.namespace is None
    assert wrong_scope.status_code == 404
    assert {(p.metadata.namespace, p.metadata.name) for p in everywhere} == {
        ("default", "p1"),
        ("other", "p2"),
    }
