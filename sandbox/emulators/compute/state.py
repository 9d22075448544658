"""The stateful model behind the Compute Engine emulator: regional resource policies and operations.

Only what the product uses: insert and get a resource policy (workload policies), and read the regional
operation an insert returns. Objects are kept as the camelCase JSON Compute sends. Validation follows
Compute's rules and, where a real text was found, its wording:

* names: RFC 1035, 1-63 characters, regex ``[a-z]([-a-z0-9]*[a-z0-9])?`` (google-cloud-compute 1.57.0,
  ``ResourcePolicy.name`` docstring); Compute's refusal text "Invalid value for field 'resource.name':
  ... Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'" is quoted in many public repos;
* 404 "The resource '<path>' was not found" and 409 "The resource '<path>' already exists" are
  Compute's texts for every resource kind (quoted e.g. for instances in public test fixtures);
* 403 "Required '<permission>' permission for '<path>'" (a gcloud error quoted in a public Go test of a
  tpu7x workload-policy resolver);
* a workload policy has a type (HIGH_THROUGHPUT, HIGH_AVAILABILITY) and an accelerator topology OR a
  max topology distance, not both (gcloud reference, resource-policies create workload-policy). The
  texts of those two refusals were not found; they are written in Compute's style.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import re
import threading
import time
from collections.abc import Callable
from typing import Any

API_BASE = "https://www.googleapis.com/compute/v1"
_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_NAME_REGEX_TEXT = "(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)"
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+\d+$")
_TOPOLOGY_RE = re.compile(r"^[1-9]\d*(?:x[1-9]\d*){1,2}$")
WORKLOAD_TYPES = ("HIGH_THROUGHPUT", "HIGH_AVAILABILITY")


class ComputeError(Exception):
    """A refusal sent as Compute's ``{"error": {"code", "message", "errors": [...]}}``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def payload(self) -> dict[str, Any]:
        """The JSON error body Compute sends."""
        detail = {"message": self.message, "domain": "global", "reason": self.reason}
        return {"error": {"code": self.code, "message": self.message, "errors": [detail]}}


def _invalid(message: str) -> ComputeError:
    return ComputeError(400, "invalid", message)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def validate_policy(body: dict[str, Any]) -> None:
    """Compute's create-time checks for a resource policy with a ``workloadPolicy``."""
    name = body.get("name")
    if not name:
        raise ComputeError(400, "required", "Required field 'resource.name' not specified")
    if not _NAME_RE.match(str(name)):
        raise _invalid(
            f"Invalid value for field 'resource.name': '{name}'. "
            f"Must be a match of regex '{_NAME_REGEX_TEXT}'"
        )
    workload = body.get("workloadPolicy")
    if workload is None:
        return  # other policy kinds are accepted as they come; the product only makes workload ones
    kind = workload.get("type")
    if kind not in WORKLOAD_TYPES:
        raise _invalid(f"Invalid value for field 'resource.workloadPolicy.type': '{kind or ''}'.")
    topology = workload.get("acceleratorTopology")
    if topology and workload.get("maxTopologyDistance"):
        raise _invalid("acceleratorTopology and maxTopologyDistance cannot both be set in a workload policy.")
    if topology is not None and not _TOPOLOGY_RE.match(str(topology)):
        raise _invalid(
            f"Invalid value for field 'resource.workloadPolicy.acceleratorTopology': '{topology}'."
        )


@dataclasses.dataclass
class _Operation:
    body: dict[str, Any]
    done_at: float
    policy_key: tuple[str, str, str]
    policy: dict[str, Any]


