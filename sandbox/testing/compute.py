"""Stateful fakes of ``WorkloadPolicyAPI`` and ``ReservationAPI`` speaking Compute's error
vocabulary, and their pytest fixtures.

Service-level tests use ``FakeWorkloadPolicies`` and ``FakeReservations``; wire-level tests use the
HTTP emulator (``sandbox.emulators.compute``) through the ``compute_emulator`` fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.emulators.compute.emulator import ComputeEmulator
from shared.core.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    RejectedError,
    TransientError,
)
from shared.tpu.nodepools import WorkloadPolicyInfo
from shared.tpu.reservations import ReservationView


class FakeWorkloadPolicies:
    """Workload policies in a dict; ``deny(permission)`` and ``fail(method, kind)`` inject refusals."""

    def __init__(self) -> None:
        self.policies: dict[tuple[str, str, str], WorkloadPolicyInfo] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path)
        self._denied: set[str] = set()
        self._faults: dict[str, list[str]] = {}

    def deny(self, permission: str) -> None:
        """Refuse calls needing ``permission`` (``compute.resourcePolicies.get``/``create``) with 403."""
        self._denied.add(permission)

    def fail(self, method: str, kind: str = "transient", times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (``get``/``insert``) fail: transient (503) or conflict
        (409, as when another instance inserts between this one's get and insert)."""
        self._faults.setdefault(method, []).extend([kind] * times)

    def add(self, project: str, region: str, info: WorkloadPolicyInfo) -> None:
        """Seed an existing policy (e.g. one someone else made)."""
        self.policies[(project, region, info.name)] = info

    def count(self, method: str) -> int:
        """How many ``get``/``insert`` calls were made."""
        return sum(1 for m, _ in self.calls if m == method)

    def _enter(self, method: str, permission: str, path: str) -> None:
        self.calls.append((method, path))
        queue = self._faults.get(method) or []
        kind = queue.pop(0) if queue else ""
        if kind == "transient":
            raise TransientError(f"Compute Engine {method} {path}: 503 Internal error")
        if kind == "conflict":
            raise AlreadyExistsError(f"Compute Engine {method} {path}: The resource '{path}' already exists")
        if permission in self._denied:
            raise RejectedError(f"Required '{permission}' permission for '{path}'", 403)

    def get(self, project: str, region: str, name: str) -> WorkloadPolicyInfo:
        """One policy; NotFoundError in Compute's words."""
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        self._enter("get", "compute.resourcePolicies.get", path)
        info = self.policies.get((project, region, name))
        if info is None:
            raise NotFoundError(f"The resource '{path}' was not found")
        return info

    def insert(self, project: str, region: str, name: str, accelerator_topology: str, why: str) -> None:
        """Create a HIGH_THROUGHPUT workload policy (done at once)."""
        path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        self._enter("insert", "compute.resourcePolicies.create", path)
        if (project, region, name) in self.policies:
            raise AlreadyExistsError(f"The resource '{path}' already exists")
        self.policies[(project, region, name)] = WorkloadPolicyInfo(
            name, region, "HIGH_THROUGHPUT", accelerator_topology, "READY"
        )


class FakeReservations:
    """Reservations in a dict by (project, zone, name); ``deny(project)`` refuses reads in a project
    as Compute does without ``compute.reservations.get`` there."""

    def __init__(self) -> None:
        self.reservations: dict[tuple[str, str, str], ReservationView] = {}
        self.calls: list[str] = []  # the paths read
        self._denied: set[str] = set()

    def add(self, view: ReservationView) -> None:
        """Seed (or replace) a reservation."""
        self.reservations[(view.project, view.zone, view.name)] = view

    def deny(self, project: str) -> None:
        """Reads of reservations of ``project`` meet Compute's 403."""
        self._denied.add(project)

    def get_reservation(self, project: str, zone: str, name: str) -> ReservationView:
        """One reservation; NotFoundError and PermissionDeniedError in Compute's words."""
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        self.calls.append(path)
        if project in self._denied:
            permission = "compute.reservations.get"
            raise PermissionDeniedError(f"Required '{permission}' permission for '{path}'", permission)
        view = self.reservations.get((project, zone, name))
        if view is None:
            raise NotFoundError(f"The resource '{path}' was not found")
        return view


@pytest.fixture
def compute_emulator() -> Iterator[ComputeEmulator]:
    """A started Compute emulator; insert operations finish at once."""
    with ComputeEmulator() as emulator:
        yield emulator
