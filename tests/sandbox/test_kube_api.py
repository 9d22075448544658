"""The sandbox Kubernetes API through the official client: metadata, errors, selectors, writes."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client
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
APPLY = "application/apply-patch+yaml"


def _status(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body or "{}")
    return body


def _pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _jobset(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {}}}]},
    }


# The generated client is typed for its model classes; tests pass plain dicts (which it accepts
# at runtime) and read optional fields freely, so the API handles are deliberately untyped.
@pytest.fixture
def core(kube_client: client.ApiClient) -> Any:
    return client.CoreV1Api(kube_client)


@pytest.fixture
def custom(kube_client: client.ApiClient) -> Any:
    return client.CustomObjectsApi(kube_client)


def test_create_answers_201_with_server_populated_metadata(core: Any, kube_server: Any) -> None:
    before = int(core.list_namespaced_pod("default").metadata.resource_version)
    pod, code, _ = core.create_namespaced_pod_with_http_info("default", _pod("p1"))
    second = core.create_namespaced_pod("default", _pod("p2"))

    assert code == 201
    assert (pod.kind, pod.api_version) == ("Pod", "v1")
    assert uuid.UUID(pod.metadata.uid).version == 4
    assert before < int(pod.metadata.resource_version) < int(second.metadata.resource_version)
    assert pod.metadata.namespace == "default"
    assert pod.metadata.generation == 1
    raw = requests.get(f"{kube_server.url}/api/v1/namespaces/default/pods/p1", timeout=5).json()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", raw["metadata"]["creationTimestamp"])
    assert raw["status"]["phase"] == "Pending"


def test_generate_name_gets_a_random_suffix(core: Any) -> None:
    first = core.create_namespaced_config_map("default", {"metadata": {"generateName": "cfg-"}})
    second = core.create_namespaced_config_map("default", {"metadata": {"generateName": "cfg-"}})

    assert re.fullmatch(r"cfg-[a-z0-9]{5}", first.metadata.name)
    assert first.metadata.name != second.metadata.name


def test_creating_an_existing_object_is_409_already_exists(core: Any) -> None:
    core.create_namespaced_pod("default", _pod("p1"))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("default", _pod("p1"))

    assert caught.value.status == 409
    status = _status(caught.value)
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "AlreadyExists", 409)
    assert status["details"] == {"name": "p1", "kind": "pods"}


def test_missing_objects_are_404_not_found(core: Any, custom: Any) -> None:
    with pytest.raises(ApiException) as pod_error:
        core.read_namespaced_pod("ghost", "default")
    with pytest.raises(ApiException) as jobset_error:
        custom.get_namespaced_custom_object(*JOBSETS, "default", "jobsets", "ghost")

    assert pod_error.value.status == 404
    assert _status(pod_error.value)["reason"] == "NotFound"
    assert _status(jobset_error.value)["details"] == {
        "name": "ghost",
        "group": "jobset.x-k8s.io",
        "kind": "jobsets",
    }


def test_object_without_a_name_is_422_invalid(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_config_map("default", {"metadata": {"labels": {"a": "b"}}})

    assert caught.value.status == 422
    assert _status(caught.value)["reason"] == "Invalid"


def test_namespaces_must_exist_unless_relaxed(core: Any) -> None:
    names = {ns.metadata.name for ns in core.list_namespace().items}
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod("nope", _pod("p1"))
    with KubeApiServer(strict_namespaces=False) as relaxed:
        api = relaxed.api_client()
        try:
            relaxed_core: Any = client.CoreV1Api(api)
            created = relaxed_core.create_namespaced_pod("nope", _pod("p1"))
        finally:
            api.close()

    assert {"default", "kube-system", "kube-public"} <= names
    assert caught.value.status == 404
    assert _status(caught.value)["message"] == 'namespaces "nope" not found'
    assert created.metadata.namespace == "nope"


def test_lists_carry_kind_api_version_and_resource_version(core: Any, custom: Any) -> None:
    pod = core.create_namespaced_pod("default", _pod("p1"))
    created = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", _jobset("js"))
    pods = core.list_namespaced_pod("default")
    jobsets = custom.list_namespaced_custom_object(*JOBSETS, "default", "jobsets")
    fetched = custom.get_namespaced_custom_object(*JOBSETS, "default", "jobsets", "js")

    assert (pods.kind, pods.api_version) == ("PodList", "v1")
    assert int(pods.metadata.resource_version) >= int(pod.metadata.resource_version)
    assert (jobsets["kind"], jobsets["apiVersion"]) == ("JobSetList", "jobset.x-k8s.io/v1alpha2")
    assert int(jobsets["metadata"]["resourceVersion"]) >= int(created["metadata"]["resourceVersion"])
    assert (fetched["kind"], fetched["apiVersion"]) == ("JobSet", "jobset.x-k8s.io/v1alpha2")


LABEL_CASES = [
    ("app=web", {"a", "b"}),
    ("app==web", {"a", "b"}),
    ("app!=web", {"c", "d"}),
    ("tier in (fe,be)", {"a", "b"}),
    ("tier notin (fe)", {"b", "c", "d"}),
    ("tier", {"a", "b"}),
    ("!tier", {"c", "d"}),
    ("app=web,tier!=be", {"a"}),
    ("app in (web, db),!tier", {"c"}),
]


@pytest.mark.parametrize(("selector", "expected"), LABEL_CASES, ids=[case[0] for case in LABEL_CASES])
def test_label_selectors(core: Any, selector: str, expected: set[str]) -> None:
    labels = {
        "a": {"app": "web", "tier": "fe"},
        "b": {"app": "web", "tier": "be"},
        "c": {"app": "db"},
        "d": {},
    }
    for name, pod_labels in labels.items():
        core.create_namespaced_pod("default", _pod(name, pod_labels))

    found = core.list_namespaced_pod("default", label_selector=selector).items

    assert {pod.metadata.name for pod in found} == expected


def test_malformed_label_selector_is_400(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", label_selector="app in (web")

    assert caught.value.status == 400


POD_FIELD_CASES = [
    ("metadata.name=a", {"a"}),
    ("metadata.namespace=default", {"a", "b", "c"}),
    ("spec.nodeName=node-1", {"a", "b"}),
    ("spec.nodeName=", {"c"}),
    ("status.phase=Running", {"b"}),
    ("status.phase!=Running,spec.nodeName==node-1", {"a"}),
]


@pytest.mark.parametrize(("selector", "expected"), POD_FIELD_CASES, ids=[case[0] for case in POD_FIELD_CASES])
def test_pod_field_selectors(core: Any, selector: str, expected: set[str]) -> None:
    core.create_namespaced_pod("default", _pod("a", node="node-1"))
    core.create_namespaced_pod("default", _pod("b", node="node-1"))
    core.create_namespaced_pod("default", _pod("c"))
    core.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Running"}})

    found = core.list_pod_for_all_namespaces(field_selector=selector).items

    assert {pod.metadata.name for pod in found} == expected


EVENT_FIELD_CASES = [
    ("involvedObject.name=p1", {"e1"}),
    ("involvedObject.kind=JobSet", {"e2"}),
    ("involvedObject.uid=uid-2", {"e2"}),
    ("involvedObject.namespace=default,involvedObject.kind=Pod", {"e1", "e3"}),
    ("reason=FailedScheduling", {"e1", "e3"}),
    ("type!=Normal", {"e1", "e3"}),
]


@pytest.mark.parametrize(
    ("selector", "expected"), EVENT_FIELD_CASES, ids=[case[0] for case in EVENT_FIELD_CASES]
)
def test_event_field_selectors(core: Any, selector: str, expected: set[str]) -> None:
    involved = [
        ("e1", "Pod", "p1", "uid-1", "FailedScheduling", "Warning"),
        ("e2", "JobSet", "js1", "uid-2", "Created", "Normal"),
        ("e3", "Pod", "p2", "uid-3", "FailedScheduling", "Warning"),
    ]
    for name, kind, obj, uid, reason, etype in involved:
        ref = {"kind": kind, "name": obj, "namespace": "default", "uid": uid}
        body = {"metadata": {"name": name}, "involvedObject": ref, "reason": reason, "type": etype}
        core.create_namespaced_event("default", body)

    found = core.list_namespaced_event("default", field_selector=selector).items

    assert {event.metadata.name for event in found} == expected


def test_unsupported_field_selector_is_400(core: Any) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", field_selector="spec.priorityClassName=x")

    assert caught.value.status == 400
    assert "field label not supported" in _status(caught.value)["message"]


def test_pages_with_limit_and_continue(core: Any) -> None:
    for index in range(5):
        core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{index}"}})

    first = core.list_namespaced_config_map("default", limit=2)
    second = core.list_namespaced_config_map("default", limit=2, _continue=first.metadata._continue)
    rest = core.list_namespaced_config_map("default", limit=2, _continue=second.metadata._continue)

    names = [cm.metadata.name for page in (first, second, rest) for cm in page.items]
    assert names == [f"cm-{index}" for index in range(5)]
    assert first.metadata.remaining_item_count == 3
    assert rest.metadata._continue is None


def test_replace_with_a_stale_resource_version_is_409_conflict(core: Any) -> None:
    created = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "1"}})
    stale_version = created.metadata.resource_version
    created.data = {"k": "2"}
    updated = core.replace_namespaced_config_map("c", "default", created)
    created.metadata.resource_version = stale_version
    created.data = {"k": "3"}
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_config_map("c", "default", created)

    assert int(updated.metadata.resource_version) > int(stale_version)
    assert updated.data == {"k": "2"}
    assert caught.value.status == 409
    assert _status(caught.value)["reason"] == "Conflict"
    assert core.read_namespaced_config_map("c", "default").data == {"k": "2"}


def test_generation_follows_spec_changes_only(custom: Any) -> None:
    created = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", _jobset("js"))
    labelled = custom.patch_namespaced_custom_object(
        *JOBSETS, "default", "jobsets", "js", {"metadata": {"labels": {"team": "a"}}}
    )
    suspended = custom.patch_namespaced_custom_object(
        *JOBSETS, "default", "jobsets", "js", {"spec": {"suspend": True}}
    )

    assert created["metadata"]["generation"] == labelled["metadata"]["generation"] == 1
    assert labelled["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
    assert suspended["metadata"]["generation"] == 2
    assert suspended["spec"]["suspend"] is True


def test_merge_patch_follows_rfc7386(custom: Any) -> None:
    body = _jobset("js")
    body["metadata"]["labels"] = {"keep": "1", "drop": "1"}
    custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
    patch = {
        "metadata": {"labels": {"drop": None, "new": "1"}},
        "spec": {"replicatedJobs": [{"name": "only"}]},
    }

    patched = custom.patch_namespaced_custom_object(*JOBSETS, "default", "jobsets", "js", patch)

    assert patched["metadata"]["labels"] == {"keep": "1", "new": "1"}
    assert patched["spec"]["replicatedJobs"] == [{"name": "only"}]  # lists are replaced whole


def test_strategic_merge_patch_merges_named_and_typed_lists(core: Any) -> None:
    pod = _pod("p1")
    pod["spec"]["containers"].append({"name": "side", "image": "old"})
    core.create_namespaced_pod("default", pod)

    core.patch_namespaced_pod("p1", "default", {"spec": {"containers": [{"name": "side", "image": "new"}]}})
    core.patch_namespaced_pod_status(
        "p1", "default", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    core.patch_namespaced_pod_status(
        "p1", "default", {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    )
    result = core.patch_namespaced_pod_status(
        "p1", "default", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )

    assert [(c.name, c.image) for c in result.spec.containers] == [("main", "busybox"), ("side", "new")]
    assert sorted((c.type, c.status) for c in result.status.conditions) == [
        ("PodScheduled", "True"),
        ("Ready", "True"),
    ]


def test_json_patch_applies_rfc6902_operations(core: Any) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
    ops = [
        {"op": "add", "path": "/metadata/labels", "value": {"x/y": "1"}},
        {"op": "replace", "path": "/data/a", "value": "10"},
        {"op": "remove", "path": "/data/b"},
        {"op": "copy", "from": "/data/a", "path": "/data/c"},
    ]
    patched = core.patch_namespaced_config_map("c", "default", ops)
    with pytest.raises(ApiException) as caught:
        core.patch_namespaced_config_map("c", "default", [{"op": "test", "path": "/data/a", "value": "nope"}])

    assert patched.data == {"a": "10", "c": "10"}
    assert patched.metadata.labels == {"x/y": "1"}
    assert caught.value.status == 422


def test_custom_resources_reject_strategic_merge_patch(custom: Any) -> None:
    custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", _jobset("js"))
    with pytest.raises(ApiException) as caught:
        custom.patch_namespaced_custom_object(
            *JOBSETS,
            "default",
            "jobsets",
            "js",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )

    assert caught.value.status == 415


def test_server_side_apply_creates_merges_and_is_idempotent(core: Any) -> None:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}}
    kwargs: dict[str, Any] = {"field_manager": "tester", "force": True, "_content_type": APPLY}

    created, created_code, _ = core.patch_namespaced_config_map_with_http_info(
        "ssa", "default", body, **kwargs
    )
    again, again_code, _ = core.patch_namespaced_config_map_with_http_info("ssa", "default", body, **kwargs)
    changed = core.patch_namespaced_config_map("ssa", "default", {**body, "data": {"b": "2"}}, **kwargs)

    assert (created_code, again_code) == (201, 200)
    assert again.metadata.resource_version == created.metadata.resource_version
    assert int(changed.metadata.resource_version) > int(created.metadata.resource_version)
    assert changed.data == {"a": "1", "b": "2"}
    assert [(m.manager, m.operation) for m in changed.metadata.managed_fields] == [("tester", "Apply")]


def test_server_side_apply_accepts_yaml_and_requires_a_field_manager(kube_server: KubeApiServer) -> None:
    url = f"{kube_server.url}/api/v1/namespaces/default/configmaps/yaml-cm"
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: yaml-cm\ndata:\n  key: value\n"
    headers = {"Content-Type": APPLY}

    created = requests.patch(url, params={"fieldManager": "me"}, data=manifest, headers=headers, timeout=5)
    no_manager = requests.patch(url, data=manifest, headers=headers, timeout=5)

    assert created.status_code == 201
    assert created.json()["data"] == {"key": "value"}
    assert no_manager.status_code == 422


def test_status_subresource_of_a_custom_resource(custom: Any) -> None:
    body = _jobset("js")
    body["status"] = {"restarts": 5}
    created = custom.create_namespaced_custom_object(*JOBSETS, "default", "jobsets", body)
    condition = {"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": "done"}
    custom.patch_namespaced_custom_object_status(
        *JOBSETS,
        "default",
        "jobsets",
        "js",
        {"status": {"conditions": [condition]}, "spec": {"suspend": True}},
    )
    main = custom.patch_namespaced_custom_object(
        *JOBSETS, "default", "jobsets", "js", {"metadata": {"labels": {"l": "1"}}, "status": {"restarts": 9}}
    )
    via_status = custom.get_namespaced_custom_object_status(*JOBSETS, "default", "jobsets", "js")

    assert "status" not in created  # ignored on create
    assert main["status"] == {"conditions": [condition]}  # main-resource writes leave status alone
    assert main["metadata"]["labels"] == {"l": "1"}
    assert "suspend" not in main["spec"]  # status writes leave spec alone
    assert via_status["status"]["conditions"] == [condition]


# --- paged lists and field selectors, as the product's adapter uses them ---------------------------


def _put_pods(kube_server: Any, count: int, running: set[int]) -> None:
    for index in range(count):
        pod = _pod(f"p{index:02d}", {"app": "x"})
        pod.update(apiVersion="v1", kind="Pod")
        pod["metadata"]["namespace"] = "default"
        pod["status"] = {"phase": "Running" if index in running else "Pending"}
        kube_server.put(pod)


def test_list_pages_carry_continue_and_remaining_item_count(core: Any, kube_server: Any) -> None:
    _put_pods(kube_server, 7, running=set())
    first = core.list_namespaced_pod("default", limit=3)
    assert [p.metadata.name for p in first.items] == ["p00", "p01", "p02"]
    assert first.metadata.remaining_item_count == 4
    second = core.list_namespaced_pod("default", limit=3, _continue=first.metadata._continue)
    assert [p.metadata.name for p in second.items] == ["p03", "p04", "p05"]
    last = core.list_namespaced_pod("default", limit=3, _continue=second.metadata._continue)
    assert [p.metadata.name for p in last.items] == ["p06"]
    assert (last.metadata._continue, last.metadata.remaining_item_count) == (None, None)
    # With a selector the real API cannot count what is left, and leaves the field unset.
    selected = core.list_namespaced_pod("default", limit=3, label_selector="app=x")
    assert selected.metadata._continue and selected.metadata.remaining_item_count is None


def test_product_adapter_pages_through_every_pod_with_server_side_selectors(kube_server: Any) -> None:
    from shared.cloud.kube import KubeClient

    _put_pods(kube_server, 10, running={1, 4, 8})
    kube_server.set_list_latency(0.01)
    api = KubeClient(kube_server.api_client(), page_size=3)
    kube_server.clear_requests()

    everything = api.list_pods("default", label_selector="app")
    assert [p["metadata"]["name"] for p in everything] == [f"p{i:02d}" for i in range(10)]
    pages = [path for method, path in kube_server.requests if method == "GET"]
    assert len(pages) == 4 and all("limit=3" in path for path in pages)
    assert sum("continue=" in path for path in pages) == 3

    kube_server.clear_requests()
    pending = api.list_pods(label_selector="app", field_selector="status.phase=Pending")
    assert [p["metadata"]["name"] for p in pending] == ["p00", "p02", "p03", "p05", "p06", "p07", "p09"]
    assert all("fieldSelector=status.phase%3DPending" in path for _, path in kube_server.requests)
