"""Kubernetes name/label validation and the deterministic node-pool name of a slice.

The pool name is the product's idempotency key: every pod of a slice, every duplicate delivery
and every concurrent instance derives the same name, so GKE's 409 makes them converge on one pool.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

# GKE: node pool names are RFC 1035 labels of at most 40 characters.
POOL_NAME_MAX = 40
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def is_rfc1035(name: str, max_len: int = 63) -> bool:
    """True for a lowercase RFC 1035 label (starts with a letter) of at most ``max_len`` chars."""
    return 0 < len(name) <= max_len and bool(_RFC1035.match(name))


def is_dns1123_label(name: str) -> bool:
    """True for a Kubernetes DNS-1123 label (namespaces, most object names), <= 63 chars."""
    return 0 < len(name) <= 63 and bool(_DNS1123_LABEL.match(name))


def is_dns1123_subdomain(name: str) -> bool:
    """True for a Kubernetes DNS-1123 subdomain (pod and JobSet names), <= 253 chars."""
    return 0 < len(name) <= 253 and bool(_DNS1123_SUBDOMAIN.match(name))


def label_key_problem(key: str) -> str:
    """Why ``key`` is not a valid Kubernetes label key, or "" when it is."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return f"label key {key!r} has an invalid prefix"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return f"label key {key!r} has an invalid name part"
    return ""


def label_value_problem(value: str) -> str:
    """Why ``value`` is not a valid Kubernetes label value, or "" when it is."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return f"label value {value!r} is not a valid Kubernetes label value"
    return ""


@dataclasses.dataclass(frozen=True)
class SliceId:
    """Identity of one TPU slice: one Job (replica ``job_index`` of ``replicated_job``) of a JobSet."""

    namespace: str
    jobset: str
    jobset_uid: str
    replicated_job: str
    job_index: int

    def describe(self) -> str:
        """Human-readable identity used in logs and Events."""
        return f"{self.namespace}/{self.jobset} {self.replicated_job}[{self.job_index}]"


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug


def pool_name(slice_id: SliceId) -> str:
    """The deterministic GKE node-pool name of a slice.

    Readable parts (JobSet and replicated-job names, index) help a human in the console; the hash
    of the full identity (including the JobSet uid) makes it unique, so a new JobSet that reuses a
    name never collides with the old one's pools. The restart attempt is deliberately not part of
    it: a restarted JobSet reuses its pools.
    """
    identity = "/".join(
        (
            slice_id.namespace,
            slice_id.jobset,
            slice_id.jobset_uid,
            slice_id.replicated_job,
            str(slice_id.job_index),
        )
    )
    # 64 bits of the identity: a 32-bit digest can be matched offline (2^32 tries), so a tenant could
    # craft a slice whose pool name is another team's. Pools named with the earlier 8-digit digest
    # are still found by their owner labels (shared.provisioning.provisioner._slice_pool).
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    tail = f"-{slice_id.job_index}-{digest}"
    room = POOL_NAME_MAX - len("tpu-") - len(tail)
    jobset = _slug(slice_id.jobset)
    rjob = _slug(slice_id.replicated_job)
    # Give the JobSet name at least half of the room; the replicated job gets what is left.
    rjob_room = max(0, min(len(rjob), room - 1 - min(len(jobset), room // 2)))
    jobset_room = room - (rjob_room + 1 if rjob_room else 0)
    parts = [jobset[:jobset_room].strip("-")]
    if rjob_room:
        parts.append(rjob[:rjob_room].strip("-"))
    middle = "-".join(p for p in parts if p)
    name = f"tpu-{middle}{tail}" if middle else f"tpu{tail}"
    name = re.sub(r"-{2,}", "-", name)
    assert is_rfc1035(name, POOL_NAME_MAX), name
    return name


# The product's own workload policies (tpu7x multi-host placement) start with this; see
# ``shared.provisioning.create.policies``. Compute Engine resource names are RFC 1035 labels of <= 63 chars
# (google-cloud-compute ``ResourcePolicy.name`` docstring).
WORKLOAD_POLICY_PREFIX = "tpuprov-tpu7x-"


def workload_policy_name(topology: str) -> str:
    """The deterministic name of the workload policy the product creates for a tpu7x topology.

    One policy per topology and region, shared by every slice of that shape (and by every deployment
    in the project): ``2x2x2`` -> ``tpuprov-tpu7x-2-2-2``, the same ``x`` -> ``-`` spelling as the
    ``{topology}`` placeholder of TPU7X_WORKLOAD_POLICY.
    """
    return f"{WORKLOAD_POLICY_PREFIX}{topology.lower().replace('x', '-')}"


def region_of_zone(zone: str) -> str:
    """``us-central2-b`` -> ``us-central2``: a zone's region is the zone without its last part."""
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone
