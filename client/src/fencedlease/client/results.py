"""Explicit results of a fenced write (the article's ``applied | duplicate | stale_fence |
transient error``; docs/fenced-publish.md).

``Applied`` and ``Duplicate`` mean the resource shows this write; ``StaleFence`` is definitive
(stop, never retry under this grant); ``Rejected`` carries the refusal code
(``unknown_token``, ``lease_mismatch``, ``holder_mismatch``, ``invalid``, ``conflict``,
``forbidden``, ...); ``Unavailable`` means the fence could not be checked after bounded retries.
Match on them::

    match publisher.publish(...):
        case Applied() | Duplicate():
            ...
        case StaleFence():
            stop()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

from fencedlease.client.errors import (
    PublishError,
    RejectedError,
    StaleFenceError,
    UnavailableError,
)


@dataclass(frozen=True)
class Applied:
    """The write was admitted and committed.  ``version`` is the artifact's resourceVersion
    (or the catalog row's version for the SQL fence)."""

    token: int
    object_ref: str | None
    operation_id: str | None
    version: str
    message: str = ""
    obj: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    code: Literal["applied"] = "applied"
    ok: Literal[True] = True

    def raise_for_result(self) -> Applied:
        return self


@dataclass(frozen=True)
class Duplicate:
    """This operation is already what the resource shows (a retry): treat it as success."""

    token: int
    operation_id: str | None
    message: str
    code: Literal["duplicate"] = "duplicate"
    ok: Literal[True] = True

    def raise_for_result(self) -> Duplicate:
        return self


@dataclass(frozen=True)
class StaleFence:
    """A newer generation reached the resource.  Definitive: stop, discard the staged output,
    never retry under this grant."""

    token: int
    message: str
    code: Literal["stale_fence"] = "stale_fence"
    ok: Literal[False] = False

    def raise_for_result(self) -> StaleFence:
        raise StaleFenceError(self.message, result=self)


@dataclass(frozen=True)
class Rejected:
    """Refused for another reason: ``code`` is the webhook's (``unknown_token``,
    ``lease_mismatch``, ``holder_mismatch``, ``invalid``) or the API server's
    (``conflict``, ``forbidden``, ``unauthorized``, ``not_found``, ...).  Not retried."""

    code: str
    message: str
    status_code: int | None = None
    ok: Literal[False] = False

    def raise_for_result(self) -> Rejected:
        raise RejectedError(f"{self.code}: {self.message}", result=self)


@dataclass(frozen=True)
class Unavailable:
    """The fence could not be checked (webhook or store down, API unreachable) after
    ``attempts`` tries with backoff.  Nothing was written by this call, unless a retry reports
    ``Duplicate``; retry later with the same token."""

    message: str
    attempts: int
    status_code: int | None = None
    code: Literal["unavailable"] = "unavailable"
    ok: Literal[False] = False

    def raise_for_result(self) -> Unavailable:
        raise UnavailableError(self.message, result=self)


PublishResult = Union[Applied, Duplicate, StaleFence, Rejected, Unavailable]
"""What :meth:`Publisher.publish` and :meth:`SqlFence.publish` return."""

__all__ = [
    "Applied",
    "Duplicate",
    "PublishError",
    "PublishResult",
    "Rejected",
    "StaleFence",
    "Unavailable",
]
