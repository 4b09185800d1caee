"""Pure lease decisions: given what was read and the time now, what should be written?

No I/O and no clock reads here: the caller passes the current stored record (or ``None``),
this replica's :class:`Observation` of it and ``now`` from its monotonic clock.  The store then
executes the returned plan as one etcd transaction conditional on ``expected_mod_revision``, so
a decision taken on a stale read simply fails to commit and is re-decided.

Time authority (docs/tokens.md): each replica's monotonic clock, observer style.  A held record is
expired for a replica once ``duration`` has elapsed on that replica's clock since it *first
observed* the record's current version.  The observation necessarily follows the commit, and
the holder's deadline is computed from the grant request's send time (which precedes the
commit) minus a skew bound, so every observer's expiry comes after the holder's deadline as
long as clock *rates* agree within the bound over one lease duration.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypedDict

from fencedlease.authority.types import (
    Acquired,
    Busy,
    EndedBy,
    LeaseRecord,
    LeaseState,
    LeaseView,
    NotHeld,
    Observation,
    Released,
    Renewed,
    StoredLease,
    StoreUnavailable,
)


def new_lease_id() -> str:
    """A fresh lease id: identifies a generation (dedupes requests), never orders it."""
    return uuid.uuid4().hex[:12]


def observe(
    previous: Observation | None, current: StoredLease | None, now: float
) -> Observation | None:
    """Keep the first observation of the current version; start a new one when it changed."""
    if current is None:
        return None
    if (
        previous is not None
        and previous.mod_revision == current.mod_revision
        and previous.lease_id == current.record.lease_id
    ):
        return previous
    return Observation(current.mod_revision, current.record.lease_id, now)


def remaining_seconds(current: StoredLease, observation: Observation | None, now: float) -> float:
    """Seconds until this replica considers the held record expired (0 when free/expired).

    An observation that does not match ``current`` counts as made ``now`` (conservative).
    """
    if current.record.state is not LeaseState.HELD:
        return 0.0
    observed_at = now
    if (
        observation is not None
        and observation.mod_revision == current.mod_revision
        and observation.lease_id == current.record.lease_id
    ):
        observed_at = observation.observed_at
    return max(0.0, current.record.duration_seconds - (now - observed_at))


def is_expired(current: StoredLease, observation: Observation | None, now: float) -> bool:
    """Held and ``duration`` passed since this replica first observed this version."""
    return current.record.state is LeaseState.HELD and (
        remaining_seconds(current, observation, now) <= 0.0
    )


def holder_deadline(sent_at: float, duration: float, skew: float) -> float:
    """Holder's deadline on the grantor's monotonic clock: from the *send* time, minus skew."""
    return sent_at + duration - skew


def valid_until(sent_wall: datetime, duration: float, skew: float) -> datetime:
    """Wall-clock deadline handed to Pods (RFC 3339): from the send time, minus the skew bound."""
    return sent_wall + timedelta(seconds=duration - skew)


def view(
    current: StoredLease, observation: Observation | None, now: float, header_revision: int
) -> LeaseView:
    """What a read returns: the record, its token and this replica's expiry verdict."""
    return LeaseView(
        record=current.record,
        mod_revision=current.mod_revision,
        token=current.token,
        expired=is_expired(current, observation, now),
        remaining_seconds=remaining_seconds(current, observation, now),
        header_revision=header_revision,
    )


# What Acquired and Renewed both say, by name: mypy checks each key against both constructors
# (the functional form: the field list stands once as a class, in types.py).
_Term = TypedDict(  # noqa: UP013
    "_Term",
    {
        "lease_id": str,
        "token": int,
        "holder": str,
        "duration": float,
        "deadline_monotonic": float,
        "valid_until": datetime,
    },
)


def _term(
    record: LeaseRecord, token: int, sent_at: float, sent_wall: datetime, skew: float
) -> _Term:
    """The lease id, token, holder, duration and the holder's deadlines from the request's
    send times (``sent_at`` monotonic, ``sent_wall`` wall)."""
    duration = record.duration_seconds
    return _Term(
        lease_id=record.lease_id,
        token=token,
        holder=record.holder,
        duration=duration,
        deadline_monotonic=holder_deadline(sent_at, duration, skew),
        valid_until=valid_until(sent_wall, duration, skew),
    )


