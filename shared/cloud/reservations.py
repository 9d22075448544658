"""``ReservationAPI`` over the real ``google.cloud.compute_v1`` reservation clients.

Facts this adapter relies on (google-cloud-compute 1.57.0, ``services/*/transports/rest_base.py``,
and the Compute Engine API v1 reference):

* ``ReservationsClient.get(project, zone, reservation)`` is
  ``GET /compute/v1/projects/{project}/zones/{zone}/reservations/{reservation}``; the reservation's
  ``resourceStatus.reservationBlockCount`` says how many blocks it has.
* ``ReservationBlocksClient.list(project, zone, reservation)`` is ``GET .../reservations/{reservation}
  /reservationBlocks`` and pages over ``items``; a block's ``reservationSubBlockCount`` says how
  many sub-blocks it has.
* ``ReservationSubBlocksClient.list(project, zone, parent_name)`` is ``GET .../zones/{zone}/
  {parent_name}/reservationSubBlocks`` with ``parent_name`` =
  ``reservations/{reservation}/reservationBlocks/{block}``.
* The permissions are ``compute.reservations.get``, ``compute.reservationBlocks.list`` and
  ``compute.reservationSubBlocks.list`` (Compute Engine, "Manage host maintenance across
  reservations", Required permissions), in the project that owns the reservation.

Blocks are listed only for a reservation that reports some, sub-blocks only for a block that
reports some: a plain reservation costs one call. Production uses Application Default Credentials;
with an ``endpoint`` (the sandbox's Compute emulator) the clients use it with anonymous credentials.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn

from shared.cloud.errors import from_google
from shared.cloud.gke import emulator_credentials
from shared.tpu.reservations import BlockView, ReservationView, SubBlockView

_CLIENTS = {
    "reservations": "ReservationsClient",
    "blocks": "ReservationBlocksClient",
    "sub_blocks": "ReservationSubBlocksClient",
}


def _raise_translated(exc: Exception, what: str) -> NoReturn:
    raise from_google(exc, "Compute Engine", what) from exc


def _machine_type(reservation: Any) -> str:
    # instanceProperties.machineType is a bare name ("ct6e-standard-4t") in a specific reservation.
    value = str(reservation.specific_reservation.instance_properties.machine_type or "")
    return value.rsplit("/", 1)[-1]


def _health(message: Any) -> str:
    return str(message.health_info.health_status or "") if "health_info" in message else ""


def sub_block_to_view(sub: Any) -> SubBlockView:
    """A ``compute_v1.ReservationSubBlock`` as the product reads it."""
    return SubBlockView(
        name=sub.name,
        hosts=int(sub.count or 0),
        hosts_in_use=int(sub.in_use_host_count or 0),
        status=str(sub.status or ""),
        health=_health(sub),
    )


def block_to_view(block: Any, sub_blocks: tuple[SubBlockView, ...]) -> BlockView:
    """A ``compute_v1.ReservationBlock`` (with its sub-blocks already read)."""
    return BlockView(
        name=block.name,
        vms=int(block.count or 0),
        vms_in_use=int(block.in_use_count or 0),
        status=str(block.status or ""),
        health=_health(block),
        sub_blocks=sub_blocks,
    )


def reservation_to_view(
    reservation: Any, project: str, zone: str, blocks: tuple[BlockView, ...]
) -> ReservationView:
    """A ``compute_v1.Reservation`` of ``project`` in ``zone`` (with its blocks already read)."""
    specific = reservation.specific_reservation
    return ReservationView(
        name=reservation.name,
        project=project,
        zone=zone,
        machine_type=_machine_type(reservation),
        vms=int(specific.count or 0),
        vms_in_use=int(specific.in_use_count or 0),
        status=str(reservation.status or ""),
        blocks=blocks,
    )


class ComputeReservationAPI:
    """The production ``ReservationAPI``: thin reads and error translation, no retries (the caller's
    delivery is redelivered on a TransientError)."""

    def __init__(self, endpoint: str = "", timeout: float = 8.0, access_token: str = "") -> None:
        self.endpoint = endpoint.rstrip("/")
        self.access_token = access_token
        self.timeout = timeout
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _client(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._clients:
                from google.cloud import compute_v1

                factory = getattr(compute_v1, _CLIENTS[kind])
                if self.endpoint:
                    self._clients[kind] = factory(
                        transport="rest",
                        client_options={"api_endpoint": self.endpoint},
                        credentials=emulator_credentials(self.access_token),
                    )
                else:
                    self._clients[kind] = factory(transport="rest")
            return self._clients[kind]

    def _call(self, what: str, kind: str, method: str, **request: Any) -> Any:
        try:
            answer = getattr(self._client(kind), method)(retry=None, timeout=self.timeout, **request)
            return list(answer) if method == "list" else answer  # a pager fetches its pages here
        except Exception as exc:
            _raise_translated(exc, what)

    def get_reservation(self, project: str, zone: str, name: str) -> ReservationView:
        """The reservation with its blocks and their sub-blocks. Raises NotFoundError, RejectedError
        (403 naming the missing permission) or TransientError."""
        path = f"projects/{project}/zones/{zone}/reservations/{name}"
        reservation = self._call(
            f"get reservation {path}", "reservations", "get", project=project, zone=zone, reservation=name
        )
        blocks: list[BlockView] = []
        if int(reservation.resource_status.reservation_block_count or 0) > 0:
            for block in self._call(
                f"list the blocks of reservation {path}",
                "blocks",
                "list",
                project=project,
                zone=zone,
                reservation=name,
            ):
                subs: tuple[SubBlockView, ...] = ()
                if int(block.reservation_sub_block_count or 0) > 0:
                    parent = f"reservations/{name}/reservationBlocks/{block.name}"
                    subs = tuple(
                        sub_block_to_view(s)
                        for s in self._call(
                            f"list the sub-blocks of {path}/reservationBlocks/{block.name}",
                            "sub_blocks",
                            "list",
                            project=project,
                            zone=zone,
                            parent_name=parent,
                        )
                    )
                blocks.append(block_to_view(block, subs))
        return reservation_to_view(reservation, project, zone, tuple(blocks))


__all__ = ["ComputeReservationAPI", "block_to_view", "reservation_to_view", "sub_block_to_view"]
