"""The product's one error taxonomy.

Every failure that crosses a module boundary is one of two kinds:

* ``PermanentError`` -- retrying cannot help (bad input, a refusal, GKE rejecting the request).
  Entrypoints log it and acknowledge the message.
* ``TransientError`` -- retrying can help (429, 5xx, "incompatible operation", connection errors).
  Entrypoints raise, the function answers non-2xx and Pub/Sub redelivers with backoff.

Library exceptions (google.api_core, kubernetes.client) are translated into these at the adapter;
nothing above the adapters sees a library exception.

Three decisions are not failures and never reach an entrypoint: ``NotEligible`` (the pod is not
one the product acts on), ``Refused`` (it asks for something the product will not create; the
reason becomes an Event) and ``Skip`` (the decoders ignore this input). They live here too so
there is one place that lists every exception the product raises.
"""

from __future__ import annotations


class TpuProvError(Exception):
    """Base of all product errors; ``why`` is the human-readable reason that gets logged."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class PermanentError(TpuProvError):
    """Retrying will not help: log the reason and acknowledge the message."""


class TransientError(TpuProvError):
    """Retrying may help: raise so that the message is redelivered."""


class OperationLimitError(TransientError):
    """GKE refused to start another operation on the cluster right now.

    Either the cluster's concurrent-operations quota is used up (HTTP 429 "Too many operations") or
    a conflicting operation runs (HTTP 400 FAILED_PRECONDITION "Cluster is running incompatible
    operation"). Sending more mutations in the same delivery only collects more refusals, so callers
    stop fanning out and let redelivery continue once operations have finished. ``limit`` is the
    quota GKE's 429 names ("... hits the concurrent operations quota N"), None when it names none.
    """

    def __init__(self, why: str, limit: int | None = None) -> None:
        super().__init__(why)
        self.limit = limit


class RequestQuotaError(TransientError):
    """A Google API refused the call because the project's per-minute request quota is spent (HTTP 429
    "Quota exceeded for quota metric ..."): other clients share it, so nothing more is sent for a
    while."""


class PermissionDeniedError(TransientError):
    """A cloud API refused the caller for a missing IAM permission (HTTP 403 naming it).

    A deployment error, not weather: the message is kept for redelivery (nothing is lost once the
    role is fixed), and the entrypoint logs ``permission.denied`` naming the permission and the role
    to add it to, which the monitoring alerts on at once.
    """

    def __init__(self, why: str, permission: str) -> None:
        super().__init__(why)
        self.permission = permission


class ConflictError(TransientError):
    """An update carried a resourceVersion the object no longer has (HTTP 409 Conflict): someone
    wrote it since it was read. Read it again and redo the change; escaping, it means redelivery."""


class NotFoundError(PermanentError):
    """The addressed object does not exist (HTTP 404)."""


class AlreadyExistsError(PermanentError):
    """The object to create already exists (HTTP 409); creators treat this as success."""


class CapacityUnavailableError(PermanentError):
    """A create was refused because this attempt's capacity is not to be had: a resource quota used up,
    or the specific reservation it names missing in the zone or full. Retrying the same create cannot
    succeed sooner: the slice's attempt failed, and it falls back to other capacity or backs off."""


class InvalidInputError(PermanentError):
    """The input (event, configuration, manifest) is malformed or violates a rule."""


class RejectedError(PermanentError):
    """A cloud API refused the request for a reason retries cannot fix (other 4xx)."""

    def __init__(self, why: str, code: int = 400) -> None:
        super().__init__(why)
        self.code = code


# -- decisions, not failures: caught by the service that raised them ---------------------------


class NotEligible(Exception):
    """The pod is not one the product acts on; ``why`` says which rule excluded it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Refused(Exception):
    """The pod asks for something the product will not create; ``why`` goes into an Event."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Skip(Exception):
    """Internal control flow: this input is to be ignored for ``reason``. Never escapes the decoders."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
