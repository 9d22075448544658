"""The product's one error taxonomy.

Every failure that crosses a module boundary is one of two kinds:

* ``PermanentError`` -- retrying cannot help (bad input, a refusal, GKE rejecting the request).
  Entrypoints log it and acknowledge the message.
* ``TransientError`` -- retrying can help (429, 5xx, "incompatible operation", connection errors).
  Entrypoints raise, the function answers non-2xx and Pub/Sub redelivers with backoff.

Library exceptions (google.api_core, kubernetes.client) are translated into these at the adapter;
nothing above the adapters sees a library exception.
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


class NotFoundError(PermanentError):
    """The addressed object does not exist (HTTP 404)."""


class AlreadyExistsError(PermanentError):
    """The object to create already exists (HTTP 409); creators treat this as success."""


class InvalidInputError(PermanentError):
    """The input (event, configuration, manifest) is malformed or violates a rule."""


class RejectedError(PermanentError):
    """A cloud API refused the request for a reason retries cannot fix (other 4xx)."""

    def __init__(self, why: str, code: int = 400) -> None:
        super().__init__(why)
        self.code = code
