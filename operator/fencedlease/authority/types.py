"""Result and record types of the grant authority.

Every expected outcome is a value, never an exception or a bare boolean (docs/design.md,
invariant 4): callers ``match`` on the result class.  Results carry decisions only: every store
call that cannot decide (etcd unreachable, the restore guard, contention) raises
:class:`StoreUnavailable` instead, the one convention for "unavailable" at the store boundary,
so a stale result is never confused with a network error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NamedTuple

# One compact, key-sorted encoder for every stored record (``json.dumps`` with these options
# builds a new encoder per call; the output is the same).
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


class FencingPolicy(StrEnum):
    """Ordering rule a fencing domain enforces (``spec.fencingPolicy``)."""

    ALLOW_EQUAL = "AllowEqual"  # t >= hwm: several writes per grant (deduplicated by op id)
    STRICTLY_GREATER = "StrictlyGreater"  # t > hwm: one write per grant


class FenceCode(StrEnum):
    """Outcome of a fence check; denial messages start with the value."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE_FENCE = "stale_fence"
    UNKNOWN_TOKEN = "unknown_token"
    LEASE_MISMATCH = "lease_mismatch"
    HOLDER_MISMATCH = "holder_mismatch"


class LeaseState(StrEnum):
    HELD = "held"
    RELEASED = "released"


class EndedBy(StrEnum):
    """Why a generation ended (kept in the record for status and audit)."""

    RELEASE = "release"
    FORCE_RELEASE = "force_release"
    EXPIRY = "expiry"


