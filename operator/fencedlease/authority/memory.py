"""In-memory reference authority: the pure decisions run against a dict instead of etcd.

It mirrors :class:`fencedlease.store.etcd.EtcdStore` operation by operation (synchronously),
with an injected clock, so the decision logic can be tested exhaustively (Hypothesis, the
decisive paused-writer test) and the operator can be unit-tested without etcd.  Several
:class:`MemoryAuthority` objects sharing one :class:`MemoryKV` model several operator
replicas: each keeps its own observations, the compare-and-put decides.

Model simplification: lease-record and token-record writes consume a revision here (as in
etcd), high-water-mark writes do not.  Token records are written at the grant (etcd writes them
when the grant's version is replaced), and the retention rule
(:mod:`fencedlease.authority.retention`) is applied to that list: a lease keeps the records of
its last ``generations`` grants, the current one included, and a deleted lease's records and
mark stay until the retention window of its deletion bucket ends (on the replica's clock).  The
etcd store keeps at least as much (one more generation until the new grant's version is
replaced), so every token the model knows, etcd knows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fencedlease.authority import decide
from fencedlease.authority import fence as fencing
from fencedlease.authority import retention as retain
from fencedlease.authority.types import (
    AcquireResult,
    Busy,
    Expired,
    ExpireResult,
    FenceRead,
    FenceResult,
    FencingPolicy,
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
    RenewResult,
    StoredLease,
    StoreUnavailable,
    TokenGrant,
)


@dataclass
class MemoryKV:
    """The shared state (what etcd holds): records, token grants and high-water marks."""

    revision: int = 0
    leases: dict[LeaseKey, StoredLease] = field(default_factory=dict)
    grants: dict[int, TokenGrant] = field(default_factory=dict)
    hwms: dict[LeaseKey, HighWaterMark] = field(default_factory=dict)
    retention: retain.Retention = field(default_factory=retain.Retention)
    expiring: dict[int | LeaseKey, float] = field(default_factory=dict)
    """Token records (by token) and marks (by lease) of deleted leases: when they go."""

    def purge(self, now: float) -> None:
        """Drop what a deleted lease left once its retention window ended (etcd's TTL)."""
        for item, deadline in list(self.expiring.items()):
            if deadline <= now:
                del self.expiring[item]
                if isinstance(item, LeaseKey):
                    self.hwms.pop(item, None)
                else:
                    self.grants.pop(item, None)

    def put_hwm(self, key: LeaseKey, hwm: HighWaterMark, now: float) -> None:
        """A mark written again belongs to the live lease (a put detaches it in etcd); while
        the lease is deleted it stays in the retention window, now no sooner than a deletion
        would attach it (``EtcdStore.record_commit``)."""
        self.hwms[key] = hwm
        if key in self.leases:
            self.expiring.pop(key, None)
        else:
            until = retain.expires_at(now, self.retention.deleted_window_seconds)
            self.expiring[key] = max(self.expiring.get(key, until), until)

    def compare_and_put(
        self, key: LeaseKey, expected_mod_revision: int | None, record: LeaseRecord
    ) -> int | None:
        """Put iff the key is at ``expected_mod_revision`` (``None``: absent); new revision."""
        current = self.leases.get(key)
        if (current.mod_revision if current else None) != expected_mod_revision:
            return None
        self.revision += 1
        self.leases[key] = StoredLease(record, self.revision)
        return self.revision

    def delete(self, key: LeaseKey) -> None:
        if self.leases.pop(key, None) is not None:
            self.revision += 1


def _utc_now() -> datetime:
    return datetime.now(UTC)


class MemoryAuthority:
    """One replica's view of a :class:`MemoryKV` (same semantics as the etcd store)."""

    def __init__(
        self,
        kv: MemoryKV,
        *,
        clock: Callable[[], float],
        wall: Callable[[], datetime] = _utc_now,
        skew_seconds: float = 1.0,
        lease_ids: Callable[[], str] = decide.new_lease_id,
    ) -> None:
        self.kv = kv
        self.clock = clock
        self.wall = wall
        self.skew_seconds = skew_seconds
        self._lease_ids = lease_ids
        self._observations: dict[LeaseKey, Observation] = {}
        self.max_token_seen = 0

    def restart(self) -> None:
        """Forget all observations, as a restarted replica would (it then waits a duration)."""
        self._observations.clear()

    def _read(self, key: LeaseKey) -> tuple[StoredLease | None, Observation | None, float]:
        now = self.clock()
        self.kv.purge(now)
        current = self.kv.leases.get(key)
        obs = decide.observe(self._observations.get(key), current, now)
        if obs is None:
            self._observations.pop(key, None)
        else:
            self._observations[key] = obs
        return current, obs, now

    def _observe_write(self, key: LeaseKey, revision: int, lease_id: str) -> None:
        self._observations[key] = Observation(revision, lease_id, self.clock())

    def read(self, namespace: str, name: str) -> LeaseView | None:
        current, obs, now = self._read(LeaseKey(namespace, name))
        if current is None:
            return None
        return decide.view(current, obs, now, self.kv.revision)

    def acquire(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration_seconds: float,
        *,
        token_floor: int = 0,
        holder_uid: str | None = None,
    ) -> AcquireResult:
        key = LeaseKey(namespace, name)
        sent_at, sent_wall = self.clock(), self.wall()
        refusal = decide.restore_guard(self.kv.revision, token_floor, self.max_token_seen)
        if refusal is not None:
            raise refusal
        current, obs, now = self._read(key)
        plan = decide.decide_acquire(
            current,
            obs,
            now,
            holder=holder,
            duration_seconds=duration_seconds,
            lease_id=self._lease_ids(),
            holder_uid=holder_uid,
        )
        if isinstance(plan, Busy):
            return plan
        token = self.kv.compare_and_put(key, plan.expected_mod_revision, plan.record)
        if token is None:  # pragma: no cover - cannot happen synchronously
            raise StoreUnavailable("contention", "lease changed while acquiring")
        if token in self.kv.grants:
            raise StoreUnavailable("restore_guard", f"token {token} was already issued")
        self.kv.grants[token] = TokenGrant(
            namespace, name, plan.record.lease_id, holder, holder_uid
        )
        self.kv.revision += 1  # the token record is a write too (as in etcd)
        previous = plan.previous.record.retained if plan.previous is not None else ()
        kept, pruned = retain.retain(previous, token, self.kv.retention.generations)
        for old in pruned:
            self.kv.grants.pop(old, None)
        self.kv.leases[key] = StoredLease(plan.record.with_retained(kept), token)
        self.max_token_seen = max(self.max_token_seen, token)
        self._observe_write(key, token, plan.record.lease_id)
        return decide.acquired(plan, token, sent_at, sent_wall, self.skew_seconds)

    def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        key = LeaseKey(namespace, name)
        sent_at, sent_wall = self.clock(), self.wall()
        current, obs, now = self._read(key)
        plan = decide.decide_renew(current, obs, now, lease_id=lease_id, token=token)
        if isinstance(plan, NotHeld):
            return plan
        revision = self.kv.compare_and_put(key, plan.expected_mod_revision, plan.record)
        if revision is None:  # pragma: no cover
            raise StoreUnavailable("contention", "lease changed while renewing")
        self._observe_write(key, revision, lease_id)
        return decide.renewed(plan, sent_at, sent_wall, self.skew_seconds)

    def _finish(self, key: LeaseKey, plan: decide.WritePlan | Released | NotHeld) -> ReleaseResult:
        if isinstance(plan, Released | NotHeld):
            return plan
        revision = self.kv.compare_and_put(key, plan.expected_mod_revision, plan.record)
        if revision is None:  # pragma: no cover
            raise StoreUnavailable("contention", "lease changed while releasing")
        self._observe_write(key, revision, plan.record.lease_id)
        return Released(
            plan.record.lease_id, plan.token, forced=plan.record.ended_by == "force_release"
        )

    def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        key = LeaseKey(namespace, name)
        current, _, _ = self._read(key)
        return self._finish(key, decide.decide_release(current, lease_id=lease_id, token=token))

    def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        key = LeaseKey(namespace, name)
        current, _, _ = self._read(key)
        return self._finish(key, decide.decide_force_release(current, lease_id=lease_id))

    def expire(self, namespace: str, name: str, lease_id: str | None = None) -> ExpireResult:
        key = LeaseKey(namespace, name)
        current, obs, now = self._read(key)
        plan = decide.decide_expire(current, obs, now, lease_id=lease_id)
        if isinstance(plan, Busy | NotHeld):
            return plan
        revision = self.kv.compare_and_put(key, plan.expected_mod_revision, plan.record)
        if revision is None:  # pragma: no cover
            raise StoreUnavailable("contention", "lease changed while expiring")
        self._observe_write(key, revision, plan.record.lease_id)
        return Expired(plan.record.lease_id, plan.token, plan.record.holder)

    def delete(self, namespace: str, name: str) -> None:
        """Forget the lease record; never the token grants or the high-water mark."""
        key = LeaseKey(namespace, name)
        now = self.clock()
        self.kv.purge(now)
        current = self.kv.leases.get(key)
        until = retain.expires_at(now, self.kv.retention.deleted_window_seconds)
        for token in current.record.retained if current is not None else ():
            if token in self.kv.grants:
                self.kv.expiring[token] = until
        if key in self.kv.hwms:
            self.kv.expiring[key] = until
        self.kv.delete(key)
        self._observations.pop(key, None)

    def fence(
        self,
        namespace: str,
        name: str,
        token: int,
        policy: FencingPolicy = FencingPolicy.ALLOW_EQUAL,
        operation_id: str | None = None,
        *,
        holder: str | None = None,
        holder_uid: str | None = None,
        dry_run: bool = False,
    ) -> FenceResult:
        domain = LeaseKey(namespace, name)
        self.kv.purge(self.clock())
        result, new_hwm = fencing.evaluate(
            domain,
            self.kv.grants.get(token),
            self.kv.hwms.get(domain),
            token,
            policy,
            operation_id=operation_id,
            holder=holder,
            holder_uid=holder_uid,
        )
        if new_hwm is not None and not dry_run:
            self.kv.put_hwm(domain, new_hwm, self.clock())
        return result

    def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        """The token's grant, the domain's mark and current generation (the webhook's read)."""
        self.kv.purge(self.clock())
        key = LeaseKey(namespace, name)
        lease = self.kv.leases.get(key)
        generation = Generation(lease.token if lease is not None else None)
        return FenceRead(self.kv.grants.get(token), self.kv.hwms.get(key), generation)

    def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        """A write with ``token`` committed: advance the mark (see ``EtcdStore.record_commit``)."""
        domain = LeaseKey(namespace, name)
        self.kv.purge(self.clock())
        hwm = self.kv.hwms.get(domain)
        current = hwm.token if hwm else None
        grant = self.kv.grants.get(token)
        if fencing.check_grant(grant, domain) is not None:
            lease = self.kv.leases.get(domain)
            retired = retain.retired(
                grant is not None,
                token,
                current,
                lease.record.retained if lease is not None else (),
                self.kv.retention.generations,
            )
            return MarkAdvance(token, current, False, verified=False, retired=retired)
        new_hwm = fencing.committed(hwm, token)
        if new_hwm is None:
            return MarkAdvance(token, current, advanced=False, verified=True)
        self.kv.put_hwm(domain, new_hwm, self.clock())
        return MarkAdvance(token, token, advanced=True, verified=True)

    def high_water_mark(self, namespace: str, name: str) -> HighWaterMark | None:
        self.kv.purge(self.clock())
        return self.kv.hwms.get(LeaseKey(namespace, name))


class AsyncMemoryStore:
    """:class:`MemoryAuthority` behind the async interface of the etcd store.

    The one in-memory store for unit tests of everything that talks to the grant authority
    (reconciler, artifact recorder, webhook checker).  ``fail = True`` makes every call behave
    as the etcd store does when etcd is unreachable: queries raise
    :class:`~fencedlease.authority.types.StoreUnavailable`, decisions too.
    """

    def __init__(
        self,
        auth: MemoryAuthority | None = None,
        *,
        clock: Callable[[], float] = lambda: 0.0,
        wall: Callable[[], datetime] = _utc_now,
        revision: int = 40,
    ) -> None:
        self.auth = auth or MemoryAuthority(MemoryKV(revision=revision), clock=clock, wall=wall)
        self.fail = False

    def _query(self) -> None:
        if self.fail:
            raise StoreUnavailable("etcd_error", "etcd is down")

    async def read(self, namespace: str, name: str) -> LeaseView | None:
        self._query()
        return self.auth.read(namespace, name)

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
        self._query()
        return self.auth.acquire(
            namespace,
            name,
            holder,
            duration_seconds,
            token_floor=token_floor,
            holder_uid=holder_uid,
        )

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        self._query()
        return self.auth.renew(namespace, name, lease_id, token)

    async def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        self._query()
        return self.auth.release(namespace, name, lease_id, token)

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        self._query()
        return self.auth.force_release(namespace, name, lease_id)

    async def expire(self, namespace: str, name: str, lease_id: str | None = None) -> ExpireResult:
        self._query()
        return self.auth.expire(namespace, name, lease_id)

    async def delete(self, namespace: str, name: str) -> None:
        self._query()
        self.auth.delete(namespace, name)

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        self._query()
        return self.auth.grant_and_mark(namespace, name, token)

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        self._query()
        return self.auth.record_commit(namespace, name, token)

    async def epoch(self) -> str:
        return "memory"
