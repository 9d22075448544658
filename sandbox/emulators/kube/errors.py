"""Kubernetes-style API errors for the sandbox API server, rendered as ``v1/Status`` bodies."""

from __future__ import annotations

from typing import Any

# The reason strings the real API server uses for each HTTP code; clients switch on them.
_REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def reason_for(code: int) -> str:
    """Return the Kubernetes ``Status.reason`` conventionally paired with an HTTP status code."""
    return _REASONS.get(code, "InternalError" if code >= 500 else "BadRequest")


class KubeApiError(Exception):
    """An API failure with the HTTP code, reason, message and details of a Kubernetes ``Status``."""

    def __init__(self, code: int, message: str, reason: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or reason_for(code)
        self.details = {key: value for key, value in details.items() if value is not None}

    def status(self) -> dict[str, Any]:
        """Render the error as the JSON body of a failed request."""
        return status_body(self.code, self.message, self.reason, self.details)


def status_body(
    code: int, message: str, reason: str | None = None, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Build a ``v1/Status`` failure object as the real API server returns it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or reason_for(code),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def not_found(plural: str, name: str, group: str = "") -> KubeApiError:
    """The named object does not exist."""
    resource = f"{plural}.{group}" if group else plural
    return KubeApiError(
        404, f'{resource} "{name}" not found', "NotFound", name=name, group=group or None, kind=plural
    )


def already_exists(plural: str, name: str, group: str = "") -> KubeApiError:
    """An object with this name already exists."""
    resource = f"{plural}.{group}" if group else plural
    return KubeApiError(
        409,
        f'{resource} "{name}" already exists',
        "AlreadyExists",
        name=name,
        group=group or None,
        kind=plural,
    )


def conflict(plural: str, name: str, group: str = "", why: str = "") -> KubeApiError:
    """An optimistic-concurrency precondition (resourceVersion or uid) failed."""
    resource = f"{plural}.{group}" if group else plural
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return KubeApiError(
        409,
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        "Conflict",
        name=name,
        group=group or None,
        kind=plural,
    )


def invalid(kind: str, name: str, field: str, why: str, group: str = "") -> KubeApiError:
    """The object fails validation (HTTP 422), naming the offending field."""
    return KubeApiError(
        422,
        f'{kind} "{name}" is invalid: {field}: {why}',
        "Invalid",
        name=name or None,
        group=group or None,
        kind=kind,
        causes=[{"reason": "FieldValueInvalid", "message": why, "field": field}],
    )


def bad_request(message: str) -> KubeApiError:
    """The request itself is malformed (HTTP 400)."""
    return KubeApiError(400, message, "BadRequest")


def resource_not_found(path: str) -> KubeApiError:
    """No resource is served at this URL (unknown group, version or plural)."""
    return KubeApiError(404, f"the server could not find the requested resource ({path})", "NotFound")


def method_not_allowed(verb: str, resource: str) -> KubeApiError:
    """The resource exists but does not support this verb."""
    return KubeApiError(405, f"{verb} is not supported on resources of kind {resource!r}", "MethodNotAllowed")