class LeaseKey(NamedTuple):
    """A lease and fencing domain: one ``FencedLease`` object."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The value stored at ``<prefix>/leases/<ns>/<name>``.

    ``token`` is ``None`` in the version written by acquire: the token of that generation *is*
    the mod_revision of that version, which is only known once it commits.  Renew and release
    rewrite the record with the explicit token so it survives later modifications.
    """

    lease_id: str
    holder: str
    duration_seconds: float
    token: int | None
    state: LeaseState = LeaseState.HELD
    renewals: int = 0
    ended_by: EndedBy | None = None
    holder_uid: str | None = None
    """The holder Pod's UID: a grant belongs to that Pod, not to whatever Pod later takes
    its name (``None`` only in records written before UIDs were recorded)."""
    retained: tuple[int, ...] = ()
    """Tokens of this lease whose token records are kept, oldest first (the retention rule,
    :mod:`fencedlease.authority.retention`)."""

    def token_at(self, mod_revision: int) -> int:
        """The generation's fencing token given the mod_revision of this stored version."""
        return self.token if self.token is not None else mod_revision

    def to_json(self) -> bytes:
        return _ENCODE(
            {
                "lease_id": self.lease_id,
                "holder": self.holder,
                "duration_seconds": self.duration_seconds,
                "token": self.token,
                "state": self.state.value,
                "renewals": self.renewals,
                "ended_by": self.ended_by.value if self.ended_by else None,
                "holder_uid": self.holder_uid,
                "retained": list(self.retained),
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LeaseRecord:
        """Parse a stored record; ``ValueError`` (or ``KeyError``) for anything this version
        did not write: a wrong type is never coerced (``"7"``, ``7.5`` or ``true`` as a token)."""
        data = _object(raw)
        ended = data.get("ended_by")
        token = data.get("token")
        duration = data["duration_seconds"]
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise ValueError(f"duration_seconds must be a number, not {duration!r}")
        return cls(
            lease_id=_str(data["lease_id"], "lease_id"),
            holder=_str(data["holder"], "holder"),
            duration_seconds=float(duration),
            token=_count(token, "token") if token is not None else None,
            state=LeaseState(data.get("state", "held")),
            renewals=_count(data.get("renewals", 0), "renewals"),
            ended_by=EndedBy(ended) if ended else None,
            holder_uid=_opt_str(data.get("holder_uid")),
            retained=tuple(_count(t, "retained") for t in _list(data.get("retained"))),
        )

    def with_retained(self, retained: tuple[int, ...]) -> LeaseRecord:
        return replace(self, retained=retained)

    def renewed(self, token: int) -> LeaseRecord:
        """This generation renewed once more, its token explicit (built directly, not with
        ``dataclasses.replace``: a renewal's hot path)."""
        return LeaseRecord(
            self.lease_id,
            self.holder,
            self.duration_seconds,
            token,
            self.state,
            self.renewals + 1,
            self.ended_by,
            self.holder_uid,
            self.retained,
        )

    def ended(self, token: int, ended_by: EndedBy) -> LeaseRecord:
        """This generation ended (released, force-released or expired), its token explicit."""
        return LeaseRecord(
            self.lease_id,
            self.holder,
            self.duration_seconds,
            token,
            LeaseState.RELEASED,
            self.renewals,
            ended_by,
            self.holder_uid,
            self.retained,
        )


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A lease record together with the etcd mod_revision of the version that was read."""

    record: LeaseRecord
    mod_revision: int

    @property
    def token(self) -> int:
        return self.record.token_at(self.mod_revision)


@dataclass(frozen=True, slots=True)
class Observation:
    """When *this replica* first saw a given version of a lease record (monotonic seconds).

    This is the time authority: a record expires ``duration`` after its first observation on
    the observing replica's own monotonic clock (client-go leader-election style).  The
    lease id is kept too so a revision reused after a careless etcd restore is not mistaken
    for the version observed before it.
    """

    mod_revision: int
    lease_id: str
    observed_at: float


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """The value at ``<prefix>/tokens/<token>``: proof that ``token`` was issued, and for what."""

    namespace: str
    name: str
    lease_id: str
    holder: str
    holder_uid: str | None = None

    @property
    def key(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.name)

    def to_json(self) -> bytes:
        return _ENCODE(
            {
                "namespace": self.namespace,
                "name": self.name,
                "lease_id": self.lease_id,
                "holder": self.holder,
                "holder_uid": self.holder_uid,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TokenGrant:
        data = _object(raw)
        return cls(
            namespace=_str(data["namespace"], "namespace"),
            name=_str(data["name"], "name"),
            lease_id=_str(data["lease_id"], "lease_id"),
            holder=_str(data["holder"], "holder"),
            holder_uid=_opt_str(data.get("holder_uid")),
        )


# Stored values are parsed strictly: whatever does not parse raises ValueError, and the store
# turns that into ``StoreUnavailable("corrupt")`` (never trusted, never skipped).


def _object(raw: bytes) -> dict[str, Any]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"a stored record must be a JSON object, not {type(data).__name__}")
    return data


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, not {value!r}")
    return value


def _count(value: Any, field: str) -> int:
    """A non-negative JSON integer (not a bool, float or string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{field} must be a non-negative integer, not {value!r}")
    return int(value)


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"expected a list, not {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return _str(value, "holder_uid")


@dataclass(frozen=True, slots=True)
class HighWaterMark:
    """The value at ``<prefix>/hwm/<ns>/<name>``: greatest accepted token of a fencing domain.

    ``operation_ids`` are the operation ids already applied at ``token`` (bounded; reset when
    the token advances) so a retried or reordered same-token write is a ``duplicate``.
    """

    token: int
    operation_ids: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(
            {"token": self.token, "operation_ids": list(self.operation_ids)},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> HighWaterMark:
        data = _object(raw)
        return cls(
            token=_count(data["token"], "token"),
            operation_ids=tuple(_str(o, "operation_ids") for o in _list(data.get("operation_ids"))),
        )


@dataclass(frozen=True, slots=True)
class Generation:
    """A fencing domain's lease key as a fence check read it: ``token`` is the token of its
    current generation (the grant, or the ended generation until the next grant), ``None``
    when the key is absent: the lease was deleted (or never granted), so every token issued
    for it belongs to a superseded generation (docs/tokens.md, "Superseded generations")."""

    token: int | None


@dataclass(frozen=True, slots=True)
class FenceRead:
    """What a fence check reads in one etcd transaction: the token's grant (``None``: no
    record), the domain's high-water mark and the domain's current :class:`Generation`."""

    grant: TokenGrant | None
    mark: HighWaterMark | None
    generation: Generation


# --------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Acquired:
    """A new generation was granted.

    ``deadline_monotonic`` is on the *grantor's* monotonic clock; ``valid_until`` is the wall
    time to hand to holders (Pod annotation).  Both are conservative: see ``docs/tokens.md``.
    """

    lease_id: str
    token: int
    holder: str
    duration: float
    deadline_monotonic: float
    valid_until: datetime
    acquired_at: datetime
    kind: Literal["acquired"] = "acquired"
    took_over_expired: bool = False


@dataclass(frozen=True, slots=True)
class Busy:
    """Someone else holds an unexpired generation (as judged by this replica's clock)."""

    holder: str
    lease_id: str
    token: int
    remaining_seconds: float
    kind: Literal["busy"] = "busy"


@dataclass(frozen=True, slots=True)
class Renewed:
    """The same generation (same lease id and token) was extended."""

    lease_id: str
    token: int
    holder: str
    duration: float
    deadline_monotonic: float
    valid_until: datetime
    renewed_at: datetime
    renewals: int
    kind: Literal["renewed"] = "renewed"


@dataclass(frozen=True, slots=True)
class Released:
    """The named generation ended (by its holder, or forced by an administrator)."""

    lease_id: str
    token: int
    forced: bool = False
    already_released: bool = False
    kind: Literal["released"] = "released"


@dataclass(frozen=True, slots=True)
class Expired:
    """The named generation was marked expired (this replica saw ``duration`` pass)."""

    lease_id: str
    token: int
    holder: str
    kind: Literal["expired"] = "expired"


@dataclass(frozen=True, slots=True)
class NotHeld:
    """A renew/release/expire named a generation that is not the current live one.

    Nothing was changed.  ``current_lease_id`` is the lease id currently recorded, if any.
    """

    reason: str
    current_lease_id: str | None = None
    kind: Literal["not_held"] = "not_held"


AcquireResult = Acquired | Busy
RenewResult = Renewed | NotHeld
ReleaseResult = Released | NotHeld
ExpireResult = Expired | NotHeld | Busy


@dataclass(frozen=True, slots=True)
class FenceResult:
    """Outcome of a fenced write check.

    ``message`` starts with the code and states token, high-water mark and lease, e.g.
    ``stale_fence: token 41 is below the high-water mark 42 of lease default/report-july``.
    ``high_water_mark`` is the mark *after* the check (``None``: nothing accepted yet).
    """

    code: FenceCode
    token: int
    high_water_mark: int | None
    lease: str
    message: str
    lease_id: str | None = None
    holder: str | None = None
    kind: Literal["fence"] = "fence"

    @property
    def allowed(self) -> bool:
        return self.code is FenceCode.APPLIED


@dataclass(frozen=True, slots=True)
class MarkAdvance:
    """What recording a committed write did to its fencing domain's high-water mark.

    ``verified``: the token was issued for this domain (else the mark was left alone);
    ``high_water_mark``: the mark after the call (``None``: nothing recorded yet);
    ``retired``: not verified, but older than every token record the lease still keeps and
    covered by its mark: most likely a grant whose record the retention rule pruned (it
    cannot move the mark either way, so it is not reported as unverified).
    """

    token: int
    high_water_mark: int | None
    advanced: bool
    verified: bool
    retired: bool = False


@dataclass(frozen=True, slots=True)
class LeaseView:
    """What :meth:`read` returns: the record, its token and this replica's verdict on it."""

    record: LeaseRecord
    mod_revision: int
    token: int
    expired: bool
    remaining_seconds: float
    header_revision: int = 0


class StoreUnavailable(Exception):
    """The store cannot decide now; raised by every store call (reads and writes), never
    returned.  Never means "stale".

    Codes are a small fixed set (metric label ``code``): ``etcd_error``, ``restore_guard``,
    ``contention``, ``corrupt``.
    """

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