class ComputeState:
    """Resource policies and their insert operations; every public method is thread-safe."""

    def __init__(self, op_delay: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._op_delay = op_delay
        self._policies: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._ops: dict[tuple[str, str, str], _Operation] = {}
        self._ids = itertools.count(1000)
        self._denied: set[str] = set()  # permissions the caller lacks

    def set_op_delay(self, seconds: float) -> None:
        """How long inserts started from now on stay RUNNING (0: DONE in the insert's answer)."""
        with self._lock:
            self._op_delay = seconds

    def deny(self, permission: str) -> None:
        """Answer calls needing ``permission`` (e.g. ``compute.resourcePolicies.create``) with 403."""
        with self._lock:
            self._denied.add(permission)

    def allow_all(self) -> None:
        """Grant every permission again."""
        with self._lock:
            self._denied.clear()

    def _require(self, permission: str, path: str) -> None:
        if permission in self._denied:
            raise ComputeError(403, "forbidden", f"Required '{permission}' permission for '{path}'")

    def exists(self, project: str, region: str, name: str) -> bool:
        """Whether the policy exists (created and its operation DONE)."""
        self.advance()
        with self._lock:
            return (project, region, name) in self._policies

    def policies(self) -> list[dict[str, Any]]:
        """Every existing policy as Compute JSON."""
        self.advance()
        with self._lock:
            return [dict(p) for p in self._policies.values()]

    def get_policy(self, project: str, region: str, name: str) -> dict[str, Any]:
        """One policy; 404 in Compute's words when absent."""
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        self.advance()
        with self._lock:
            self._require("compute.resourcePolicies.get", path)
            policy = self._policies.get((project, region, name))
            if policy is None:
                raise ComputeError(404, "notFound", f"The resource '{path}' was not found")
            return dict(policy)

    def insert_policy(self, project: str, region: str, body: dict[str, Any]) -> dict[str, Any]:
        """Validate and start creating a policy; returns the regional Operation."""
        self.advance()
        with self._lock:
            if not _REGION_RE.match(region):
                raise ComputeError(
                    404, "notFound", f"The resource 'projects/{project}/regions/{region}' was not found"
                )
            validate_policy(body)
            name = str(body["name"])
            key = (project, region, name)
            path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
            self._require("compute.resourcePolicies.create", path)
            pending = any(op.policy_key == key and op.body["status"] != "DONE" for op in self._ops.values())
            if key in self._policies or pending:
                raise ComputeError(409, "alreadyExists", f"The resource '{path}' already exists")
            ident = next(self._ids)
            policy = {
                **body,
                "kind": "compute#resourcePolicy",
                "id": str(ident),
                "creationTimestamp": _now(),
                "region": f"{API_BASE}/projects/{project}/regions/{region}",
                "selfLink": f"{API_BASE}/{path}",
                "status": "READY",
            }
            op_name = f"operation-{int(time.time() * 1000)}-{ident:x}"
            op = {
                "kind": "compute#operation",
                "id": str(ident + 1),
                "name": op_name,
                "operationType": "insert",
                "targetLink": f"{API_BASE}/{path}",
                "targetId": str(ident),
                "status": "RUNNING",
                "progress": 0,
                "insertTime": _now(),
                "startTime": _now(),
                "region": f"{API_BASE}/projects/{project}/regions/{region}",
                "selfLink": f"{API_BASE}/projects/{project}/regions/{region}/operations/{op_name}",
            }
            self._ops[(project, region, op_name)] = _Operation(
                op, self._clock() + self._op_delay, key, policy
            )
        self.advance()
        return self.get_operation(project, region, op_name)

    def get_operation(self, project: str, region: str, name: str) -> dict[str, Any]:
        """A regional operation; 404 when unknown."""
        self.advance()
        with self._lock:
            op = self._ops.get((project, region, name))
            if op is None:
                path = f"projects/{project}/regions/{region}/operations/{name}"
                raise ComputeError(404, "notFound", f"The resource '{path}' was not found")
            return dict(op.body)

    def advance(self) -> None:
        """Finish the operations whose time has come: their policy then exists."""
        now = self._clock()
        with self._lock:
            for op in self._ops.values():
                if op.body["status"] != "DONE" and now >= op.done_at:
                    op.body.update(status="DONE", progress=100, endTime=_now())
                    self._policies[op.policy_key] = op.policy
