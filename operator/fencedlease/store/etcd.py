"""The grant authority on etcd: runs the pure decisions of :mod:`fencedlease.authority.decide`
as etcd transactions (client: ``aetcd``, see ``docs/etcd-client.md``).

Every write is a transaction conditional on the mod_revision that the decision was based on,
so etcd's compare decides races between replicas; a lost race is re-read and re-decided
(:meth:`EtcdStore._decide_and_write`, the one loop).  The store is split by concern:

* :mod:`.connection`: endpoints, failover, TLS, errors translated once;
* :mod:`.ops`: request building;
* :mod:`.base`: key layout, the parsed lease view, this replica's cache and observations;
* :mod:`.fencing`: the fence read and ``record_commit``;
* :mod:`.retention`: deletion into the retention window, the legacy sweep;
* this module: acquire, renew, release, force release, expire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fencedlease import metrics
from fencedlease.authority import decide
from fencedlease.authority.types import (
    Acquired,
    AcquireResult,
    Busy,
    EndedBy,
    Expired,
    ExpireResult,
    LeaseKey,
    LeaseRecord,
    NotHeld,
    Observation,
    Released,
    ReleaseResult,
    RenewResult,
    StoredLease,
    StoreUnavailable,
)
from fencedlease.store import ops
from fencedlease.store.base import _latency, _releases, _renewals, _same_version
from fencedlease.store.fencing import FenceReads
from fencedlease.store.retention import RetentionSweeps


class EtcdStore(FenceReads, RetentionSweeps):
    """The grant authority on etcd.  One instance per operator replica.

    ``clock`` is this replica's monotonic clock (the time authority); ``wall`` only produces
    the ``valid_until``/``acquired_at`` timestamps handed to Pods and shown in status.
    """

    async def acquire(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration_seconds: float,
        *,
        token_floor: int = 0,
        holder_uid: str | None = None,
    ) -> AcquireResult:
        """Grant a new generation (``Acquired``) or say who holds it (``Busy``); raises
        ``StoreUnavailable`` when it cannot decide (etcd error, ``restore_guard``, contention).

        ``token_floor``: the highest token the caller *verified* was issued (lease statuses
        carrying the authority's proof); a grant is refused unless its token is above it.
        ``holder_uid``: the holder Pod's UID, recorded with the grant so that only that Pod
        (not a later one with the same name) can use it.
        """
        with _latency("acquire").time():
            try:
                result = await self._acquire(
                    LeaseKey(namespace, name), holder, duration_seconds, token_floor, holder_uid
                )
            except StoreUnavailable as error:
                # The grant may or may not have committed; if it did, nobody was told its
                # token and it expires (or is released) like any other generation.
                metrics.ACQUIRE_UNAVAILABLE.labels(error.code).inc()
                raise
        match result:
            case Acquired(took_over_expired=took_over):
                metrics.GRANTS.inc()
                if took_over:
                    metrics.TAKEOVERS.inc()
                    metrics.EXPIRIES.inc()
            case Busy():
                metrics.ACQUIRE_BUSY.inc()
        return result

    async def _acquire(
        self,
        key: LeaseKey,
        holder: str,
        duration_seconds: float,
        token_floor: int,
        holder_uid: str | None,
    ) -> AcquireResult:
        """One transaction when the cache is right (:meth:`_decide_and_write`), with the
        restore guard on every revision etcd returns and on the commit revision."""
        sent_at, sent_wall = self.clock(), self.wall()
        # Tokens seen *before* the request was sent were committed before it, so a healthy
        # etcd commits this grant above all of them (docs/tokens.md, "Restore").
        seen_before = self._max_token_seen
        lease_id = self._lease_ids()
        current = self._known.get(key)
        fresh = False  # ``current`` came from etcd in this call (not from the cache)

        def guard(revision: int) -> StoreUnavailable | None:
            refusal = decide.rollback_guard(revision, token_floor, seen_before)
            return self._refused(refusal) if refusal is not None else None

        if decide.rollback_guard(self._head_revision, token_floor, seen_before) is not None:
            # Nothing this replica saw shows etcd above the floor: a write now could commit
            # at a revision already issued as a token.  Read first and refuse without
            # writing: a refused grant that committed and was revoked would still advance
            # etcd's revision, so retries would climb past the floor by themselves, and the
            # refusal would vanish without the administrator's `--bump-revision` restore
            # (tests/unit/test_store_restore_guard.py).
            current, revision = await self._read_lease("acquire", key)
            self._observe(key, current)
            fresh = True
            refusal = guard(revision)
            if refusal is not None:
                raise refusal
        outcome = await self._decide_and_write(
            "acquire",
            key,
            current,
            fresh,
            lambda cur, obs, now: decide.decide_acquire(
                cur,
                obs,
                now,
                holder=holder,
                duration_seconds=duration_seconds,
                lease_id=lease_id,
                holder_uid=holder_uid,
            ),
            guard=guard,
        )
        if not isinstance(outcome, _Written):
            assert isinstance(outcome, Busy), outcome
            return outcome
        plan, token = outcome.plan, outcome.revision
        assert isinstance(plan, decide.AcquirePlan)
        # The compare held, so the version replaced is the one decided on.
        previous_token = plan.previous.token if plan.previous is not None else None
        refusal = decide.grant_guard(token, token_floor, seen_before, previous_token)
        if refusal is not None:
            self._refused(refusal)
            await self._revoke(key, token)
            raise refusal
        self._wrote(key, outcome.record, token)
        self._see_token(token)
        return decide.acquired(plan, token, sent_at, sent_wall, self.skew_seconds)

    def _refused(self, refusal: StoreUnavailable) -> StoreUnavailable:
        """The restore guard refused: what this replica saw of etcd's revision is no evidence
        any more, so the next acquire reads before it writes, and writes only once etcd is
        above every token known (after the `--bump-revision` restore)."""
        self._head_revision = -1
        return refusal

    async def _revoke(self, key: LeaseKey, token: int) -> None:
        """Undo a grant that committed but must not be issued (restore guard): delete the
        version we wrote, if it is still there, so it never becomes a recorded token."""
        raw = self._lease_key(key)
        self._forget(key)
        for _ in range(3):
            try:
                await self._txn("acquire", [ops.mod_is(raw, token)], [ops.delete(raw)])
                return
            except StoreUnavailable:
                continue

    async def _rewrite(
        self,
        operation: str,
        key: LeaseKey,
        decide_fn: Callable[
            [StoredLease | None, Observation | None, float],
            decide.WritePlan | Released | NotHeld | Busy,
        ],
    ) -> tuple[decide.WritePlan | Released | NotHeld | Busy, float, datetime]:
        """Renew, release, force-release and expire: :meth:`_decide_and_write` on the cached
        version (read first when nothing is cached).  Raises ``StoreUnavailable``."""
        sent_at, sent_wall = self.clock(), self.wall()
        if key in self._known:
            current, fresh = self._known[key], False
        else:
            current, _ = await self._read_lease(operation, key)
            self._observe(key, current)
            fresh = True
        outcome = await self._decide_and_write(operation, key, current, fresh, decide_fn)
        if isinstance(outcome, _Written):
            self._wrote(key, outcome.record, outcome.revision)
            assert isinstance(outcome.plan, decide.WritePlan)
            return outcome.plan, sent_at, sent_wall
        return outcome, sent_at, sent_wall

    async def _decide_and_write(
        self,
        operation: str,
        key: LeaseKey,
        current: StoredLease | None,
        fresh: bool,
        decide_fn: Callable[[StoredLease | None, Observation | None, float], _Decision],
        *,
        guard: Callable[[int], StoreUnavailable | None] = lambda revision: None,
    ) -> _Written | Busy | Released | NotHeld:
        """The one compare / read-back / re-decide loop of every lease write.

        ``decide_fn`` decides on ``current`` (the cached version unless ``fresh``).  A
        decision that writes nothing is only returned on what etcd says now: from the cache
        it is confirmed by a read first.  A write (``AcquirePlan``/``WritePlan``) is one
        transaction conditional on the version decided on, recording that version's token
        when it is a grant version (:meth:`_record_ops`); its failure branch reads the key
        back, so a lost race or a stale cache costs that same round trip, then the loop
        decides again.  ``guard(revision)`` sees every revision etcd returns (the restore
        guard of acquire).  Returns :class:`_Written` (the caller caches it), the answer
        that writes nothing; raises ``StoreUnavailable`` (etcd errors, a refusal of the
        guard, a reused revision, contention)."""
        raw = self._lease_key(key)
        taken: int | None = None  # a grant version whose token record already exists
        for _ in range(self._max_retries):
            observation = self._observations.get(key) if current is not None else None
            plan = decide_fn(current, observation, self.clock())
            if not isinstance(plan, decide.AcquirePlan | decide.WritePlan):
                if fresh:
                    return plan
                current, revision = await self._read_lease(operation, key)
                self._observe(key, current)
                fresh = True
                refusal = guard(revision)
                if refusal is not None:
                    raise refusal
                continue
            previous = plan.previous if isinstance(plan, decide.AcquirePlan) else current
            expected = plan.expected_mod_revision
            compare = ops.absent(raw) if expected is None else ops.mod_is(raw, expected)
            rc, rs, rf, record = self._record_ops(key, previous, plan.record, taken)
            response = await self._txn(
                operation,
                [compare, *rc],
                [ops.put(raw, record.to_json()), *rs],
                [ops.get(raw), *rf],
            )
            if response.succeeded:
                return _Written(plan, record, int(response.header.revision))
            kv = ops.range_kv(response.responses[0])
            current = self._stored(kv) if kv is not None else None
            self._observe(key, current)
            fresh = True
            reused = _record_taken(rf, response, current, previous)
            if reused is not None:
                # etcd already holds a record for this revision: it reuses revisions. A
                # renewal refuses; any other write ends the generation, keeping that record.
                if operation == "renew":
                    raise _reused(reused)
                taken = reused
            refusal = guard(int(response.header.revision))
            if refusal is not None:
                raise refusal
        raise StoreUnavailable("contention", f"lease {key} kept changing while {operation}")

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        """Extend generation ``(lease_id, token)``; anything else is ``NotHeld`` (no change)."""
        key = LeaseKey(namespace, name)
        with _latency("renew").time():
            try:
                outcome, sent_at, sent_wall = await self._rewrite(
                    "renew",
                    key,
                    lambda cur, obs, now: decide.decide_renew(
                        cur, obs, now, lease_id=lease_id, token=token
                    ),
                )
            except StoreUnavailable:
                _renewals("unavailable").inc()
                raise
        result: RenewResult
        match outcome:
            case decide.WritePlan():
                result = decide.renewed(outcome, sent_at, sent_wall, self.skew_seconds)
            case NotHeld():
                result = outcome
            case _:  # pragma: no cover - decide_renew returns nothing else
                raise AssertionError(outcome)
        _renewals(result.kind).inc()
        return result

    async def _release(
        self,
        kind: str,
        key: LeaseKey,
        decide_fn: Callable[[StoredLease | None], decide.WritePlan | Released | NotHeld],
    ) -> ReleaseResult:
        """Release and force-release: counted by kind and outcome (``unavailable`` when it
        raises ``StoreUnavailable``)."""
        with _latency(kind).time():
            try:
                outcome, _, _ = await self._rewrite(kind, key, lambda cur, obs, now: decide_fn(cur))
            except StoreUnavailable:
                _releases(kind, "unavailable").inc()
                raise
        result: ReleaseResult
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                result = Released(
                    record.lease_id, tok, forced=record.ended_by is EndedBy.FORCE_RELEASE
                )
            case Released() | NotHeld():
                result = outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)
        _releases(kind, result.kind).inc()
        return result

    async def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        """End generation ``(lease_id, token)``; a late release of an older one changes nothing."""
        return await self._release(
            "release",
            LeaseKey(namespace, name),
            lambda cur: decide.decide_release(cur, lease_id=lease_id, token=token),
        )

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        """Administrator revoke of generation ``lease_id``.  The old holder is not stopped:
        only a newer token at the resource fences it."""
        return await self._release(
            "force_release",
            LeaseKey(namespace, name),
            lambda cur: decide.decide_force_release(cur, lease_id=lease_id),
        )

    async def expire(self, namespace: str, name: str, lease_id: str | None = None) -> ExpireResult:
        """Mark the held generation expired if this replica's clock says so (else ``Busy``)."""
        with _latency("expire").time():
            outcome, _, _ = await self._rewrite(
                "expire",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_expire(cur, obs, now, lease_id=lease_id),
            )
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                metrics.EXPIRIES.inc()
                return Expired(record.lease_id, tok, record.holder)
            case Busy() | NotHeld():
                return outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)