def acquired(
    plan: AcquirePlan, token: int, sent_at: float, sent_wall: datetime, skew: float
) -> Acquired:
    """The grant ``plan`` committed at revision ``token``."""
    return Acquired(
        **_term(plan.record, token, sent_at, sent_wall, skew),
        acquired_at=sent_wall,
        took_over_expired=plan.took_over_expired,
    )


def renewed(plan: WritePlan, sent_at: float, sent_wall: datetime, skew: float) -> Renewed:
    """The renewal ``plan`` committed."""
    return Renewed(
        **_term(plan.record, plan.token, sent_at, sent_wall, skew),
        renewed_at=sent_wall,
        renewals=plan.record.renewals,
    )


def restore_guard(revision: int, token_floor: int, max_token_seen: int) -> StoreUnavailable | None:
    """Refuse to grant when the store's revision went back (etcd restored from a snapshot).

    Every new token is the revision of a write committed after ``revision`` was read, so it
    is greater than ``revision``; requiring ``revision > token_floor`` (the highest token the
    caller knows was issued: lease statuses, artifacts) therefore guarantees a fresh token is
    above every token issued before.  The in-process ``max_token_seen`` may equal the head
    revision (it was the last write), so only a revision *below* it is refused.
    """
    if revision > token_floor and revision >= max_token_seen:
        return None
    return _refuse_reissue(revision, max(token_floor, max_token_seen))


def _refuse_reissue(revision: int, floor: int) -> StoreUnavailable:
    return StoreUnavailable(
        code="restore_guard",
        reason=(
            f"etcd revision {revision} is not above the highest token already issued ({floor}): "
            "etcd was probably restored from an older snapshot, so its revisions would reissue "
            "old tokens. Refusing to grant. Restore again with "
            f"`etcdutl snapshot restore <snapshot> --bump-revision <N> --mark-compacted` "
            f"where N exceeds {floor} - {revision} (e.g. 1000000000), then restart etcd."
        ),
    )


def rollback_guard(revision: int, token_floor: int, max_token_seen: int) -> StoreUnavailable | None:
    """A *read* (no write of ours) returned header ``revision``: refuse to grant when it is
    below a token known to be issued.  Every issued token is the revision of a committed
    write, so a healthy etcd's header is at or above it; equal is fine (that grant may be
    the last write)."""
    floor = max(token_floor, max_token_seen)
    return None if revision >= floor else _refuse_reissue(revision, floor)


def grant_guard(
    token: int, token_floor: int, max_token_seen: int, previous_token: int | None = None
) -> StoreUnavailable | None:
    """A grant committed at revision ``token``: refuse to issue it unless it is above every
    token known to be issued before the request was sent (``token_floor``: verified lease
    statuses; ``max_token_seen``: what this replica issued or read before sending;
    ``previous_token``: the generation this write replaced, returned by the same
    transaction).  On a healthy etcd a write's revision is above all of them, so ``<=``
    means etcd reuses revisions (restored from an older snapshot, or keys copied into a new
    cluster)."""
    floor = max(token_floor, max_token_seen, previous_token or 0)
    return None if token > floor else _refuse_reissue(token, floor)


