"""Put a running API server's store back to a remembered state between tests, in milliseconds.

Starting etcd and kube-apiserver takes seconds, so the function tests share one pair per session
and reset it before each test instead. Deleting through the API would cost a request per resource
type and namespace, and would wait on finalizers no controller here removes; instead ``Snapshot``
works on etcd itself, through its v3 JSON gateway: it remembers every key under ``/registry/`` once
the cluster is set up, and ``restore`` deletes every key written since (pods, JobSets, Workloads,
Events, Nodes, namespaces a test created...) and puts back the remembered bytes of the kinds a
test may change (namespaces, service accounts, RBAC, CRDs, PriorityClasses), all in one
transaction. The API server's watch cache follows etcd's watch, as for any write, and a
consistent read waits for it, so the next test sees an empty cluster through the API.

Left alone: keys the API server itself keeps up to date while it runs (leases, the Service IP
allocator, priority-and-fairness objects, APIServices that follow the CRDs).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PREFIX = "/registry/"
# What the API server maintains on its own: never deleted or rewritten by a reset.
SERVER_OWNED = (
    "/registry/leases/",
    "/registry/masterleases/",
    "/registry/ranges/",
    "/registry/flowschemas/",
    "/registry/prioritylevelconfigurations/",
    "/registry/apiregistration.k8s.io/",
    "/registry/services/endpoints/default/kubernetes",
    "/registry/endpointslices/default/kubernetes",
)
# Set-up objects a test may edit (a role with a permission removed, a labelled namespace).
RESTORED = (
    "/registry/namespaces/",
    "/registry/serviceaccounts/",
    "/registry/clusterroles/",
    "/registry/clusterrolebindings/",
    "/registry/roles/",
    "/registry/rolebindings/",
    "/registry/apiextensions.k8s.io/customresourcedefinitions/",
    "/registry/priorityclasses/",
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    # etcd's range end for "every key starting with prefix": the prefix with its last byte + 1.
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


@dataclass(frozen=True)
class Key:
    mod_revision: int
    value: str  # base64, as etcd's gateway returns it ("" when read keys-only)


class Snapshot:
    """The keys of one etcd (``etcd_url``: its client URL) at ``take`` time; ``restore`` returns there."""

    def __init__(self, etcd_url: str) -> None:
        self.etcd_url = etcd_url.rstrip("/")
        self._keys: dict[str, Key] = {}

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    def _read(self, keys_only: bool) -> dict[str, Key]:
        body = {"key": _b64(PREFIX), "range_end": _b64(_prefix_end(PREFIX)), "keys_only": keys_only}
        kvs = self._post("/v3/kv/range", body).get("kvs") or []
        return {
            base64.b64decode(kv["key"]).decode(): Key(int(kv.get("mod_revision", 0)), kv.get("value", ""))
            for kv in kvs
        }

    def take(self) -> None:
        """Remember every key and value now."""
        self._keys = self._read(keys_only=False)

    def restore(self) -> int:
        """Delete what was written since ``take`` and put back changed set-up objects; how many keys
        it touched. The revision it returns to is newer, so watchers see ordinary deletions."""
        now = self._read(keys_only=True)
        ops: list[dict[str, Any]] = []
        for key, current in now.items():
            if key.startswith(SERVER_OWNED):
                continue
            before = self._keys.get(key)
            if before is None:
                ops.append({"request_delete_range": {"key": _b64(key)}})
            elif current.mod_revision != before.mod_revision and key.startswith(RESTORED):
                ops.append({"request_put": {"key": _b64(key), "value": before.value}})
        for key, before in self._keys.items():
            if key not in now and key.startswith(RESTORED):
                ops.append({"request_put": {"key": _b64(key), "value": before.value}})
        # etcd caps the operations of one transaction (--max-txn-ops, 128 by default).
        for start in range(0, len(ops), 100):
            self._post("/v3/kv/txn", {"success": ops[start : start + 100]})
        if any("request_put" in op for op in ops):
            # The restored keys have new revisions now: remember those, so an untouched key is not
            # rewritten by every later reset.
            self._refresh_revisions()
        return len(ops)

    def _refresh_revisions(self) -> None:
        now = self._read(keys_only=True)
        self._keys = {k: Key(now[k].mod_revision, v.value) if k in now else v for k, v in self._keys.items()}


def delete_keys(etcd_url: str, keys: list[str]) -> None:
    """Delete keys from etcd directly: what a reset does, for a test that needs something gone at
    once (a CRD deleted through the API first waits for its instances to be cleaned up)."""
    snapshot = Snapshot(etcd_url)
    ops = [{"request_delete_range": {"key": _b64(key)}} for key in keys]
    for start in range(0, len(ops), 100):
        snapshot._post("/v3/kv/txn", {"success": ops[start : start + 100]})
