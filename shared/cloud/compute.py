"""``WorkloadPolicyAPI`` over the real ``google.cloud.compute_v1.ResourcePoliciesClient``.

Facts this adapter relies on (paraphrased from the sources named):

* A workload policy is a Compute Engine *resource policy* whose ``workloadPolicy`` holds a type
  (HIGH_THROUGHPUT or HIGH_AVAILABILITY) and optionally an ``acceleratorTopology``; it is regional
  (gcloud reference "gcloud compute resource-policies create workload-policy": NAME, --type,
  --region, --accelerator-topology, the last exclusive with --max-topology-distance).
* REST, from google-cloud-compute 1.57.0 (``services/resource_policies/transports/rest_base.py``):
  insert is ``POST /compute/v1/projects/{project}/regions/{region}/resourcePolicies`` with the policy
  as the body, get is ``GET .../resourcePolicies/{resource_policy}``; an insert answers with a
  regional Operation, read with ``GET /compute/v1/projects/{project}/regions/{region}/operations/{op}``
  (``services/region_operations``).
* ``ResourcePoliciesClient.insert`` wraps the answer in an ExtendedOperation whose polling client is
  built without the caller's ``client_options`` (``transports/base.py``, ``_region_operations_client``),
  so against a local emulator it would poll compute.googleapis.com. This adapter therefore calls
  ``insert_unary`` and polls with its own ``RegionOperationsClient`` on the same endpoint.

Waiting: GKE refuses a pool whose placement policy does not exist yet (container_v1
``NodePool.PlacementPolicy.policy_name``: InvalidArgument when not found), so ``insert`` polls the
operation until DONE, bounded by ``wait_seconds`` (Compute creates a policy in seconds). If it is
still running then, ``insert`` raises TransientError and the redelivery finds it (or waits again).

Production uses Application Default Credentials; with an ``endpoint`` (the sandbox's Compute
emulator, ``http://127.0.0.1:PORT``) the client uses it with anonymous credentials, as
``shared.cloud.gke`` does for the GKE emulator. The library is imported on first use only: it is
large, and most deliveries never need a workload policy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from shared.cloud.errors import from_google, from_status
from shared.cloud.gke import emulator_credentials
from shared.core.errors import TransientError
from shared.tpu.nodepools import WorkloadPolicyInfo

_log = logging.getLogger("tpuprov.compute")

HIGH_THROUGHPUT = "HIGH_THROUGHPUT"


def _raise_translated(exc: Exception, what: str) -> NoReturn:
    """Re-raise a client-library failure as the product's error (``shared.cloud.errors``)."""
    raise from_google(exc, "Compute Engine", what) from exc


def _enum_name(value: Any) -> str:
    return str(getattr(value, "name", value) or "")


def policy_to_info(policy: Any, region: str) -> WorkloadPolicyInfo:
    """Read the workload-policy fields of a ``compute_v1.ResourcePolicy``."""
    workload = policy.workload_policy
    return WorkloadPolicyInfo(
        name=policy.name,
        region=region,
        type=workload.type_,
        accelerator_topology=workload.accelerator_topology,
        status=policy.status,
    )


class ComputeWorkloadPolicyAPI:
    """The production ``WorkloadPolicyAPI``: thin calls, a bounded wait, error translation."""

    def __init__(
        self,
        endpoint: str = "",
        timeout: float = 8.0,
        wait_seconds: float = 10.0,
        poll_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        access_token: str = "",
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.access_token = access_token
        self.timeout = timeout
        self.wait_seconds = wait_seconds
        self.poll_interval = poll_interval
        self._clock = clock
        self._sleep = sleep
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, kind: str) -> Any:
        """``policies`` or ``operations``, built (and the library imported) on first use."""
        with self._lock:
            if kind not in self._clients:
                self._clients[kind] = self._build(kind)
            return self._clients[kind]

    def _build(self, kind: str) -> Any:
        from google.cloud import compute_v1

        factory: Any = compute_v1.ResourcePoliciesClient
        if kind == "operations":
            factory = compute_v1.RegionOperationsClient
        if not self.endpoint:
            return factory(transport="rest")
        # The REST transport keeps an explicit http:// scheme, which a plain-HTTP emulator needs.
        return factory(
            transport="rest",
            client_options={"api_endpoint": self.endpoint},
            credentials=emulator_credentials(self.access_token),
        )

    def _call(self, what: str, kind: str, method: str, **request: Any) -> Any:
        try:
            return getattr(self._client(kind), method)(retry=None, timeout=self.timeout, **request)
        except Exception as exc:
            _raise_translated(exc, what)

    def get(self, project: str, region: str, name: str) -> WorkloadPolicyInfo:
        """One workload policy. Raises NotFoundError."""
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        policy = self._call(
            f"get resource policy {path}",
            "policies",
            "get",
            project=project,
            region=region,
            resource_policy=name,
        )
        return policy_to_info(policy, region)

    def insert(self, project: str, region: str, name: str, accelerator_topology: str, why: str) -> None:
        """Create a HIGH_THROUGHPUT workload policy and wait (bounded) until Compute has made it."""
        from google.cloud import compute_v1

        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        _log.info(
            "creating workload policy %s: %s",
            path,
            why,
            extra={"fields": {"event": "compute.insert_resource_policy", "policy": path, "why": why}},
        )
        policy = compute_v1.ResourcePolicy(
            name=name,
            description=f"tpu-provisioner: placement of multi-host tpu7x slices {accelerator_topology}",
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_=HIGH_THROUGHPUT, accelerator_topology=accelerator_topology
            ),
        )
        operation = self._call(
            f"create resource policy {path}",
            "policies",
            "insert_unary",
            project=project,
            region=region,
            resource_policy_resource=policy,
        )
        self._wait(project, region, operation, path)

    def _wait(self, project: str, region: str, operation: Any, path: str) -> None:
        """Poll the regional operation until DONE (then raise its error, if any) or the wait ends."""
        end = self._clock() + self.wait_seconds
        delay = self.poll_interval
        while _enum_name(operation.status) != "DONE":
            if self._clock() + delay > end:
                raise TransientError(
                    f"Compute Engine is still creating resource policy {path} after "
                    f"{self.wait_seconds:.0f}s (operation {operation.name}); retried on redelivery"
                )
            self._sleep(delay)
            delay = min(delay * 2, 2.0)
            operation = self._call(
                f"get operation {operation.name}",
                "operations",
                "get",
                project=project,
                region=region,
                operation=operation.name,
            )
        errors = list(operation.error.errors)
        if errors or operation.http_error_status_code >= 400:
            message = "; ".join(e.message for e in errors) or operation.http_error_message
            code = int(operation.http_error_status_code or 400)
            raise from_status(code, f"Compute Engine create resource policy {path}: {message}", message)