@dataclass(frozen=True, slots=True)
class AcquirePlan:
    """Write ``record`` iff the key is still at ``expected_mod_revision`` (``None``: absent)."""

    expected_mod_revision: int | None
    record: LeaseRecord
    took_over_expired: bool
    previous: StoredLease | None


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Rewrite the record of generation ``token`` iff it is still at ``expected_mod_revision``."""

    expected_mod_revision: int
    record: LeaseRecord
    token: int


def decide_acquire(
    current: StoredLease | None,
    observation: Observation | None,
    now: float,
    *,
    holder: str,
    duration_seconds: float,
    lease_id: str,
    holder_uid: str | None = None,
) -> AcquirePlan | Busy:
    """Grant a new generation if the lease is free, else report who holds it.

    A holder asking again while it holds the lease also gets :class:`Busy` (with its own
    name): a held generation is extended with renew, never re-granted, so the token only
    changes when ownership really starts over.
    """
    if duration_seconds <= 0:
        raise ValueError("duration_seconds must be positive")
    record = LeaseRecord(
        lease_id=lease_id,
        holder=holder,
        duration_seconds=duration_seconds,
        token=None,  # "the mod_revision of the version this write creates"
        state=LeaseState.HELD,
        renewals=0,
        holder_uid=holder_uid,
    )
    if current is None:
        return AcquirePlan(None, record, took_over_expired=False, previous=None)
    if current.record.state is LeaseState.RELEASED:
        return AcquirePlan(current.mod_revision, record, took_over_expired=False, previous=current)
    left = remaining_seconds(current, observation, now)
    if left <= 0.0:
        return AcquirePlan(current.mod_revision, record, took_over_expired=True, previous=current)
    return Busy(
        holder=current.record.holder,
        lease_id=current.record.lease_id,
        token=current.token,
        remaining_seconds=left,
    )


def _mismatch(current: StoredLease | None, lease_id: str, token: int | None) -> NotHeld | None:
    if current is None:
        return NotHeld(reason=f"no lease record (lease_id {lease_id} is not current)")
    if current.record.lease_id != lease_id:
        return NotHeld(
            reason=f"lease_id mismatch: current is {current.record.lease_id}, not {lease_id}",
            current_lease_id=current.record.lease_id,
        )
    if token is not None and current.token != token:
        return NotHeld(
            reason=(f"token mismatch: lease_id {lease_id} has token {current.token}, not {token}"),
            current_lease_id=current.record.lease_id,
        )
    return None


def decide_renew(
    current: StoredLease | None,
    observation: Observation | None,
    now: float,
    *,
    lease_id: str,
    token: int,
) -> WritePlan | NotHeld:
    """Extend the exact generation ``(lease_id, token)``; the token never changes.

    A generation this replica already considers expired is not renewed: a holder that may
    have been declared lost stays lost and must acquire again (new token).
    """
    wrong = _mismatch(current, lease_id, token)
    if wrong is not None:
        return wrong
    assert current is not None
    if current.record.state is LeaseState.RELEASED:
        return NotHeld(
            reason=f"lease_id {lease_id} was released ({current.record.ended_by or 'release'})",
            current_lease_id=lease_id,
        )
    if is_expired(current, observation, now):
        return NotHeld(reason=f"lease_id {lease_id} expired", current_lease_id=lease_id)
    token = current.token
    return WritePlan(current.mod_revision, current.record.renewed(token), token)


def _end(current: StoredLease, ended_by: EndedBy) -> WritePlan:
    token = current.token
    return WritePlan(current.mod_revision, current.record.ended(token, ended_by), token)


def decide_release(
    current: StoredLease | None, *, lease_id: str, token: int
) -> WritePlan | Released | NotHeld:
    """End the exact generation ``(lease_id, token)``; anything else changes nothing.

    Releasing an already released generation is idempotent (no write).  Releasing a
    generation that expired but was not taken over is allowed: it only frees it sooner.
    """
    wrong = _mismatch(current, lease_id, token)
    if wrong is not None:
        return wrong
    assert current is not None
    if current.record.state is LeaseState.RELEASED:
        return Released(lease_id=lease_id, token=current.token, already_released=True)
    return _end(current, EndedBy.RELEASE)


def decide_force_release(
    current: StoredLease | None, *, lease_id: str
) -> WritePlan | Released | NotHeld:
    """Administrator revoke of generation ``lease_id`` (the token is not needed).

    This does not stop the old holder's process: only a newer token at the resource does.
    """
    wrong = _mismatch(current, lease_id, None)
    if wrong is not None:
        return wrong
    assert current is not None
    if current.record.state is LeaseState.RELEASED:
        return Released(lease_id=lease_id, token=current.token, forced=True, already_released=True)
    return _end(current, EndedBy.FORCE_RELEASE)


def decide_expire(
    current: StoredLease | None,
    observation: Observation | None,
    now: float,
    *,
    lease_id: str | None = None,
) -> WritePlan | Busy | NotHeld:
    """Record that the held generation expired on this replica's clock.

    Optional (acquire takes over an expired generation by itself); it lets the operator
    show the expiry and count it.  ``lease_id`` (if given) must name the current generation.
    """
    if current is None:
        return NotHeld(reason="no lease record")
    wrong = _mismatch(current, lease_id, None) if lease_id is not None else None
    if wrong is not None:
        return wrong
    if current.record.state is LeaseState.RELEASED:
        return NotHeld(
            reason=f"lease_id {current.record.lease_id} is already released",
            current_lease_id=current.record.lease_id,
        )
    left = remaining_seconds(current, observation, now)
    if left > 0.0:
        return Busy(
            holder=current.record.holder,
            lease_id=current.record.lease_id,
            token=current.token,
            remaining_seconds=left,
        )
    return _end(current, EndedBy.EXPIRY)
