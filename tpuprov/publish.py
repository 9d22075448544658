"""Manual test publishes: build the message a log sink (or an operator) would send, then publish it.

``tpuprov publish`` uses this to exercise a deployment -- or the local sandbox, through
``PUBSUB_EMULATOR_HOST`` -- without waiting for GKE to produce the event. Each builder returns a
:class:`Prepared` message that is exactly what production would deliver: the log-based kinds
carry the LogEntry JSON of ``shared.events.entries`` (checked by decoding it back with
``shared.events.envelope``), ``setup`` the ``{"cluster": ...}`` document the setup function accepts and
``kueue`` a queue configuration validated with ``shared.kueue.config``. Every check runs before anything
is published, so a rejected input publishes nothing.

``google-cloud-pubsub`` is imported only when a message is really published.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any, Protocol

from shared.core import names
from shared.core.errors import InvalidInputError, PermanentError, Skip, TransientError
from shared.events import entries as logentries
from shared.events.envelope import JobSetDeleted, JobSetFinished, PodUnschedulable, decode_log_entry
from shared.events.fields import ClusterId, cluster_from_labels, validate_uid
from shared.events.trigger import KUEUE_CLUSTER_ATTRIBUTE
from tpuprov.cluster import require_cluster

DEFAULT_TOPIC_PREFIX = "tpuprov"
# Topic suffix per message kind; infra/main.tf names the topics "<prefix>-<suffix>".
TOPIC_SUFFIXES = {
    "pending-pod": "pending-pods",
    "jobset-finished": "jobset-lifecycle",
    "jobset-deleted": "jobset-lifecycle",
    "setup": "setup",
    "kueue": "kueue",
}
SOURCE_ATTRIBUTE = "tpuprov.dev/source"
SOURCE_VALUE = "tpuprov-publish"
_PUBLISH_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A message ready to publish: its kind, payload bytes and attributes."""

    kind: str
    data: bytes
    attributes: Mapping[str, str]

    @property
    def topic_suffix(self) -> str:
        """The topic (without the prefix) this kind of message goes to."""
        return TOPIC_SUFFIXES[self.kind]


@dataclasses.dataclass(frozen=True)
class Published:
    """Where a message went and the id Pub/Sub gave it."""

    kind: str
    topic_path: str
    message_id: str


class Publisher(Protocol):
    """The one call this module needs from a Pub/Sub client."""

    def publish(self, topic_path: str, data: bytes, attributes: Mapping[str, str]) -> str:
        """Publish and return the message id; raise PermanentError/TransientError on failure."""
        ...


# --- validation -------------------------------------------------------------------------------


def cluster_id(cluster: str, project: str = "", location: str = "") -> ClusterId:
    """A cluster from ``projects/P/locations/L/clusters/C`` or from a name plus project and location."""
    if "/" in cluster:
        return ClusterId.from_path(cluster)
    require_cluster(project, location, cluster)
    values = {"project_id": project, "location": location, "cluster_name": cluster}
    try:
        return cluster_from_labels(values)
    except Skip as skip:
        why = skip.reason
        for label, flag in (
            ("project_id", "--project"),
            ("location", "--location"),
            ("cluster_name", "--cluster"),
        ):
            why = why.replace(f"resource label {label}", flag)
        raise InvalidInputError(f"cluster: {why}") from None


def _namespace(value: str) -> str:
    if not names.is_dns1123_label(value):
        raise InvalidInputError(
            f"namespace {value!r} is not a valid Kubernetes namespace "
            "(lower-case letters, digits and '-', at most 63 characters)"
        )
    return value


def _object_name(value: str, what: str) -> str:
    if not names.is_dns1123_subdomain(value):
        raise InvalidInputError(
            f"{what} name {value!r} is not a valid Kubernetes name "
            "(lower-case letters, digits, '-' and '.', at most 253 characters)"
        )
    return value


def _uid(value: str) -> str:
    try:
        return validate_uid(value)
    except Skip:
        raise InvalidInputError(f"uid {value!r} is not a Kubernetes UID (a UUID)") from None


def _from_entry(kind: str, entry: Mapping[str, Any], expected: type) -> Prepared:
    """Wrap a LogEntry as a sink would, after checking the functions would decode it as intended."""
    event = decode_log_entry(entry)
    if not isinstance(event, expected):
        raise InvalidInputError(f"the {kind} message would be ignored: {getattr(event, 'reason', event)}")
    message = logentries.pubsub_message(entry)
    attributes = {**message["attributes"], SOURCE_ATTRIBUTE: SOURCE_VALUE}
    return Prepared(kind, base64.b64decode(message["data"]), attributes)


# --- builders ---------------------------------------------------------------------------------


def pending_pod(
    cluster: ClusterId,
    namespace: str,
    pod: str,
    uid: str = "",
    reason: str = "FailedScheduling",
    jobset: str = "",
) -> Prepared:
    """The scheduler's FailedScheduling (or the autoscaler's NotTriggerScaleUp) for a pending pod.

    ``jobset`` adds the top-level-controller labels GKE puts on JobSet pods' events.
    """
    if reason not in ("FailedScheduling", "NotTriggerScaleUp"):
        raise InvalidInputError(f"reason {reason!r} is not FailedScheduling or NotTriggerScaleUp")
    controller = ("JobSet", _object_name(jobset, "JobSet")) if jobset else None
    entry = logentries.pod_event_entry(
        cluster,
        _namespace(namespace),
        _object_name(pod, "pod"),
        _uid(uid),
        reason=reason,
        controller=controller,
    )
    return _from_entry("pending-pod", entry, PodUnschedulable)


