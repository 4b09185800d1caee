"""Exceptions of :mod:`fencedlease.client`, each carrying the context it happened in.

Like httpx: a transport failure keeps the :class:`RequestInfo` it was sending, an API error
also keeps the :class:`ResponseInfo` it got; grant errors keep the grant (or the place it was
read from).  Explicit publish *results* are values (:mod:`fencedlease.client.results`); these
exceptions are for the cases a caller did not ask to handle as values
(:meth:`~fencedlease.client.results.PublishResult.raise_for_result` turns a result into one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fencedlease.client.grant import Grant
    from fencedlease.client.results import PublishResult


@dataclass(frozen=True)
class RequestInfo:
    """What was sent: method and URL (never the credentials)."""

    method: str
    url: str

    def __str__(self) -> str:
        return f"{self.method} {self.url}"


@dataclass(frozen=True)
class ResponseInfo:
    """What came back: HTTP status, the Kubernetes ``Status`` reason and message, the body."""

    status_code: int
    reason: str
    message: str
    body: Any = None


class FencedLeaseError(Exception):
    """Base class of every error raised by :mod:`fencedlease.client`."""


class ConfigError(FencedLeaseError):
    """No usable API configuration (kubeconfig, in-cluster service account)."""


class GrantError(FencedLeaseError):
    """No usable grant; ``source`` says where it was read from (a directory, a Pod, a lease)."""

    def __init__(self, message: str, *, source: str, grant: Grant | None = None) -> None:
        super().__init__(message)
        self.source = source
        self.grant = grant


class GrantAbsent(GrantError):
    """Nothing granted (yet): the files are missing or empty, or the annotations absent."""


class GrantLost(GrantError):
    """The grant was lost (``state: lost``, a new token, or the lease held by another Pod)."""


class GrantExpired(GrantError):
    """The grant's conservative deadline (``valid-until``) has passed."""


class UnfencedRequest(FencedLeaseError):
    """A fenced client refused to send a request that cannot be fenced: a collection delete
    (``DELETE .../configmaps?labelSelector=...``), whose items the fence decides one by one
    on tokens other writers may have stamped. Delete each object instead (each is a fenced
    delete: the token written, then the DELETE with that version as precondition), or send
    an unfenced collection delete with a client that stamps nothing."""

    def __init__(self, message: str, *, request: RequestInfo) -> None:
        super().__init__(message)
        self.request = request


class TransportError(FencedLeaseError):
    """The request did not get an HTTP response (connection refused, timeout, TLS)."""

    def __init__(self, message: str, *, request: RequestInfo) -> None:
        super().__init__(message)
        self.request = request


class ApiError(FencedLeaseError):
    """The API server answered with an error status."""

    def __init__(
        self,
        message: str,
        *,
        request: RequestInfo,
        response: ResponseInfo,
        not_installed: bool = False,
    ) -> None:
        super().__init__(message)
        self.request = request
        self.response = response
        self.not_installed = not_installed
        """The API server does not serve the resource type: its CRD is not installed."""

    @property
    def status_code(self) -> int:
        return self.response.status_code


class PublishError(FencedLeaseError):
    """A publish did not apply; ``result`` is the explicit result it ended with."""

    def __init__(self, message: str, *, result: PublishResult) -> None:
        super().__init__(message)
        self.result = result


class StaleFenceError(PublishError):
    """``stale_fence``: a newer generation reached the resource. Never retry under this grant."""


class RejectedError(PublishError):
    """The write was refused for another reason (``result.code`` says which)."""


class UnavailableError(PublishError):
    """The fence could not be checked in time (transient); nothing was written."""
