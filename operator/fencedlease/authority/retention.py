"""Pure retention rule for token records and high-water marks (docs/tokens.md, "Retention").

No I/O and no clock reads: the store passes what it read and ``now`` from its monotonic clock,
and writes what these functions return in the transaction it was going to run anyway.

* A **live lease** keeps the token records of its last ``generations`` recorded generations.
  Their tokens are listed, oldest first, in the lease record (``LeaseRecord.retained``).  The
  transaction that records a new token (the one that replaces the grant's version of the lease
  key: first renew, release, expire, force release, takeover) also deletes the records that
  fall off the list, so acquire, renew and release stay one transaction each.  The current
  generation is always known (its record, or the lease key itself), so a holder's token never
  becomes unknown while it may still be accepted as the newest.
* A **deleted lease** leaves its retained token records and its high-water mark attached to an
  etcd lease with a time to live (``deleted_window_seconds``), shared by every deletion in the
  same time bucket.  They stay readable (``lease_mismatch``, ``stale_fence`` and the restore
  guard's checks answer as before) for at least the window, and for at most twice the window;
  etcd then deletes them together, so no old token outlives the mark it was compared with.

Pruning only ever removes a token record, and a token without a record is refused
(``unknown_token``): no rule here can turn a refusal into an acceptance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from fencedlease.authority.types import LeaseRecord, StoredLease

DEFAULT_GENERATIONS = 16
"""Token records kept per live lease (the current generation is always known on top)."""

DEFAULT_DELETED_WINDOW_SECONDS = 86_400.0
"""How long the token records and the mark of a deleted lease stay readable (at least)."""


@dataclass(frozen=True, slots=True)
class Retention:
    """The retention parameters (``Settings``: ``token_retention_generations``,
    ``deleted_lease_retention_seconds``)."""

    generations: int = DEFAULT_GENERATIONS
    deleted_window_seconds: float = DEFAULT_DELETED_WINDOW_SECONDS

    def __post_init__(self) -> None:
        if self.generations < 1:
            raise ValueError(
                f"token retention must keep at least 1 generation, not {self.generations}"
            )
        if not self.deleted_window_seconds > 0:
            window = self.deleted_window_seconds
            raise ValueError(f"the deleted-lease retention window must be positive, not {window}")


def retain(
    retained: tuple[int, ...], token: int, generations: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Record ``token``: the new list (oldest first, at most ``generations`` long) and the
    tokens whose records fall off it, to delete in the same transaction."""
    kept = retained if token in retained else (*retained, token)
    cut = max(0, len(kept) - generations)
    return kept[cut:], kept[:cut]


@dataclass(frozen=True, slots=True)
class RecordPlan:
    """What the transaction that replaces ``previous`` writes besides the new lease record.

    ``record``: the lease record to write, its ``retained`` list carried over or updated;
    ``token``: the grant token to record now (``None``: nothing to record);
    ``pruned``: token records to delete in the same transaction.
    """

    record: LeaseRecord
    token: int | None
    pruned: tuple[int, ...]


def plan_records(
    previous: StoredLease | None,
    record: LeaseRecord,
    generations: int,
    *,
    taken: int | None = None,
) -> RecordPlan:
    """The token bookkeeping of a transaction that moves the lease key from ``previous`` to
    ``record``.  ``previous`` is a grant version (``token: null``) unless its token was
    already recorded; ``taken`` is a grant version whose token record already exists (etcd
    reuses revisions, see the restore guard): it is not recorded again, nor listed."""
    retained = previous.record.retained if previous is not None else ()
    if record.retained != retained:
        record = record.with_retained(retained)
    if previous is None or previous.record.token is not None or previous.mod_revision == taken:
        return RecordPlan(record, None, ())
    kept, pruned = retain(retained, previous.mod_revision, generations)
    return RecordPlan(record.with_retained(kept), previous.mod_revision, pruned)


def retired(
    grant_known: bool,
    token: int,
    hwm_token: int | None,
    retained: tuple[int, ...],
    generations: int,
) -> bool:
    """A committed write's token without a record that may be a pruned grant of this lease:
    the lease's list is full (so records were pruned), the token is older than all of them,
    and the mark already covers it (so it could not move the mark anyway).  Such a token is
    not reported as unverified; it still never moves the mark, and a fence check refuses it
    (``unknown_token``)."""
    return (
        not grant_known
        and len(retained) >= generations
        and token < retained[0]
        and hwm_token is not None
        and token <= hwm_token
    )