def jobset_finished(
    cluster: ClusterId, namespace: str, name: str, uid: str = "", failed: bool = False
) -> Prepared:
    """The JobSet controller's terminal Event: AllJobsCompleted, or FailedJobs with ``failed``."""
    reason = "FailedJobs" if failed else "AllJobsCompleted"
    entry = logentries.jobset_event_entry(
        cluster, _namespace(namespace), _object_name(name, "JobSet"), _uid(uid), reason=reason
    )
    return _from_entry("jobset-finished", entry, JobSetFinished)


def jobset_deleted(cluster: ClusterId, namespace: str, name: str, principal: str = "") -> Prepared:
    """The Admin Activity audit entry of a JobSet delete."""
    entry = logentries.jobset_delete_audit_entry(
        cluster,
        _namespace(namespace),
        _object_name(name, "JobSet"),
        principal=principal or "tpuprov-publish@example.com",
    )
    return _from_entry("jobset-deleted", entry, JobSetDeleted)


def setup(cluster: ClusterId) -> Prepared:
    """The manual setup request ``{"cluster": "projects/P/locations/L/clusters/C"}``."""
    data = json.dumps({"cluster": cluster.path}, separators=(",", ":")).encode()
    return Prepared("setup", data, {SOURCE_ATTRIBUTE: SOURCE_VALUE})


def kueue(
    config_text: str, allowed_accelerators: tuple[str, ...] = (), cluster: ClusterId | None = None
) -> Prepared:
    """A Kueue queue configuration (YAML or JSON), validated exactly as the function will; for
    ``cluster`` (a fleet cluster) when given, else for the deployment's managed cluster."""
    from shared.kueue.config import parse_config  # the catalog and renderer are not needed elsewhere

    if not config_text.strip():
        raise InvalidInputError("the Kueue configuration is empty")
    parse_config(config_text, allowed_accelerators)
    attributes = {SOURCE_ATTRIBUTE: SOURCE_VALUE}
    if cluster is not None:
        attributes[KUEUE_CLUSTER_ATTRIBUTE] = cluster.path
    return Prepared("kueue", config_text.encode("utf-8"), attributes)


# --- publishing -------------------------------------------------------------------------------


def topic_path(project: str, topic_prefix: str, prepared: Prepared) -> str:
    """``projects/P/topics/<prefix>-<suffix>`` for ``prepared``."""
    if not names.is_rfc1035(topic_prefix, max_len=200):
        raise InvalidInputError(f"topic prefix {topic_prefix!r} is not a valid name prefix")
    return f"projects/{project}/topics/{topic_prefix}-{prepared.topic_suffix}"


def gcloud_command(prepared: Prepared, topic_path: str) -> str:
    """The same publish as a ``gcloud pubsub topics publish`` command line (for ``--dry-run``)."""
    parts = ["gcloud", "pubsub", "topics", "publish", topic_path, f"--message={prepared.data.decode()}"]
    if prepared.attributes:
        pairs = [f"{k}={v}" for k, v in sorted(prepared.attributes.items())]
        # gcloud splits a list flag at commas unless the value starts with ^<delimiter>^.
        delimiter = next(d for d in (",", ";", "|", "#") if not any(d in pair for pair in pairs))
        prefix = "" if delimiter == "," else f"^{delimiter}^"
        parts.append(f"--attribute={prefix}{delimiter.join(pairs)}")
    return " ".join(shlex.quote(part) for part in parts)


def publish(prepared: Prepared, project: str, topic_prefix: str, publisher: Publisher) -> Published:
    """Publish ``prepared`` to its topic in ``project``; returns where it went and its message id."""
    path = topic_path(project, topic_prefix, prepared)
    message_id = publisher.publish(path, prepared.data, prepared.attributes)
    return Published(prepared.kind, path, message_id)


class PubsubPublisher:
    """:class:`Publisher` over ``google.cloud.pubsub_v1.PublisherClient``.

    The client honours ``PUBSUB_EMULATOR_HOST`` (no credentials needed then); otherwise it uses
    Application Default Credentials. Library errors are translated into shared.core.errors.
    """

    def __init__(self, timeout: float = _PUBLISH_TIMEOUT_SECONDS) -> None:
        self.timeout = timeout
        self._client: Any = None

    def _publisher(self) -> Any:
        if self._client is None:
            import google.auth.exceptions
            from google.cloud.pubsub_v1 import PublisherClient

            try:
                self._client = PublisherClient()
            except google.auth.exceptions.DefaultCredentialsError as exc:
                raise PermanentError(
                    f"no Google credentials ({exc}); run `gcloud auth application-default login` "
                    "or set PUBSUB_EMULATOR_HOST for a local emulator"
                ) from None
        return self._client

    def publish(self, topic_path: str, data: bytes, attributes: Mapping[str, str]) -> str:
        """Publish one message and wait for its id."""
        import google.auth.exceptions
        from google.api_core import exceptions as api

        client = self._publisher()
        try:
            future = client.publish(topic_path, data, **dict(attributes))
            return str(future.result(timeout=self.timeout))
        except api.NotFound:
            raise PermanentError(
                f"topic {topic_path} does not exist (is the infrastructure deployed? --topic-prefix?)"
            ) from None
        except (api.PermissionDenied, api.Unauthenticated) as exc:
            raise PermanentError(f"not allowed to publish to {topic_path}: {exc.message}") from None
        except google.auth.exceptions.GoogleAuthError as exc:
            # Credentials are sometimes resolved only when the first request is sent.
            raise PermanentError(f"no usable Google credentials: {exc}") from None
        except (api.GoogleAPICallError, TimeoutError) as exc:
            raise TransientError(f"publishing to {topic_path} failed: {exc}") from None

    def close(self) -> None:
        """Stop the client's background threads."""
        if self._client is not None:
            self._client.stop()
            self._client = None
