"""Field-level parsing and validation for ``shared.events.envelope`` (and the sandbox's LogEntry builders).

Everything that may end up in a GKE or Kubernetes API path is checked here against the rules
the APIs themselves enforce, so that a hostile or corrupted log entry is rejected with a reason
instead of reaching a URL.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from shared.core.errors import InvalidInputError, Skip

AUDIT_LOG_TYPE = "type.googleapis.com/google.cloud.audit.AuditLog"
EVENTS_LOG_SUFFIX = "/logs/events"
# LogEntry JSON carries the log id URL-encoded; accept the decoded spelling too.
ACTIVITY_LOG_SUFFIXES = (
    "/logs/cloudaudit.googleapis.com%2factivity",
    "/logs/cloudaudit.googleapis.com/activity",
)
CONTROLLER_TYPE_LABEL = "logging.gke.io/top_level_controller_type"
CONTROLLER_NAME_LABEL = "logging.gke.io/top_level_controller_name"

OUTCOME_COMPLETED = "Completed"
OUTCOME_FAILED = "Failed"
SCHEDULING_FAILURE_REASONS = frozenset({"FailedScheduling", "NotTriggerScaleUp"})
# Reasons the JobSet controller records when it sets the terminal Completed/Failed condition.
JOBSET_TERMINAL_REASONS: Mapping[str, str] = {
    "AllJobsCompleted": OUTCOME_COMPLETED,
    "FailedJobs": OUTCOME_FAILED,
    "ReachedMaxRestarts": OUTCOME_FAILED,
    "FailJobSetFailurePolicyAction": OUTCOME_FAILED,
    "DeadlineExceeded": OUTCOME_FAILED,  # spec.activeDeadlineSeconds, newer JobSet releases
}
JOBSET_RESOURCE_NAME = re.compile(
    r"jobset\.x-k8s\.io/v[0-9]+(?:(?:alpha|beta)[0-9]+)?/namespaces/(?P<namespace>[^/]*)"
    r"/jobsets(?:/(?P<name>[^/]*))?\Z"
)

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*\Z")
_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
# Project ids may be domain-scoped ("example.com:proj"); locations and cluster names are labels.
_PROJECT = re.compile(r"(?:[a-z0-9][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_GCP_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))\Z"
)


def clip(value: Any, limit: int = 100) -> str:
    """A short printable rendering of an untrusted value for a reason string."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class ClusterId:
    """A GKE cluster: its project, location (region or zone) and name."""

    project: str
    location: str
    name: str

    @property
    def path(self) -> str:
        """The resource path ``projects/P/locations/L/clusters/C``."""
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"

    @classmethod
    def from_path(cls, path: str) -> ClusterId:
        """Parse ``projects/P/locations/L/clusters/C``; raise InvalidInputError if it is not one."""
        parts = path.strip().split("/")
        if len(parts) != 6 or parts[0::2] != ["projects", "locations", "clusters"]:
            raise InvalidInputError(f"{path!r} is not projects/P/locations/L/clusters/C")
        try:
            return cluster_from_labels(
                {"project_id": parts[1], "location": parts[3], "cluster_name": parts[5]}
            )
        except Skip as skip:
            raise InvalidInputError(skip.reason) from None


def cluster_from_labels(labels: Mapping[str, Any]) -> ClusterId:
    """The cluster named by ``k8s_*`` monitored-resource labels; Skip if any is missing or invalid."""
    values = []
    for key, pattern in (("project_id", _PROJECT), ("location", _GCP_NAME), ("cluster_name", _GCP_NAME)):
        value = labels.get(key)
        if not isinstance(value, str) or not value:
            raise Skip(f"resource label {key} is missing")
        if len(value) > 128 or not pattern.match(value):
            raise Skip(f"resource label {key}={clip(value)} is not a valid GCP name")
        values.append(value)
    return ClusterId(*values)


def validate_name(value: Any, what: str) -> str:
    """A Kubernetes object name (DNS-1123 subdomain, <= 253 chars) or Skip."""
    if not isinstance(value, str) or not value:
        raise Skip(f"{what} is missing")
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise Skip(f"{what} {clip(value)} is not a valid Kubernetes name (DNS-1123 subdomain)")
    return value


def validate_namespace(value: Any) -> str:
    """A Kubernetes namespace (DNS-1123 label, <= 63 chars) or Skip."""
    if not isinstance(value, str) or not value:
        raise Skip("namespace is missing")
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise Skip(f"namespace {clip(value)} is not a valid DNS-1123 label")
    return value


def validate_uid(value: Any) -> str:
    """A Kubernetes UID (UUID text) or "" when absent; Skip when present but malformed."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _UID.match(value):
        raise Skip(f"uid {clip(value)} is not a UUID")
    return value


def first_str(source: Mapping[str, Any], *keys: str) -> str:
    """The first of ``keys`` holding a non-empty string, else ""."""
    for key in keys:
        value = source.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def first_dict(source: Mapping[str, Any], *keys: str) -> Mapping[str, Any] | None:
    """The first of ``keys`` holding an object, else None."""
    for key in keys:
        value = source.get(key)
        if isinstance(value, Mapping):
            return value
    return None


def log_name_matches(value: Any, suffixes: tuple[str, ...]) -> bool:
    """Whether ``value`` is a ``projects/P/logs/ID`` log name whose id is one of ``suffixes``."""
    if not isinstance(value, str) or not value.startswith("projects/"):
        return False
    lowered = value.lower()
    return any(lowered.endswith(suffix) for suffix in suffixes)


def parse_timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (nanoseconds allowed) as an aware UTC datetime, or None.

    Go's zero time ("0001-01-01T00:00:00Z", what an unset metav1.Time can print as) counts as unset.
    """
    if not isinstance(value, str):
        return None
    match = _RFC3339.match(value)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    if int(year) <= 1:
        return None
    try:
        offset = timedelta(0) if zulu else timedelta(hours=int(off_h), minutes=int(off_m))
        zone = timezone(-offset if sign == "-" else offset)
        micros = int((fraction or "0").ljust(6, "0")[:6])
        when = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micros, zone)
        return when.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def format_timestamp(when: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` suffix, as Cloud Logging and Kubernetes print it."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    text = when.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")
