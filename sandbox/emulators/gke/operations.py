"""Long-running operations of the GKE emulator and the JSON shapes shared by its state."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from google.cloud.container_v1.types import cluster_service as cs
from google.protobuf import json_format

from sandbox.emulators.gke.rules import region_of
from sandbox.emulators.gke.seeds import ClusterSeed

API_BASE = "https://container.googleapis.com/v1"
OperationPb: Any = cs.Operation.pb()


def now_rfc3339() -> str:
    """Wall-clock now as GKE writes timestamps."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_dict(message: Any) -> dict[str, Any]:
    """A protobuf message as the camelCase JSON dict GKE would send (string enums)."""
    result: dict[str, Any] = json_format.MessageToDict(message)
    return result


# Operation type -> the API method GKE's audit log names for it.
OP_METHODS = {
    cs.Operation.Type.CREATE_NODE_POOL: "CreateNodePool",
    cs.Operation.Type.DELETE_NODE_POOL: "DeleteNodePool",
    cs.Operation.Type.UPGRADE_NODES: "UpdateNodePool",
}


@dataclasses.dataclass
class Operation:
    """One long-running node-pool operation."""

    op_id: str
    cluster: ClusterSeed
    op_type: int
    pool: str
    started: float
    delay: float
    start_time: str
    error: str = ""
    done: bool = False
    end_time: str = ""


def operation_message(op: Operation, now: float) -> Any:
    """The google.container.v1 Operation message for ``op`` at clock time ``now``."""
    seed = op.cluster
    if op.done:
        status = cs.Operation.Status.DONE
    elif now - op.started < op.delay * 0.2:
        status = cs.Operation.Status.PENDING
    else:
        status = cs.Operation.Status.RUNNING
    message = OperationPb(
        name=op.op_id,
        location=seed.location,
        operation_type=op.op_type,
        status=status,
        self_link=f"{API_BASE}/projects/{seed.project}/locations/{seed.location}/operations/{op.op_id}",
        target_link=f"{API_BASE}/{seed.path}/nodePools/{op.pool}",
        start_time=op.start_time,
        end_time=op.end_time,
    )
    if region_of(seed.location) != seed.location:
        message.zone = seed.location
    if op.done and op.error:
        message.status_message = op.error
        message.error.code = 8  # RESOURCE_EXHAUSTED, as GKE reports stockouts
        message.error.message = op.error
    return message
