"""The grant a holder Pod was given, as values: what it says and what it means now.

The operator writes four annotations on the holder Pod (docs/downward-api.md); a downward-API
volume projects them as files ``token``, ``lease-id``, ``valid-until`` and ``state`` in one
directory (default ``/etc/fencedlease``).  This module parses them (:func:`parse_grant`,
:func:`grant_from_annotations`) into a :class:`Grant` and decides what it means at a given time
(:class:`GrantState`): no I/O.  Where a grant is read from is a :class:`GrantSource`; the
sources (the directory, the Pod's annotations, the FencedLease status) are
:mod:`fencedlease.client.sources`.

The files can lag and a paused process reads nothing: a grant is *evidence*, not permission.
Use it to avoid wasted work (:meth:`Grant.remaining`); safety comes from the fence at the
resource (:mod:`fencedlease.client.publish`, :mod:`fencedlease.client.sql`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fencedlease.client._compat import StrEnum
from fencedlease.client.contract import annotation_keys
from fencedlease.client.errors import GrantAbsent, GrantError, GrantExpired, GrantLost
from fencedlease.client.validation import lease_id as check_lease_id
from fencedlease.client.validation import parse_token

Clock = Callable[[], dt.datetime]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class GrantState(StrEnum):
    """What a grant means now (the CLI's exit code says the same)."""

    HELD = "held"
    """``state: held`` and the deadline has not passed."""
    LOST = "lost"
    """``state: lost``: expired, force-released or handed over (the operator said so)."""
    EXPIRED = "expired"
    """``state: held`` but ``valid-until`` has passed (the operator may not have said so yet)."""
    ABSENT = "absent"
    """Nothing granted: no files (or empty ones), no annotations."""


@dataclass(frozen=True)
class Grant:
    """One generation of a lease as given to this holder: the article's capability (scope,
    lease id, fencing token, conservative deadline).

    ``valid_until`` is the operator's conservative deadline (round trip and a clock-skew bound
    already subtracted; docs/tokens.md).  ``state`` is what the operator wrote (``held`` or
    ``lost``).  ``lease`` is the FencedLease name when known (the files do not carry it).
    """

    token: int
    lease_id: str
    valid_until: dt.datetime
    state: str
    lease: str | None = None
    source: str = ""

    def status(self, now: dt.datetime | None = None) -> GrantState:
        if self.state != "held":
            return GrantState.LOST
        if (now or utcnow()) >= self.valid_until:
            return GrantState.EXPIRED
        return GrantState.HELD

    @property
    def held(self) -> bool:
        """Held and before its deadline (evaluated now)."""
        return self.status() is GrantState.HELD

    def remaining(self, now: dt.datetime | None = None) -> float:
        """Seconds until ``valid_until`` (0 when lost or past): the article's efficiency check
        before expensive work.  Not a safety check: the fence is."""
        if self.state != "held":
            return 0.0
        return max(0.0, (self.valid_until - (now or utcnow())).total_seconds())

    def check(self, min_remaining: float = 0.0, now: dt.datetime | None = None) -> Grant:
        """Return ``self`` if held with at least ``min_remaining`` seconds left, else raise
        :class:`GrantLost` / :class:`GrantExpired`."""
        status = self.status(now)
        if status is GrantState.LOST:
            raise GrantLost(
                f"lease {self.lease or '?'}: grant {self.lease_id} (token {self.token}) is lost",
                source=self.source,
                grant=self,
            )
        if status is GrantState.EXPIRED or self.remaining(now) < min_remaining:
            raise GrantExpired(
                f"lease {self.lease or '?'}: grant {self.lease_id} (token {self.token}) "
                f"has {self.remaining(now):.1f}s left (valid until {rfc3339(self.valid_until)}"
                f", need {min_remaining:.1f}s)",
                source=self.source,
                grant=self,
            )
        return self

    def same_generation(self, other: Grant | None) -> bool:
        return other is not None and (other.token, other.lease_id) == (self.token, self.lease_id)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lease": self.lease,
            "token": self.token,
            "leaseId": self.lease_id,
            "validUntil": rfc3339(self.valid_until),
            "state": self.state,
            "status": self.status().value,
            "remainingSeconds": round(self.remaining(), 3),
            "source": self.source,
        }


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed


def parse_grant(values: Mapping[str, str], *, lease: str | None, source: str) -> Grant | None:
    """A grant from the four values (keys ``token``, ``lease_id``, ``valid_until``, ``state``);
    ``None`` if there is no token (not granted yet).  Raises :class:`GrantError` if malformed."""
    token_text = (values.get("token") or "").strip(" \t\r\n")
    if not token_text:
        return None
    try:
        token = parse_token(token_text)
        lease_id = check_lease_id((values.get("lease_id") or "").strip(" \t\r\n"))
        valid_until = parse_time(values.get("valid_until") or "")
    except ValueError as exc:
        raise GrantError(f"{source}: malformed grant: {exc}", source=source) from exc
    return Grant(
        token=token,
        lease_id=lease_id,
        valid_until=valid_until,
        state=(values.get("state") or "").strip() or "held",
        lease=lease,
        source=source,
    )


def grant_from_annotations(
    annotations: Mapping[str, str], lease: str, *, source: str
) -> Grant | None:
    keys = annotation_keys(lease)
    return parse_grant(
        {field: annotations.get(key, "") for field, key in keys.items()}, lease=lease, source=source
    )


def require(grant: Grant | None, source: str, min_remaining: float = 0.0) -> Grant:
    """``grant`` if held (with ``min_remaining`` seconds left), else raise a :class:`GrantError`."""
    if grant is None:
        raise GrantAbsent(f"{source}: nothing granted", source=source)
    return grant.check(min_remaining)


# ----------------------------------------------------------------------------- a source


class GrantSource(Protocol):
    """Where a grant is read from; :class:`~fencedlease.client.scope.GrantScope` watches one."""

    @property
    def lease(self) -> str | None:
        """The lease's name, when the source knows it (read-only here, so a source whose
        ``lease`` is a plain ``str`` attribute satisfies the protocol)."""
        ...

    def describe(self) -> str: ...

    def read(self) -> Grant | None: ...

    async def aread(self) -> Grant | None: ...

    def watch(self, stop: threading.Event | None = None) -> Iterator[Grant | None]: ...

    def awatch(self, stop: asyncio.Event | None = None) -> AsyncIterator[Grant | None]: ...
