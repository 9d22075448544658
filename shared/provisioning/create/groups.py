"""A replicated job's slices requested together: their specs, the pools to create, the group, and
its deferral.

Every pool of a replicated job is requested in one delivery (with exclusive placement any Job may
land on any free pool of its shape). ``Specs`` builds each slice's pool spec once per capacity
option; ``Create`` is one pool of it with the reason logged and sent with its create; ``Group`` is
what one delivery carries through the creates.
"""

from __future__ import annotations

import dataclasses

from shared.cloud.retry import Budget
from shared.core import labels
from shared.core.errors import OperationLimitError, TransientError
from shared.core.settings import Settings
from shared.tpu import capacity, catalog
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_PROVISIONING, ClusterInfo, NodePoolInfo, NodePoolSpec
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest, build_node_pool, pool_name

# A pod's claimed replica count is only a hint; a forged huge one must not cost more than this.
_MAX_REPLICAS_HINT = 1024


class Specs:
    """The pool specs of one delivery's slices, each built once per (slice, capacity option).

    The pod's own spec is first built on its own choice (what it selects, in its default zone),
    before the JobSet's capacity policy is known; an attempt whose option is that same choice gets
    that spec back instead of a second build. Raises ``Refused`` (from ``build_node_pool``) for a
    slice no pool can be.
    """

    def __init__(self, settings: Settings, cluster: ClusterInfo | None) -> None:
        self.settings = settings
        self.cluster = cluster
        self._built: dict[tuple[str, str], tuple[NodePoolSpec, catalog.SliceShape]] = {}

    def of(
        self, request: SliceRequest, option: CapacityOption | None = None
    ) -> tuple[NodePoolSpec, catalog.SliceShape]:
        """The spec and shape of ``request``'s pool on ``option`` (None: the pod's own choice)."""
        key = (request.pool_name, option.key if option is not None else "")
        if key not in self._built:
            built = build_node_pool(self.settings, request, self.cluster, option)
            self._built[key] = built
            if option is None:  # the own choice is also the option it resolved to
                self._built.setdefault((request.pool_name, capacity.key_of_spec(built[0])), built)
        return self._built[key]


@dataclasses.dataclass(frozen=True)
class Create:
    """One pool to request: the slice, the pool spec and its shape, its description and why it is
    created."""

    request: SliceRequest
    spec: NodePoolSpec
    slice_desc: str
    why: str  # the create's reason, logged and sent to GKE as its operation's description
    shape: catalog.SliceShape

    @classmethod
    def of(
        cls, request: SliceRequest, spec: NodePoolSpec, shape: catalog.SliceShape, note: str = ""
    ) -> Create:
        """The create of ``spec`` for ``request``; ``note`` is appended to its reason."""
        slice_desc = request.slice_id.describe()
        why = (
            f"{slice_desc} pending: {shape.num_vms} x {shape.machine_type} "
            f"({request.accelerator} {shape.topology}, {shape.total_chips} chips)"
        )
        return cls(request, spec, slice_desc, f"{why} {note}" if note else why, shape)

    def listed(self) -> NodePoolInfo:
        """The pool once GKE accepted this create, as the next listing shows it (PROVISIONING: it
        takes an operation slot)."""
        spec = self.spec
        return NodePoolInfo(
            spec.name, STATUS_PROVISIONING, spec.machine_type, spec.node_count, dict(spec.labels)
        )


@dataclasses.dataclass(frozen=True)
class Group:
    """One delivery's request of a replicated job: the pod that asked (and its slice), the JobSet
    read, the pools to create (the pod's own first when it has none yet), their shape, the listing
    (extended with what is created) and the delivery's deadline."""

    pod: Pod
    request: SliceRequest
    jobset: JobSet
    wanted: list[Create]
    shape: catalog.SliceShape
    pools: list[NodePoolInfo]
    budget: Budget


def group_incomplete(pod: Pod, request: SliceRequest, pools: list[NodePoolInfo]) -> bool:
    """Whether the listing lacks a pool of the replicated job the pod says it belongs to.

    Only a hint for when to read the JobSet (which then decides); it costs no API call, so a storm
    of events for slices that exist stays at two reads per event.
    """
    try:
        replicas = int(str(pod.jobset_value(labels.REPLICATED_JOB_REPLICAS) or 0))
    except ValueError:
        return False
    names = {p.name for p in pools}
    sid = request.slice_id
    return any(
        pool_name(dataclasses.replace(sid, job_index=index)) not in names
        for index in range(min(replicas, _MAX_REPLICAS_HINT))
    )


def deferral(
    wanted: int, accepted: int, failures: list[TransientError], unsent: int, stopped: str
) -> TransientError:
    """The error that sends a partly requested group back for redelivery (OperationLimitError when
    GKE's operation limit stopped it, so the caller's retry policy can tell)."""
    reason = stopped or failures[0].why
    left = unsent + len(failures)
    why = (
        f"{accepted} of {wanted} pools of the replicated job requested, {left} left for redelivery: {reason}"
    )
    limited = any(isinstance(f, OperationLimitError) for f in failures)
    return (OperationLimitError if limited else TransientError)(why)
