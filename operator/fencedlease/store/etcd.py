"""Thin async etcd adapter: runs the pure decisions of :mod:`fencedlease.authority.lease` and
:mod:`fencedlease.authority.fence` as etcd transactions (client: ``aetcd``, see
``docs/etcd-client.md``).

Layout under the prefix (default ``/fencedlease``)::

    <p>/leases/<ns>/<name>   LeaseRecord JSON   (token null in the acquire write = its mod_revision)
    <p>/tokens/<token>       TokenGrant JSON    (written once per grant; the last K per lease kept)
    <p>/hwm/<ns>/<name>      HighWaterMark JSON (advanced from committed writes)

Retention (:mod:`fencedlease.authority.retention`): the transaction that records a token also
deletes the records that fall off the lease's list of its last K; deleting a lease attaches
its records and its mark to an etcd lease with a time to live shared per time bucket.

Every write is a transaction conditional on the mod_revision that the decision was based on,
so etcd's compare decides races between replicas; a lost race is re-read and re-decided.
Expected outcomes are returned as values; etcd failures become ``Unavailable`` results (or
:class:`~fencedlease.authority.types.StoreUnavailable` from plain queries), never "stale".
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from fencedlease import metrics
from fencedlease.authority import fence as fencing
from fencedlease.authority import lease as decide
from fencedlease.authority import retention as retain
from fencedlease.authority.types import (
    Acquired,
    AcquireResult,
    Busy,
    EndedBy,
    Expired,
    ExpireResult,
    FenceRead,
    Generation,
    HighWaterMark,
    LeaseKey,
    LeaseRecord,
    LeaseView,
    MarkAdvance,
    NotHeld,
    Observation,
    Released,
    ReleaseResult,
    Renewed,
    RenewResult,
    StoredLease,
    StoreUnavailable,
    TokenGrant,
    Unavailable,
)
from fencedlease.settings import Settings
from fencedlease.store import ops
from fencedlease.store.connection import Connection

T = TypeVar("T")


@functools.cache
def _latency(operation: str) -> Any:
    """The latency histogram's child for ``operation`` (looked up once, not per request)."""
    return metrics.STORE_LATENCY.labels(operation)


@functools.cache
def _renewals(result: str) -> Any:
    return metrics.RENEWALS.labels(result)


