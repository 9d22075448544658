"""The queue configuration's ``tpuSlicesCheck``: the product's AdmissionCheck and the ClusterQueue's
``admissionChecksStrategy``, in fields the pinned Kueue CRDs have."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from sandbox.testing.fixtures import kube as fixtures_kube
from shared.core import labels
from shared.core.errors import InvalidInputError
from shared.core.settings import Settings
from shared.kueue import config as kueue
from shared.kueue.render import render
from shared.provisioning.admission.check import CONTROLLER_NAME
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "kueue" / "tpu-slices-check.yaml"


def by_kind(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        found.setdefault(obj["kind"], []).append(obj)
    return found


def test_the_example_renders_the_check_and_wires_it_into_the_queue() -> None:
    objects = render(kueue.load_config(EXAMPLE))
    kinds = [o["kind"] for o in objects]
    # Applied after the flavors and before the ClusterQueue that names it.
    assert kinds == ["ResourceFlavor", "AdmissionCheck", "ClusterQueue", "LocalQueue"]
    check = by_kind(objects)["AdmissionCheck"][0]
    assert check == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": "tpu-slices", "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}},
        "spec": {"controllerName": "tpuprov.dev/tpu-slices"},
    }
    # The name the functions answer by default, and the controller they are.
    assert check["metadata"]["name"] == Settings().admission_check_name
    assert check["spec"]["controllerName"] == CONTROLLER_NAME
    queue = by_kind(objects)["ClusterQueue"][0]
    assert queue["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "tpu-slices", "onFlavors": ["vlp-24"]}]
    }


def test_without_the_option_nothing_changes() -> None:
    objects = render(kueue.load_config())
    assert "AdmissionCheck" not in by_kind(objects)
    assert all("admissionChecksStrategy" not in o.get("spec", {}) for o in objects)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (["other"], "tpuSlicesCheck names flavor 'other', which has no quota in this queue"),
        ("yes", "tpuSlicesCheck must be true, false or a list of this queue's flavors"),
        ([], "tpuSlicesCheck must be true, false or a list of this queue's flavors"),
    ],
)
def test_bad_values_are_listed_problems(value: Any, problem: str) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["clusterQueues"][0]["tpuSlicesCheck"] = value
    with pytest.raises(InvalidInputError) as raised:
        kueue.validate(doc)
    assert problem in str(raised.value)


def test_the_rendered_check_fields_exist_in_the_pinned_kueue_crds() -> None:
    manifest = fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)
    schemas = {}
    for doc in yaml.load_all(manifest.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if doc["kind"] == "CustomResourceDefinition" and doc["spec"]["group"] == "kueue.x-k8s.io":
            version = next(v for v in doc["spec"]["versions"] if v["name"] == "v1beta2")
            schemas[doc["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]

    def check(value: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in schema:
            for key, item in value.items():
                assert key in schema["properties"], f"{path}.{key} is not in the CRD schema"
                check(item, schema["properties"][key], f"{path}.{key}")
        elif isinstance(value, list) and "items" in schema:
            for item in value:
                check(item, schema["items"], f"{path}[]")

    for obj in render(kueue.load_config(EXAMPLE)):
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        check(body, schemas[obj["kind"]], obj["kind"])
