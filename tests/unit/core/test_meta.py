"""An object's metadata read once into ``Meta``: what the API writes, absent fields read as empty (the
namespace as the caller says), anything of another JSON type read as absent."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.meta import Meta

FULL = {
    "metadata": {
        "name": "a",
        "namespace": "team-a",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"app": "x"},
        "annotations": {"note": "y"},
        "deletionTimestamp": "2026-11-25T04:00:00Z",
        "creationTimestamp": "2026-11-25T03:00:00Z",
        "generation": 3,
    }
}


@pytest.mark.parametrize(
    ("obj", "default_namespace", "expected"),
    [
        (
            FULL,
            "default",
            Meta(
                name="a",
                namespace="team-a",
                uid="u-1",
                resource_version="42",
                labels={"app": "x"},
                annotations={"note": "y"},
                deleting=True,
                created="2026-11-25T03:00:00Z",
                generation=3,
            ),
        ),
        (None, "default", Meta()),
        ({"metadata": {"name": "crd"}}, "default", Meta(name="crd")),
        # A cluster-scoped object (or a manifest document naming no namespace) asked for as such.
        ({"metadata": {"name": "crd"}}, "", Meta(name="crd", namespace="")),
        (
            {"metadata": {"name": "cm", "namespace": "kueue-system"}},
            "",
            Meta(name="cm", namespace="kueue-system"),
        ),
        # What only a malformed log entry carries: reads as absent, never raises.
        ({"metadata": ["not", "an", "object"]}, "", Meta(namespace="")),
        (
            {"metadata": {"name": 5, "namespace": {"x": 1}, "labels": "x", "generation": True}},
            "",
            Meta(namespace=""),
        ),
        ({"metadata": {"name": "d", "generation": "2"}}, "default", Meta(name="d")),
    ],
)
def test_metadata_view(obj: Any, default_namespace: str, expected: Meta) -> None:
    assert Meta.of(obj, default_namespace=default_namespace) == expected
