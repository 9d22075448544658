"""A function's kubeconfig for a fleet: its own cluster as the current context, and each fleet
cluster under the context name ``gcloud container clusters get-credentials`` gives it
(``shared.core.settings.fleet_context``), which is where the functions look for it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


def current(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The current context's cluster and user entries of a kubeconfig document."""
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u for u in config["users"] if u["name"] == context["user"])
    return copy.deepcopy(cluster), copy.deepcopy(user)


def with_contexts(base: Path, contexts: Mapping[str, Mapping[str, Any]], out: Path) -> Path:
    """Write ``base`` plus, for each context name, the current cluster and user of the kubeconfig
    document it maps to (``base``'s own document for another name of the same API server), to
    ``out`` (mode 0600: it holds credentials)."""
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    for name, other in contexts.items():
        cluster, user = current(other)
        config["clusters"].append({**cluster, "name": name})
        config["users"].append({**user, "name": name})
        config["contexts"].append({"name": name, "context": {"cluster": name, "user": name}})
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    out.chmod(0o600)
    return out


def load(path: Path) -> dict[str, Any]:
    """A kubeconfig document."""
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document
