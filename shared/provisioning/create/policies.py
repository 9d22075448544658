"""The workload-policy service: make the product's tpu7x placement policy exist before a create.

GKE places a multi-host Ironwood (tpu7x) slice with a Compute Engine workload policy that the node
pool names in its placement policy (GKE "About Ironwood (TPU7x) in GKE"); the policy must exist in
the pool's project and region when the create is sent (container_v1 ``PlacementPolicy.policy_name``).
When the operator names one (TPU7X_WORKLOAD_POLICY) the product uses it and creates nothing. Otherwise
``shared.tpu.slices.build_node_pool`` names the product's own, one per topology and region
(``shared.core.names.workload_policy_name``), and this service creates it on first need: a HIGH_THROUGHPUT
policy whose accelerator topology is the slice topology ("2x2x2"), the same command Google's XPK runs.

Idempotent by construction: get -> exists: use it; 404 -> insert; 409 on insert (another instance or
delivery made it first) is success. Once seen, a policy is remembered for the instance's life, so a
JobSet of 64 slices of one shape costs one get (and at most one insert). Policies are never deleted:
they cost nothing, are shared by every slice of their shape, and deleting one would race with creates.
"""

from __future__ import annotations

import logging
import threading

from shared.cloud.ports import WorkloadPolicyAPI
from shared.core import logs
from shared.core.errors import AlreadyExistsError, NotFoundError, RejectedError, TransientError
from shared.core.names import region_of_zone
from shared.core.settings import Settings
from shared.tpu.nodepools import NodePoolSpec, Placement, WorkloadPolicyInfo

log = logs.get("policies")

HIGH_THROUGHPUT = "HIGH_THROUGHPUT"
# ResourcePolicy.Status (google-cloud-compute): CREATING and DELETING pass by themselves.
_PASSING = ("CREATING", "DELETING")
_USABLE = ("", "READY")


class WorkloadPolicies:
    """Ensures the product-managed workload policies exist; one instance per function instance."""

    def __init__(self, settings: Settings, api: WorkloadPolicyAPI) -> None:
        self.settings = settings
        self.api = api
        self._ready: set[tuple[str, str]] = set()  # (region, name) known to exist
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def ensure_for(self, spec: NodePoolSpec, why: str) -> str:
        """Make the workload policy ``spec``'s placement names exist, if the product manages it.

        Returns the policy name ("" for a pool without a named policy). Raises RejectedError when
        Compute refuses (e.g. 403: the service account lacks compute.resourcePolicies.create) and
        TransientError when retrying can help; either way the create must not be sent.
        """
        placement = spec.placement
        if placement is None or not placement.managed_topology:
            return placement.policy_name if placement else ""
        zone = spec.node_locations[0] if spec.node_locations else self.settings.location
        return self.ensure(placement, region_of_zone(zone), f"{why} (node pool {spec.name})")

    def ensure(self, placement: Placement, region: str, why: str) -> str:
        """Make ``placement.policy_name`` exist in ``region`` for ``placement.managed_topology``."""
        name, topology = placement.policy_name, placement.managed_topology
        key = (region, name)
        with self._guard:
            if key in self._ready:
                return name
            lock = self._locks.setdefault(key, threading.Lock())
        # One caller per policy does the I/O; concurrent creates of the same shape wait, then find it
        # remembered (so a fan-out of siblings costs one get and at most one insert).
        with lock:
            with self._guard:
                if key in self._ready:
                    return name
            self._make_exist(region, name, topology, why)
            with self._guard:
                self._ready.add(key)
        return name

    def _make_exist(self, region: str, name: str, topology: str, why: str) -> None:
        project = self.settings.project_id
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        try:
            self._check(path, topology, self.api.get(project, region, name))
            return
        except NotFoundError:
            pass
        except RejectedError as exc:
            raise RejectedError(self._refusal(path, "read", exc.why), exc.code) from None
        try:
            self.api.insert(project, region, name, topology, why)
        except AlreadyExistsError:
            logs.decision(log, "policy.exists", f"workload policy {path} was created concurrently (409)")
            return
        except RejectedError as exc:
            raise RejectedError(self._refusal(path, "create", exc.why), exc.code) from None
        logs.decision(
            log,
            "policy.created",
            f"created workload policy {path} (HIGH_THROUGHPUT, accelerator topology {topology}): {why}",
            logging.INFO,
            policy=path,
        )

    @staticmethod
    def _check(path: str, topology: str, info: WorkloadPolicyInfo) -> None:
        """A policy of the product's name must be the one the product would create."""
        if info.status in _PASSING:
            raise TransientError(f"workload policy {path} is {info.status}; retried on redelivery")
        if info.status not in _USABLE:
            raise RejectedError(f"workload policy {path} is {info.status} and cannot place node pools")
        if info.type != HIGH_THROUGHPUT or info.accelerator_topology != topology:
            raise RejectedError(
                f"resource policy {path} exists but is not a HIGH_THROUGHPUT workload policy for "
                f"accelerator topology {topology} (type {info.type or '-'}, topology "
                f"{info.accelerator_topology or '-'}); delete or rename it, or set TPU7X_WORKLOAD_POLICY"
            )

    @staticmethod
    def _refusal(path: str, verb: str, why: str) -> str:
        return (
            f"cannot {verb} workload policy {path} for a multi-host tpu7x slice: {why}; grant the "
            "provision service account compute.resourcePolicies.get/create (infra/iam.tf), or create "
            "the policy yourself and set TPU7X_WORKLOAD_POLICY"
        )
