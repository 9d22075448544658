"""The one mapping of Google's and Kubernetes' answers onto the product's errors.

GKE, Compute Engine and the Kubernetes API answer over HTTP (or gRPC with the same codes), and the
same status means the same thing to the product whichever of them sent it. Each adapter hands its
failure here once (``from_status`` for a status and message, ``from_google`` for a Google client
library's exception); nothing above the adapters classifies an answer again:

* 404 -> ``NotFoundError`` and 409 -> ``AlreadyExistsError``: the idempotency signals (a Kubernetes
  update's 409 is a conflict, which its adapter raises as ``ConflictError`` itself);
* a 403 naming an IAM permission (GKE: ``Required "container.clusters.update" permission(s)``;
  Kubernetes through GKE's IAM authorizer: ``requires one of ["container.nodes.update"]``) ->
  ``PermissionDeniedError``; any other 401/403 (credentials, RBAC, an API not enabled) ->
  ``TransientError``: an operator fixes it, and nothing is lost meanwhile;
* a create refused because this attempt's capacity is not to be had -> ``CapacityUnavailableError``:
  GKE's 403 "Insufficient regional quota to satisfy request" and Compute's QUOTA_EXCEEDED, and
  Compute's answers about a specific reservation that GKE passes on (404 'reservation "R" not found
  for node pool "P" at zone "Z"', 429 "Reservation does not have enough resources for the request");
* GKE's 429 "Too many operations ... hits the concurrent operations quota N" and 400 "Cluster is
  running incompatible operation" / "Operation X is currently ..." (GKE "Troubleshoot concurrent
  operations") -> ``OperationLimitError`` (with GKE's N when it names one);
* a 429 "Quota exceeded for quota metric ..." (the project's request quota of any Google API) ->
  ``RequestQuotaError``; any other 429, 408, 410 (an expired list token), 5xx, a cancelled call or a
  broken connection -> ``TransientError``;
* any other 4xx -> ``RejectedError``.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from shared.cloud.permissions import denied_permission
from shared.core.errors import (
    AlreadyExistsError,
    CapacityUnavailableError,
    NotFoundError,
    OperationLimitError,
    PermissionDeniedError,
    RejectedError,
    RequestQuotaError,
    TpuProvError,
    TransientError,
)

# GKE's refusals to start an operation because others run (GKE's "Troubleshoot concurrent operations"):
# "Cluster is running incompatible operation X", "Operation X is currently <verb>ing cluster C. Please
# wait and try again once it is done."
_OPERATION_CONFLICT = re.compile(r"incompatible operation|operation \S+ is currently \w+", re.IGNORECASE)
_BUSY = re.compile(r"incompatible operation|please wait and try again", re.IGNORECASE)
_TOO_MANY_OPERATIONS = re.compile(r"too many operations", re.IGNORECASE)
_OPERATION_QUOTA = re.compile(r"concurrent operations quota (\d+)")
# Every Google API's answer when the project's per-minute request quota is spent.
_REQUEST_QUOTA = re.compile(r"quota exceeded for quota metric", re.IGNORECASE)
# A resource quota (not an API rate limit): GKE's 403 "Insufficient regional quota to satisfy request:
# resource ...", a pool's VMs' "Insufficient quota to satisfy the request", Compute's QUOTA_EXCEEDED.
_RESOURCE_QUOTA = re.compile(r"insufficient (\w+ )?quota|QUOTA_EXCEEDED", re.IGNORECASE)
# Compute Engine's answers about a SPECIFIC reservation, as GKE passes them on at create time.
_RESERVATION = re.compile(
    r"reservation does not have enough resources|reservation \S+ not found for node pool", re.IGNORECASE
)


def is_resource_quota(message: str) -> bool:
    """Whether a message says a resource quota (not an API rate limit) is used up."""
    return bool(_RESOURCE_QUOTA.search(message))


def stated_operation_limit(message: str) -> int | None:
    """The concurrent-operations quota GKE's 429 names, or None."""
    match = _OPERATION_QUOTA.search(message)
    return int(match.group(1)) if match else None


def from_status(status: int, why: str, message: str = "") -> TpuProvError:
    """The product's error for an HTTP ``status``; ``why`` is the sentence logged (it names the API
    and the call), ``message`` the API's own text (what is matched; ``why`` when empty)."""
    text = message or why
    if _RESERVATION.search(text) and status in (404, 429, 400, 403):
        return CapacityUnavailableError(why)
    if status == 404:
        return NotFoundError(why)
    if status == 409:
        return AlreadyExistsError(why)
    if status == 403 and is_resource_quota(text):
        return CapacityUnavailableError(why)
    permission = denied_permission(text) if status == 403 else ""
    if permission:
        return PermissionDeniedError(why, permission)
    if status in (401, 403):
        return TransientError(why)
    if status == 429 and _TOO_MANY_OPERATIONS.search(text):
        return OperationLimitError(why, stated_operation_limit(text))
    if status == 400 and _OPERATION_CONFLICT.search(text):
        return OperationLimitError(why)
    if status == 400 and _BUSY.search(text):
        return TransientError(why)
    if status == 429 and _REQUEST_QUOTA.search(text):
        return RequestQuotaError(why)
    if status in (0, 408, 410, 429) or status >= 500:
        return TransientError(why)
    return RejectedError(why, status or 400)


def is_transport_failure(exc: BaseException) -> bool:
    """True for failures of the connection or the token refresh (retryable; nothing was refused)."""
    from google.auth import exceptions as auth_errors

    # A failed token refresh is usually the metadata server or STS being briefly unreachable.
    if isinstance(
        exc, auth_errors.TransportError | auth_errors.RefreshError | ConnectionError | TimeoutError
    ):
        return True
    requests = sys.modules.get("requests")
    if requests is not None and isinstance(exc, requests.exceptions.RequestException):
        return True
    grpc = sys.modules.get("grpc")  # only loaded when the gRPC transport is in use
    return grpc is not None and isinstance(exc, grpc.RpcError)


def from_google(exc: BaseException, api: str, what: str) -> BaseException:
    """The product's error for a Google client library's exception (``api``: "GKE", "Compute
    Engine"), or ``exc`` itself when it is none of theirs (a bug: it propagates as is)."""
    from google.api_core import exceptions as core
    from google.auth import exceptions as auth_errors

    if isinstance(exc, core.GoogleAPICallError):
        why = f"{api} {what}: {exc.message}"
        if isinstance(exc, core.Aborted):  # 409 in api_core, but a concurrency abort is retryable
            return TransientError(why)
        if isinstance(exc, core.Cancelled):
            return TransientError(why)
        return from_status(int(exc.code or 0), why, str(exc.message))
    if isinstance(exc, core.GoogleAPIError):  # RetryError and friends: nothing was refused
        return TransientError(f"{api} {what}: {exc}")
    if isinstance(exc, auth_errors.DefaultCredentialsError):  # a deployment without credentials
        return RejectedError(f"{api} {what}: no usable credentials: {exc}", 401)
    if is_transport_failure(exc):
        return TransientError(f"{api} {what}: {type(exc).__name__}: {exc}")
    return exc


def raise_from_google(exc: BaseException, api: str, what: str) -> Any:
    """Raise ``from_google``'s answer (chained to ``exc``)."""
    raise from_google(exc, api, what) from exc


__all__ = [
    "from_google",
    "from_status",
    "is_resource_quota",
    "is_transport_failure",
    "raise_from_google",
    "stated_operation_limit",
]
