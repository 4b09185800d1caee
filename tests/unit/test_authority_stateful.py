"""Hypothesis stateful test of the pure authority: random interleavings of acquire, renew,
release, expire, force-release, fence, replica restart and clock advance, across several
clients and two replicas sharing one store.

Invariants (issue 3):
- tokens strictly increase across grants;
- renewal never changes the token;
- at most one holder is within its deadline (except generations revoked by force-release,
  which an administrator ends without the holder's consent);
- a renew/release naming an older generation never changes the store;
- the high-water mark never moves backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fencedlease.authority.memory import MemoryAuthority, MemoryKV
from fencedlease.authority.types import (
    Acquired,
    Busy,
    Expired,
    FenceCode,
    FencingPolicy,
    LeaseKey,
    NotHeld,
    Released,
    Renewed,
)

NS, NAME = "default", "report-july"
KEY = LeaseKey(NS, NAME)
SKEW = 1.0
CLIENTS = st.sampled_from(["c0", "c1", "c2"])
REPLICAS = st.integers(min_value=0, max_value=1)


@dataclass
class Grant:
    holder: str
    lease_id: str
    token: int
    deadline: float
    ended: bool = False
    forced: bool = False


class AuthorityMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.kv = MemoryKV(revision=40)
        self.replicas = [
            MemoryAuthority(self.kv, clock=self.clock, skew_seconds=SKEW) for _ in range(2)
        ]
        self.grants: list[Grant] = []
        self.hwm_seen = 0

    def clock(self) -> float:
        return self.now

    def current(self) -> Grant | None:
        stored = self.kv.leases.get(KEY)
        if stored is None:
            return None
        return next(g for g in self.grants if g.lease_id == stored.record.lease_id)

    # ------------------------------------------------------------------- rules

    @rule(seconds=st.floats(min_value=0.0, max_value=12.0))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(replica=REPLICAS)
    def restart(self, replica: int) -> None:
        self.replicas[replica].restart()

    @rule(client=CLIENTS, replica=REPLICAS, duration=st.sampled_from([2.0, 5.0, 10.0]))
    def acquire(self, client: str, replica: int, duration: float) -> None:
        before = self.kv.leases.get(KEY)
        result = self.replicas[replica].acquire(NS, NAME, client, duration)
        match result:
            case Acquired():
                assert all(result.token > g.token for g in self.grants), "token not increasing"
                for g in self.grants:
                    if not g.ended and not g.forced:
                        # The previous holder's deadline passed before the new grant was sent.
                        assert g.deadline <= self.now, "two unexpired holders"
                assert result.deadline_monotonic == self.now + duration - SKEW
                self.grants.append(
                    Grant(client, result.lease_id, result.token, result.deadline_monotonic)
                )
            case Busy():
                assert self.kv.leases.get(KEY) == before
                assert before is not None and result.token == before.token

    def pick(self, data: st.DataObject, client: str) -> Grant | None:
        mine = [g for g in self.grants if g.holder == client]
        return data.draw(st.sampled_from(mine)) if mine else None

    @precondition(lambda self: bool(self.grants))
    @rule(client=CLIENTS, replica=REPLICAS, data=st.data())
    def renew(self, client: str, replica: int, data: st.DataObject) -> None:
        grant = self.pick(data, client)
        if grant is None:
            return
        before = self.kv.leases.get(KEY)
        is_current = self.current() is grant
        result = self.replicas[replica].renew(NS, NAME, grant.lease_id, grant.token)
        match result:
            case Renewed():
                assert is_current, "renewed a generation that is not current"
                assert (result.token, result.lease_id) == (grant.token, grant.lease_id)
                grant.deadline = result.deadline_monotonic
            case NotHeld():
                assert self.kv.leases.get(KEY) == before, "failed renew changed the store"

    @precondition(lambda self: bool(self.grants))
    @rule(client=CLIENTS, replica=REPLICAS, data=st.data())
    def release(self, client: str, replica: int, data: st.DataObject) -> None:
        grant = self.pick(data, client)
        if grant is None:
            return
        before = self.kv.leases.get(KEY)
        is_current = self.current() is grant
        result = self.replicas[replica].release(NS, NAME, grant.lease_id, grant.token)
        match result:
            case Released(already_released=already):
                assert is_current
                if already:
                    assert self.kv.leases.get(KEY) == before
                grant.ended = True
            case NotHeld():
                assert not is_current
                assert self.kv.leases.get(KEY) == before, "stale release changed the store"

    @precondition(lambda self: bool(self.grants))
    @rule(replica=REPLICAS, data=st.data())
    def force_release(self, replica: int, data: st.DataObject) -> None:
        grant = data.draw(st.sampled_from(self.grants))
        before = self.kv.leases.get(KEY)
        is_current = self.current() is grant
        result = self.replicas[replica].force_release(NS, NAME, grant.lease_id)
        if isinstance(result, Released):
            assert is_current
            grant.forced = True
        else:
            assert isinstance(result, NotHeld) and not is_current
            assert self.kv.leases.get(KEY) == before

    @rule(replica=REPLICAS)
    def expire(self, replica: int) -> None:
        current = self.current()
        result = self.replicas[replica].expire(NS, NAME)
        if isinstance(result, Expired):
            assert current is not None and result.lease_id == current.lease_id
            assert current.deadline <= self.now, "expired before the holder's deadline"
            current.ended = True

    @precondition(lambda self: bool(self.grants))
    @rule(
        data=st.data(),
        replica=REPLICAS,
        policy=st.sampled_from(list(FencingPolicy)),
        op=st.sampled_from([None, "op-1", "op-2"]),
    )
    def fence(
        self, data: st.DataObject, replica: int, policy: FencingPolicy, op: str | None
    ) -> None:
        grant = data.draw(st.sampled_from(self.grants))
        result = self.replicas[replica].fence(NS, NAME, grant.token, policy, op)
        if result.code is FenceCode.APPLIED:
            assert grant.token >= self.hwm_seen
        elif result.code is FenceCode.STALE_FENCE:
            assert grant.token <= self.hwm_seen
        else:
            assert result.code is FenceCode.DUPLICATE and grant.token == self.hwm_seen

    # -------------------------------------------------------------- invariants

    @invariant()
    def at_most_one_unexpired_holder(self) -> None:
        live = [g for g in self.grants if not g.ended and not g.forced and self.now < g.deadline]
        assert len(live) <= 1, live

    @invariant()
    def high_water_mark_never_moves_back(self) -> None:
        hwm = self.kv.hwms.get(KEY)
        token = hwm.token if hwm else 0
        assert token >= self.hwm_seen
        self.hwm_seen = token

    @invariant()
    def record_token_is_its_generations_token(self) -> None:
        stored = self.kv.leases.get(KEY)
        if stored is not None:
            grant = self.current()
            assert grant is not None and stored.token == grant.token


AuthorityMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAuthority = AuthorityMachine.TestCase