@functools.cache
def _releases(kind: str, result: str) -> Any:
    return metrics.RELEASES.labels(kind, result)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class EtcdStore:
    """The grant authority on etcd.  One instance per operator replica.

    ``clock`` is this replica's monotonic clock (the time authority); ``wall`` only produces
    the ``valid_until``/``acquired_at`` timestamps handed to Pods and shown in status.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        prefix: str = "/fencedlease",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
        skew_seconds: float = 1.0,
        timeout: float = 5.0,
        ca_file: Path | str | None = None,
        cert_file: Path | str | None = None,
        key_file: Path | str | None = None,
        max_retries: int = 16,
        lease_ids: Callable[[], str] = decide.new_lease_id,
        retention: retain.Retention | None = None,
    ) -> None:
        self._conn = Connection(
            endpoints,
            timeout=timeout,
            tls_files=(ca_file, cert_file, key_file),
            clock=clock,
            on_header=self._see_header,
        )
        self._prefix = prefix.rstrip("/").encode()
        self.clock = clock
        self.wall = wall
        self.skew_seconds = skew_seconds
        self.timeout = timeout
        self._max_retries = max_retries
        self._lease_ids = lease_ids
        self.retention = retention or retain.Retention()
        # The etcd lease of the current deletion bucket: (bucket index, etcd lease id).
        self._bucket_lease: tuple[int, int] | None = None
        self._observations: dict[LeaseKey, Observation] = {}
        # The version of each lease key this replica last read or wrote (``None``: absent).
        # Writes compare on it, so a stale entry only costs the round trip that refreshes it.
        self._known: dict[LeaseKey, StoredLease | None] = {}
        self._lease_keys: dict[LeaseKey, bytes] = {}
        self._max_token_seen = 0
        # The highest header revision etcd returned to this replica: a lower bound of its
        # current revision.  Acquire writes without reading first only while it is at or above
        # every token known (a write then commits above them); reset to -1 when the restore
        # guard refuses, so only etcd's later replies count (docs/tokens.md, "Restore").
        self._head_revision = 0
        self._epoch: str | None = None
        self.contact = self._conn.contact
        """Round trips as this store saw them (liveness, readiness: :mod:`fencedlease.health`)."""

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> EtcdStore:
        """Build from :class:`fencedlease.settings.Settings` (``overrides`` win)."""
        kwargs: dict[str, Any] = {
            "prefix": settings.etcd_prefix,
            "skew_seconds": settings.clock_skew_seconds,
            "timeout": settings.etcd_timeout_seconds,
            "ca_file": settings.etcd_ca_file,
            "cert_file": settings.etcd_cert_file,
            "key_file": settings.etcd_key_file,
            "retention": retain.Retention(
                settings.token_retention_generations, settings.deleted_lease_retention_seconds
            ),
        }
        kwargs.update(overrides)
        return cls(list(settings.etcd_endpoints), **kwargs)

    # ------------------------------------------------------------------ connection

    @property
    def max_token_seen(self) -> int:
        """Highest token this replica issued or read (in-process part of the restore guard)."""
        return self._max_token_seen

    def _see_token(self, token: int) -> None:
        if token > self._max_token_seen:
            self._max_token_seen = token
            metrics.MAX_TOKEN.set(token)

    def _see_header(self, header: Any) -> None:
        revision = int(header.revision)
        if revision > self._head_revision:
            self._head_revision = revision

    async def connect(self) -> None:
        """Open the channel (lazily retried on use; this only fails fast on bad config)."""
        await self._conn.connect()

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def client(self) -> Any:
        """The underlying ``aetcd.Client`` (for tests and maintenance: snapshot, status)."""
        return self._conn.client

    async def _rpc(self, operation: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """One etcd round trip (:meth:`Connection.rpc`)."""
        return await self._conn.rpc(operation, call)

    async def _txn(
        self,
        operation: str,
        compare: list[ops.Cmp],
        success: list[ops.Op],
        failure: list[ops.Op] | None = None,
    ) -> Any:
        """One etcd transaction (:meth:`Connection.txn`): the raw ``TxnResponse``."""
        return await self._conn.txn(operation, compare, success, failure)

    # ------------------------------------------------------------------------ keys

    def _key(self, kind: str, *parts: str) -> bytes:
        for part in parts:
            if not part or "/" in part:
                raise ValueError(f"invalid name segment {part!r}")
        return b"/".join([self._prefix, kind.encode(), *(p.encode() for p in parts)])

    def _lease_key(self, key: LeaseKey) -> bytes:
        raw = self._lease_keys.get(key)
        if raw is None:
            raw = self._lease_keys[key] = self._key("leases", key.namespace, key.name)
        return raw

    def _hwm_key(self, key: LeaseKey) -> bytes:
        return self._key("hwm", key.namespace, key.name)

    def _token_key(self, token: int) -> bytes:
        return self._key("tokens", str(token))

    # ---------------------------------------------------------------- observations

    def _stored(self, kv: Any) -> StoredLease:
        """A lease key as read; ``StoreUnavailable`` (``corrupt``) when its record does not
        parse: a grant, renewal or deletion is refused rather than decided on a guess."""
        with _parsed(kv.key.decode(errors="replace")):
            record = LeaseRecord.from_json(kv.value)
        stored = StoredLease(record, kv.mod_revision)
        self._see_token(stored.token)
        return stored

    def _observe(
        self, key: LeaseKey, current: StoredLease | None
    ) -> tuple[Observation | None, float]:
        """Record what etcd just returned for ``key`` (observation and cache)."""
        now = self.clock()
        obs = decide.observe(self._observations.get(key), current, now)
        if obs is None:
            self._observations.pop(key, None)
        else:
            self._observations[key] = obs
        self._known[key] = current
        return obs, now

    def _wrote(self, key: LeaseKey, record: LeaseRecord, revision: int) -> StoredLease:
        """Our conditional write of ``record`` committed at ``revision``: cache and observe it
        (the observation starts after the reply, as for any other observer)."""
        stored = StoredLease(record, revision)
        self._known[key] = stored
        self._observations[key] = Observation(revision, record.lease_id, self.clock())
        return stored

    def _forget(self, key: LeaseKey) -> None:
        self._known.pop(key, None)
        self._observations.pop(key, None)
        self._lease_keys.pop(key, None)  # a deleted lease's name may never come back

    async def _read_lease(self, operation: str, key: LeaseKey) -> tuple[StoredLease | None, int]:
        """Linearizable read of the record; also returns the header revision."""
        raw = self._lease_key(key)
        response = await self._rpc(operation, lambda c: c.get_range(raw, raw + b"\0"))
        current = self._stored(response[0]) if len(response) else None
        self._see_header(response.header)
        return current, int(response.header.revision)

    def _record_ops(
        self,
        key: LeaseKey,
        version: StoredLease | None,
        record: LeaseRecord,
        taken: int | None = None,
    ) -> tuple[list[ops.Cmp], list[ops.Op], list[ops.Op], LeaseRecord]:
        """Compare/success/failure ops that record the token of ``version`` if it is a grant
        version (``token: null``) about to be rewritten: ``<p>/tokens/<token>`` is written in
        the same transaction that moves the lease key off that version, so a fence check
        always finds the grant, either here or in the lease key (docs/tokens.md).  The same
        transaction deletes the records that fall off the lease's retained list, and the
        returned record (to write instead of ``record``) carries that list."""
        plan = retain.plan_records(version, record, self.retention.generations, taken=taken)
        if plan.token is None:
            return [], [], [], plan.record
        assert version is not None
        raw = self._token_key(plan.token)
        grant = TokenGrant(
            key.namespace,
            key.name,
            version.record.lease_id,
            version.record.holder,
            version.record.holder_uid,
        )
        prune = [ops.delete(self._token_key(t)) for t in plan.pruned]
        return (
            [ops.absent(raw)],
            [ops.put(raw, grant.to_json()), *prune],
            [ops.get(raw)],
            plan.record,
        )

    # ----------------------------------------------------------------------- lease

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
        """Grant a new generation (``Acquired``) or say who holds it (``Busy``) or why not
        (``Unavailable``: etcd error, ``restore_guard``, contention).

        ``token_floor``: the highest token the caller *verified* was issued (lease statuses
        carrying the authority's proof); a grant is refused unless its token is above it.
        ``holder_uid``: the holder Pod's UID, recorded with the grant so that only that Pod
        (not a later one with the same name) can use it.
        """
        with _latency("acquire").time():
            result = await self._acquire(
                LeaseKey(namespace, name), holder, duration_seconds, token_floor, holder_uid
            )
        match result:
            case Acquired(took_over_expired=took_over):
                metrics.GRANTS.inc()
                if took_over:
                    metrics.TAKEOVERS.inc()
                    metrics.EXPIRIES.inc()
            case Busy():
                metrics.ACQUIRE_BUSY.inc()
            case Unavailable(code=code):
                metrics.ACQUIRE_UNAVAILABLE.labels(code).inc()
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

        def guard(revision: int) -> Unavailable | None:
            refusal = decide.rollback_guard(revision, token_floor, seen_before)
            return self._refused(refusal) if refusal is not None else None

        try:
            if decide.rollback_guard(self._head_revision, token_floor, seen_before) is not None:
                # Nothing this replica saw shows etcd above the floor: a write now could
                # commit at a revision already issued as a token.  Read first and refuse
                # without writing: a refused grant that committed and was revoked would still
                # advance etcd's revision, so retries would climb past the floor by
                # themselves, and the refusal would vanish without the administrator's
                # `--bump-revision` restore (tests/unit/test_store_restore_guard.py).
                current, revision = await self._read_lease("acquire", key)
                self._observe(key, current)
                fresh = True
                refusal = guard(revision)
                if refusal is not None:
                    return refusal
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
        except StoreUnavailable as error:
            # The grant may or may not have committed; if it did, nobody was told its token
            # and it expires (or is released) like any other generation.
            return error.as_result()
        if not isinstance(outcome, _Written):
            assert isinstance(outcome, Busy | Unavailable), outcome
            return outcome
        plan, token = outcome.plan, outcome.revision
        assert isinstance(plan, decide.AcquirePlan)
        # The compare held, so the version replaced is the one decided on.
        previous_token = plan.previous.token if plan.previous is not None else None
        refusal = decide.grant_guard(token, token_floor, seen_before, previous_token)
        if refusal is not None:
            self._refused(refusal)
            await self._revoke(key, token)
            return refusal
        self._wrote(key, outcome.record, token)
        self._see_token(token)
        return Acquired(
            lease_id=lease_id,
            token=token,
            holder=holder,
            duration=duration_seconds,
            deadline_monotonic=decide.holder_deadline(sent_at, duration_seconds, self.skew_seconds),
            valid_until=decide.valid_until(sent_wall, duration_seconds, self.skew_seconds),
            acquired_at=sent_wall,
            took_over_expired=plan.took_over_expired,
        )

    def _refused(self, refusal: Unavailable) -> Unavailable:
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
    ) -> tuple[decide.WritePlan | Released | NotHeld | Busy | Unavailable, float, datetime]:
        """Renew, release, force-release and expire: :meth:`_decide_and_write` on the cached
        version (read first when nothing is cached)."""
        sent_at, sent_wall = self.clock(), self.wall()
        try:
            if key in self._known:
                current, fresh = self._known[key], False
            else:
                current, _ = await self._read_lease(operation, key)
                self._observe(key, current)
                fresh = True
            outcome = await self._decide_and_write(operation, key, current, fresh, decide_fn)
        except StoreUnavailable as error:
            return error.as_result(), sent_at, sent_wall
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
        guard: Callable[[int], Unavailable | None] = lambda revision: None,
    ) -> _Written | Busy | Released | NotHeld | Unavailable:
        """The one compare / read-back / re-decide loop of every lease write.

        ``decide_fn`` decides on ``current`` (the cached version unless ``fresh``).  A
        decision that writes nothing is only returned on what etcd says now: from the cache
        it is confirmed by a read first.  A write (``AcquirePlan``/``WritePlan``) is one
        transaction conditional on the version decided on, recording that version's token
        when it is a grant version (:meth:`_record_ops`); its failure branch reads the key
        back, so a lost race or a stale cache costs that same round trip, then the loop
        decides again.  ``guard(revision)`` sees every revision etcd returns (the restore
        guard of acquire).  Returns :class:`_Written` (the caller caches it), the answer
        that writes nothing, or ``Unavailable``; raises ``StoreUnavailable``."""
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
                    return refusal
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
                    return _reused(reused)
                taken = reused
            refusal = guard(int(response.header.revision))
            if refusal is not None:
                return refusal
        return Unavailable("contention", f"lease {key} kept changing while {operation}")

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        """Extend generation ``(lease_id, token)``; anything else is ``NotHeld`` (no change)."""
        key = LeaseKey(namespace, name)
        with _latency("renew").time():
            outcome, sent_at, sent_wall = await self._rewrite(
                "renew",
                key,
                lambda cur, obs, now: decide.decide_renew(
                    cur, obs, now, lease_id=lease_id, token=token
                ),
            )
        result: RenewResult
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                d = record.duration_seconds
                result = Renewed(
                    lease_id=lease_id,
                    token=tok,
                    holder=record.holder,
                    duration=d,
                    deadline_monotonic=decide.holder_deadline(sent_at, d, self.skew_seconds),
                    valid_until=decide.valid_until(sent_wall, d, self.skew_seconds),
                    renewed_at=sent_wall,
                    renewals=record.renewals,
                )
            case NotHeld() | Unavailable():
                result = outcome
            case _:  # pragma: no cover - decide_renew returns nothing else
                raise AssertionError(outcome)
        _renewals(result.kind).inc()
        return result

    def _released(
        self, kind: str, outcome: decide.WritePlan | Released | NotHeld | Busy | Unavailable
    ) -> ReleaseResult:
        result: ReleaseResult
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                result = Released(
                    record.lease_id, tok, forced=record.ended_by is EndedBy.FORCE_RELEASE
                )
            case Released() | NotHeld() | Unavailable():
                result = outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)
        _releases(kind, result.kind).inc()
        return result

    async def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        """End generation ``(lease_id, token)``; a late release of an older one changes nothing."""
        with _latency("release").time():
            outcome, _, _ = await self._rewrite(
                "release",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_release(cur, lease_id=lease_id, token=token),
            )
        return self._released("release", outcome)

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        """Administrator revoke of generation ``lease_id``.  The old holder is not stopped:
        only a newer token at the resource fences it."""
        with _latency("force_release").time():
            outcome, _, _ = await self._rewrite(
                "force_release",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_force_release(cur, lease_id=lease_id),
            )
        return self._released("force_release", outcome)

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
            case Busy() | NotHeld() | Unavailable():
                return outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)

    async def delete(self, namespace: str, name: str) -> None:
        """The FencedLease was deleted: drop its record, and hand its token records and its
        high-water mark to the retention window (docs/tokens.md, "Retention"): they are
        attached to the etcd lease of the current time bucket, stay readable for at least
        ``retention.deleted_window_seconds`` (a re-created lease of the same name keeps
        rejecting old tokens), and then go together.  A grant version's token record is
        written in the deleting transaction, attached to the same etcd lease."""
        key = LeaseKey(namespace, name)
        with _latency("delete").time():
            current = self._known.get(key)
            if current is None:
                current, _ = await self._read_lease("delete", key)
            retried = False
            for _ in range(self._max_retries):
                try:
                    done, current = await self._delete_once(key, current)
                except StoreUnavailable:
                    # The bucket's etcd lease may be gone (revoked, or etcd restored): grant
                    # a new one and try once more.
                    if self._bucket_lease is None or retried:
                        raise
                    self._bucket_lease, retried = None, True
                    continue
                if done:
                    break
            else:
                raise StoreUnavailable("contention", f"lease {key} kept changing while deleting")
        self._forget(key)

    async def _delete_once(
        self, key: LeaseKey, current: StoredLease | None
    ) -> tuple[bool, StoredLease | None]:
        """Read the mark and the retained records of version ``current``, then delete the
        lease key and re-attach them, conditional on both keys being unchanged.  ``(False,
        what is there now)`` when something changed meanwhile."""
        raw, hwm_raw = self._lease_key(key), self._hwm_key(key)
        tokens = retain.deleted_tokens(current) if current is not None else ()
        found = await self._txn(
            "delete",
            [],
            [ops.get(raw), ops.get(hwm_raw), *(ops.get(self._token_key(t)) for t in tokens)],
        )
        lease_kv, hwm_kv, *token_kvs = (ops.range_kv(r) for r in found.responses)
        now = self._stored(lease_kv) if lease_kv is not None else None
        if not (now is None and current is None) and not _same_version(now, current):
            return False, now
        if current is None and hwm_kv is None:
            return True, None
        window = await self._window_lease()
        compare = [
            ops.mod_is(raw, current.mod_revision) if current is not None else ops.absent(raw),
            ops.mod_is(hwm_raw, hwm_kv.mod_revision) if hwm_kv is not None else ops.absent(hwm_raw),
        ]
        success: list[ops.Op] = [ops.delete(raw)] if current is not None else []
        for token, kv in zip(tokens, token_kvs, strict=True):
            if kv is not None:
                if (
                    current is not None
                    and current.record.token is None
                    and (token == current.mod_revision)
                ):
                    continue  # a record of an older grant at this revision: leave it alone
                success.append(ops.put_leased(kv.key, kv.value, window))
            elif (
                current is not None
                and current.record.token is None
                and (token == current.mod_revision)
            ):
                record = current.record
                grant = TokenGrant(
                    key.namespace, key.name, record.lease_id, record.holder, record.holder_uid
                )
                token_raw = self._token_key(token)
                compare.append(ops.absent(token_raw))
                success.append(ops.put_leased(token_raw, grant.to_json(), window))
        if hwm_kv is not None:
            success.append(ops.put_leased(hwm_raw, hwm_kv.value, window))
        response = await self._txn("delete", compare, success, [ops.get(raw)])
        if response.succeeded:
            return True, None
        kv = ops.range_kv(response.responses[0])
        return False, (self._stored(kv) if kv is not None else None)

    async def sweep_legacy(
        self,
        *,
        page: int = 500,
        pause: Callable[[int], Awaitable[None]] | None = None,
        progress: Callable[[retain.SweepReport], None] | None = None,
    ) -> retain.SweepReport:
        """Apply the retention rule to token records and marks written before it existed
        (docs/tokens.md, "Retention"): one pass over ``<p>/tokens/`` and ``<p>/hwm/``, in
        pages of ``page`` keys, deciding each key with :func:`retain.sweep_token` /
        :func:`retain.sweep_mark` on its lease key as read after the page.

        Every deletion is conditional on the key and its lease key being the versions the
        decision read (``mod_revision``, or absence), so a concurrent grant, recording or
        deletion wins and the key waits for the next sweep (counted as ``changed``).
        ``pause(deleted)`` is awaited after each page (pacing: the sweep shares etcd with
        grants and fence checks); ``progress`` gets the running totals after each page.

        Raises :class:`StoreUnavailable` on etcd errors (the totals so far are lost; a
        sweep starts over harmlessly: it only deletes what the rule says)."""
        report = retain.SweepReport()
        # The lease keys with token records left after the token pass: their marks stay
        # (pruning a mark while a record of its lease stays could admit that token).
        survivors: set[bytes] = set()
        for kind in ("tokens", "hwm"):
            prefix = self._key(kind) + b"/"
            start, end = prefix, ops.prefix_end(prefix)
            while True:
                scan = ops.scan(start, end, limit=page)
                found = (await self._txn("sweep", [], [scan])).responses[0].response_range
                kvs = list(found.kvs)
                if not kvs:
                    break
                deleted = await self._sweep_page(kind, kvs, report, survivors)
                if progress is not None:
                    progress(report)
                if not found.more:
                    break
                start = kvs[-1].key + b"\0"
                if pause is not None:
                    await pause(deleted)
        return report

    async def _sweep_page(
        self, kind: str, kvs: list[Any], report: retain.SweepReport, survivors: set[bytes]
    ) -> int:
        """Decide and delete one page of ``kind`` keys; the number deleted.  Token pages add
        the lease keys whose records stay to ``survivors``; mark pages consult it."""
        owners: dict[bytes, bytes] = {}  # key -> its lease key
        for kv in kvs:
            report.scanned += 1
            try:
                if kind == "tokens":
                    _token_of_key(kv.key)
                    grant = TokenGrant.from_json(kv.value)
                    namespace, name = grant.namespace, grant.name
                else:
                    namespace, name = kv.key.decode().rsplit("/", 2)[-2:]
                owners[kv.key] = self._key("leases", namespace, name)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                report.malformed += 1  # not ours to judge: left alone
        leases = sorted(set(owners.values()))
        versions: dict[bytes, Any | None] = {}
        for some in ops.chunks(leases, _SWEEP_CHUNK):
            read = await self._txn("sweep", [], [ops.get(raw) for raw in some])
            for raw, r in zip(some, read.responses, strict=True):
                versions[raw] = ops.range_kv(r)
        doomed: dict[bytes, list[Any]] = {}
        for kv in kvs:
            owner = owners.get(kv.key)
            if owner is None:
                continue
            lease_kv = versions[owner]
            if kind == "tokens":
                try:
                    lease = self._stored(lease_kv) if lease_kv is not None else None
                except StoreUnavailable:
                    report.malformed += 1  # a lease record we cannot read: judge nothing
                    survivors.add(owner)
                    continue
                token = _token_of_key(kv.key)
                verdict = retain.sweep_token(
                    token, kv.lease != 0, lease, self.retention.generations
                )
            else:
                verdict = retain.sweep_mark(kv.lease != 0, lease_kv is not None, owner in survivors)
            if verdict is retain.Sweep.PRUNE:
                doomed.setdefault(owner, []).append(kv)
            else:
                report.kept += 1
                if kind == "tokens":
                    survivors.add(owner)
        deleted = 0
        for owner, doomed_kvs in doomed.items():
            lease_kv = versions[owner]
            guard = (
                ops.mod_is(owner, lease_kv.mod_revision)
                if lease_kv is not None
                else ops.absent(owner)
            )
            for chunk in ops.chunks(doomed_kvs, _SWEEP_CHUNK):
                response = await self._txn(
                    "sweep",
                    [guard, *(ops.mod_is(kv.key, kv.mod_revision) for kv in chunk)],
                    [ops.delete(kv.key) for kv in chunk],
                )
                if response.succeeded:
                    report.pruned += len(chunk)
                    deleted += len(chunk)
                else:
                    report.changed += len(chunk)
                    if kind == "tokens":
                        survivors.add(owner)
        return deleted

    async def _window_lease(self) -> int:
        """The etcd lease that the deletions of the current time bucket attach their keys
        to, granted by the first of them (one extra round trip per bucket and replica)."""
        b = retain.bucket(self.clock(), self.retention.deleted_window_seconds)
        if self._bucket_lease is not None and self._bucket_lease[0] == b.index:
            return self._bucket_lease[1]
        self._bucket_lease = (b.index, await self._conn.grant_lease("delete", b.ttl_seconds))
        return self._bucket_lease[1]

    async def read(self, namespace: str, name: str) -> LeaseView | None:
        """The record, its token and this replica's expiry verdict (``None``: no record)."""
        key = LeaseKey(namespace, name)
        with _latency("read").time():
            current, revision = await self._read_lease("read", key)
        obs, now = self._observe(key, current)
        if current is None:
            return None
        return LeaseView(
            record=current.record,
            mod_revision=current.mod_revision,
            token=current.token,
            expired=decide.is_expired(current, obs, now),
            remaining_seconds=decide.remaining_seconds(current, obs, now),
            header_revision=revision,
        )

    async def current_revision(self) -> int:
        """etcd's current revision (linearizable read of the response header)."""
        probe = self._key("revision")
        with _latency("read").time():
            response = await self._rpc("read", lambda c: c.get_range(probe, probe + b"\0"))
        self._see_header(response.header)
        return int(response.header.revision)

    # --------------------------------------------------------------------- fencing

    def _grant_from(
        self, token: int, token_kv: Any | None, lease_kv: Any | None
    ) -> TokenGrant | None:
        """What ``token`` was issued for, from its token record or, while the lease key is
        still at the grant's own version (``token: null`` and mod_revision == token), from
        the lease record itself."""
        if token_kv is not None:
            return TokenGrant.from_json(token_kv.value)
        if lease_kv is None or lease_kv.mod_revision != token:
            return None
        record = LeaseRecord.from_json(lease_kv.value)
        if record.token is not None:
            return None
        namespace, name = lease_kv.key.rsplit(b"/", 2)[-2:]
        return TokenGrant(
            namespace.decode(), name.decode(), record.lease_id, record.holder, record.holder_uid
        )

    async def _find_grant(self, token: int) -> TokenGrant | None:
        """``token``'s grant in any lease, one transaction: its token record, or the lease key
        whose current version is that grant (a range over the lease keys filtered by
        mod_revision: a scan, so only for refusals and queries, never the accepting path)."""
        token_raw, leases = self._token_key(token), self._key("leases") + b"/"
        scan = ops.scan(
            leases, ops.prefix_end(leases), min_mod_revision=token, max_mod_revision=token
        )
        response = await self._txn("fence", [], [ops.get(token_raw), scan])
        token_kv = ops.range_kv(response.responses[0])
        for lease_kv in response.responses[1].response_range.kvs:
            grant = self._grant_from(token, token_kv, lease_kv)
            if grant is not None:
                return grant
        return self._grant_from(token, token_kv, None)

    async def high_water_mark(self, namespace: str, name: str) -> HighWaterMark | None:
        """The fencing domain's high-water mark (``None``: nothing accepted yet).

        Raises :class:`StoreUnavailable` on etcd errors (as do the other plain queries)."""
        raw = self._hwm_key(LeaseKey(namespace, name))
        with _latency("read").time():
            found = await self._rpc("read", lambda c: c.get(raw))
        if found is None:
            return None
        with _parsed(LeaseKey(namespace, name)):
            return HighWaterMark.from_json(found.value)

    async def epoch(self) -> str:
        """The lease service's epoch for metric labels: etcd's cluster id (hex), read once.

        A restored or replaced etcd cluster shows up as a new value next to the old ones.
        """
        if self._epoch is None:
            probe = self._key("revision")
            try:
                response = await self._rpc("read", lambda c: c.get_range(probe, probe + b"\0"))
                self._epoch = format(int(response.header.cluster_id), "x")
            except StoreUnavailable:
                return "unknown"
        return self._epoch

    async def _grant_and_mark(
        self, token: int, domain: LeaseKey
    ) -> tuple[FenceRead, Any | None, Any | None]:
        """The token's grant, the domain's mark and its current generation (one transaction),
        with the mark's and the lease key's raw key-values (``record_commit`` compares on the
        mark and keeps its etcd lease).

        The grant is the token record, or the domain's lease key while it is still at the
        grant's own version (its token record is written when that version is replaced).
        Only a token issued for no visible grant of this domain costs a second round trip,
        which tells ``lease_mismatch`` from ``unknown_token``.  A record that does not parse
        raises ``StoreUnavailable`` (``corrupt``): it is never skipped, nor trusted."""
        token_raw, hwm_raw = self._token_key(token), self._hwm_key(domain)
        # Not ``_lease_key``: its cache is for the leases this replica renews, and the names
        # asked about here come from admission requests.
        lease_raw = self._key("leases", domain.namespace, domain.name)
        response = await self._txn(
            "fence", [], [ops.get(token_raw), ops.get(hwm_raw), ops.get(lease_raw)]
        )
        token_kv, hwm_kv, lease_kv = (ops.range_kv(r) for r in response.responses)
        with _parsed(domain):
            grant = self._grant_from(token, token_kv, lease_kv)
            if grant is None:
                grant = await self._find_grant(token)
            hwm = HighWaterMark.from_json(hwm_kv.value) if hwm_kv is not None else None
            generation = Generation(
                LeaseRecord.from_json(lease_kv.value).token_at(lease_kv.mod_revision)
                if lease_kv is not None
                else None
            )
        return FenceRead(grant, hwm, generation), hwm_kv, lease_kv

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        """What ``token`` was issued for, lease ``namespace/name``'s high-water mark and its
        current generation, read in one etcd transaction (the admission webhook's only store
        call).

        Raises :class:`StoreUnavailable` on etcd errors and on records that do not parse."""
        with _latency("fence").time():
            read, _, _ = await self._grant_and_mark(token, LeaseKey(namespace, name))
        return read

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        """A write carrying ``token`` was committed to an artifact of lease ``namespace/name``
        (the controller saw it stored): advance the domain's high-water mark to cover it.

        Only a token issued for this lease moves the mark (an artifact written while the
        webhook was bypassed is reported, not trusted).  Idempotent; never moves backwards.
        While the lease key is gone (the lease was deleted: its records and mark are in the
        retention window), the advanced mark is attached to the window as well, never written
        back permanent: a permanent mark without its lease would be pruned by the legacy
        sweep while the deleted lease's records stay (docs/tokens.md, "Retention").
        Raises :class:`StoreUnavailable` on etcd errors.
        """
        domain = LeaseKey(namespace, name)
        hwm_raw = self._hwm_key(domain)
        with _latency("record_commit").time():
            for _ in range(self._max_retries):
                read, hwm_kv, lease_kv = await self._grant_and_mark(token, domain)
                grant, hwm = read.grant, read.mark
                current = hwm.token if hwm else None
                refusal = fencing.check_grant(grant, domain)
                if refusal is not None:
                    with _parsed(domain):
                        retained = (
                            LeaseRecord.from_json(lease_kv.value).retained if lease_kv else ()
                        )
                    retired = retain.retired(
                        grant is not None, token, current, retained, self.retention.generations
                    )
                    return MarkAdvance(token, current, False, verified=False, retired=retired)
                new_hwm = fencing.committed(hwm, token)
                if new_hwm is None:
                    return MarkAdvance(token, current, advanced=False, verified=True)
                revision = hwm_kv.mod_revision if hwm_kv is not None else None
                window = await self._window_lease() if lease_kv is None else None
                try:
                    if await self._advance(hwm_raw, revision, new_hwm, window):
                        return MarkAdvance(token, token, advanced=True, verified=True)
                except StoreUnavailable:
                    # The bucket's etcd lease may be gone (revoked, etcd restored): grant a
                    # new one next round, as ``delete`` does.
                    if window is None or self._bucket_lease is None:
                        raise
                    self._bucket_lease = None
        raise StoreUnavailable("contention", f"high-water mark of {domain} kept changing")

    async def _advance(
        self, raw: bytes, expected: int | None, new_hwm: HighWaterMark, window: int | None = None
    ) -> bool:
        """Write ``new_hwm`` if the mark is still at ``expected``; attached to etcd lease
        ``window`` when given (the deleted-lease retention window), else permanent."""
        guard = ops.absent(raw) if expected is None else ops.mod_is(raw, expected)
        value = new_hwm.to_json()
        put = ops.put(raw, value) if window is None else ops.put_leased(raw, value, window)
        response = await self._txn("fence", [guard], [put])
        return bool(response.succeeded)


_SWEEP_CHUNK = 64
"""Keys per sweep transaction (etcd refuses more than ``--max-txn-ops``, 128 by default)."""


@contextlib.contextmanager
def _parsed(domain: LeaseKey | str) -> Iterator[None]:
    """Records of ``domain`` that do not parse are neither skipped nor trusted: the caller
    gets ``StoreUnavailable`` (``corrupt``), so a fence check refuses and a commit is retried."""
    try:
        yield
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise StoreUnavailable(
            "corrupt", f"a stored record of {domain} does not parse: {error!r}"
        ) from error


def _token_of_key(key: bytes) -> int:
    """The token of a ``<p>/tokens/<token>`` key: ASCII digits only (``int`` would also read
    ``+7``, ``7_5`` or other scripts' digits as a token); ``ValueError`` otherwise."""
    last = key.rsplit(b"/", 1)[-1]
    if not last.isdigit() or not last.isascii():
        raise ValueError(f"not a token key: {key!r}")
    return int(last)


_Decision = decide.AcquirePlan | decide.WritePlan | Busy | Released | NotHeld
"""What a lease decision returns: a write to make, or the answer that writes nothing."""


@dataclass(frozen=True, slots=True)
class _Written:
    """A lease write committed at ``revision``: the plan decided and the ``record`` written
    (the plan's record with its ``retained`` list)."""

    plan: decide.AcquirePlan | decide.WritePlan
    record: LeaseRecord
    revision: int


def _same_version(a: StoredLease | None, b: StoredLease | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.mod_revision == b.mod_revision
        and a.record.lease_id == b.record.lease_id
    )


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


def _reused(token: int) -> Unavailable:
    return Unavailable(
        "restore_guard",
        f"token {token} already has a token record of another grant: etcd reuses revisions "
        "(restored from an older snapshot, or keys copied into a new cluster?). Restore with "
        "`etcdutl snapshot restore --bump-revision <N> --mark-compacted` and pass the highest "
        "known token as floor.",
    )