_Decision = decide.AcquirePlan | decide.WritePlan | Busy | Released | NotHeld
"""What a lease decision returns: a write to make, or the answer that writes nothing."""


@dataclass(frozen=True, slots=True)
class _Written:
    """A lease write committed at ``revision``: the plan decided and the ``record`` written
    (the plan's record with its ``retained`` list)."""

    plan: decide.AcquirePlan | decide.WritePlan
    record: LeaseRecord
    revision: int


def _record_taken(
    record_failure_ops: list[Any],
    response: Any,
    current: StoredLease | None,
    compared: StoredLease | None,
) -> int | None:
    """A transaction that also recorded ``compared``'s token failed: if the lease key is
    still at that version, the token record is what failed (it already exists, so etcd is
    reusing revisions); return that revision, else ``None``."""
    if not record_failure_ops or compared is None or not _same_version(current, compared):
        return None
    kvs = response.responses[1].response_range.kvs
    return compared.mod_revision if kvs else None


def _reused(token: int) -> StoreUnavailable:
    return StoreUnavailable(
        "restore_guard",
        f"token {token} already has a token record of another grant: etcd reuses revisions "
        "(restored from an older snapshot, or keys copied into a new cluster?). Restore with "
        "`etcdutl snapshot restore --bump-revision <N> --mark-compacted` and pass the highest "
        "known token as floor.",
    )