def deleted_tokens(previous: StoredLease, taken: int | None = None) -> tuple[int, ...]:
    """The token records a deletion of ``previous`` hands to the retention window: the
    retained ones, and the grant version's own token when it is recorded by the deletion."""
    plan = plan_records(previous, previous.record, len(previous.record.retained) + 1, taken=taken)
    return plan.record.retained


@dataclass(slots=True)
class SweepReport:
    """What one legacy sweep did (running totals; :meth:`EtcdStore.sweep_legacy`)."""

    scanned: int = 0
    pruned: int = 0
    kept: int = 0
    changed: int = 0
    """Chosen for pruning but changed (or their lease did) before the delete: left for later."""
    malformed: int = 0
    """Keys under the prefix that are not ours to read: left alone."""


@dataclass(frozen=True, slots=True)
class Bucket:
    """The time bucket of a deletion: every deletion in bucket ``index`` attaches its keys to
    one etcd lease, granted with ``ttl_seconds`` by the first of them."""

    index: int
    ttl_seconds: int


def bucket(now: float, window_seconds: float) -> Bucket:
    """The bucket of ``now`` and the time to live of an etcd lease granted ``now`` for it:
    until one window after the bucket ends, so a key attached at any time in the bucket
    lives at least ``window_seconds`` and at most twice that."""
    index = math.floor(now / window_seconds)
    end = (index + 1) * window_seconds
    return Bucket(index, max(1, math.ceil(end + window_seconds - now)))


def expires_at(now: float, window_seconds: float) -> float:
    """When keys attached ``now`` are deleted: the model's view of :func:`bucket`'s lease
    granted at the bucket's start (at least ``window_seconds`` from now, at most twice)."""
    index = math.floor(now / window_seconds)
    return (index + 2) * window_seconds


class Sweep(Enum):
    """What the legacy sweep does with one token record or high-water mark it finds."""

    KEEP = "kept"
    PRUNE = "pruned"


def sweep_token(token: int, attached: bool, lease: StoredLease | None, generations: int) -> Sweep:
    """A token record found by the legacy sweep (``attached``: it has an etcd lease, i.e. a
    deletion handed it to the window; ``lease``: its lease key as read, ``None`` if absent).

    Records written before retention existed are in no lease's ``retained`` list, so the
    recording transactions never prune them. The sweep applies the rule to them:

    * the lease exists: pruned once its list is full and the token is older than every
      retained one (exactly the tokens :func:`retired` already treats as pruned); else kept,
      and a later sweep looks again;
    * the lease key is gone and no deletion attached the record: its lease was deleted before
      deletions used the window. It is pruned at once. Attaching it to the window now could
      let it outlive the lease's mark, which its deletion may have attached long ago.

    Like pruning, the sweep only ever removes a record: it never turns a refusal into an
    acceptance (a token without a record is ``unknown_token``)."""
    if attached:
        return Sweep.KEEP
    if lease is None:
        return Sweep.PRUNE
    retained = lease.record.retained
    if len(retained) >= generations and token < retained[0] and token != lease.token:
        return Sweep.PRUNE
    return Sweep.KEEP


def sweep_mark(attached: bool, lease_exists: bool, records_remain: bool) -> Sweep:
    """A high-water mark found by the legacy sweep (``records_remain``: a token record of its
    lease survived this sweep's token pass, attached to the window or kept).

    A mark whose lease key is gone, that no deletion attached to the window, and whose lease
    has no token record left belongs to a lease deleted before the window existed: it is
    pruned (a re-created lease's tokens are all newer than it: etcd revisions only grow).
    Every other mark is kept: no old token may outlive the mark it is compared with, so a mark
    is never pruned while a record of its lease stays (that record's token would then be
    admitted above nothing), and pruning only ever turns an answer into ``unknown_token``."""
    if attached or lease_exists or records_remain:
        return Sweep.KEEP
    return Sweep.PRUNE
