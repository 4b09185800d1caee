"""The article's decisive test, on the pure logic: barriers and a fake clock, never sleeps.

A acquires report/july (token 41), stages its output and pauses right before publishing.  The
lease expires on the fake coordinator clock, B acquires (token 43: the article's 42, but tokens
are etcd revisions and A's token record took revision 42) and publishes.  A resumes
and tries to publish: the catalog answers ``stale_fence`` and B's pointer stays visible.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fencedlease.authority.memory import MemoryAuthority, MemoryKV
from fencedlease.authority.types import (
    Acquired,
    Busy,
    FenceCode,
    FenceResult,
    FencingPolicy,
    LeaseKey,
    LeaseState,
    NotHeld,
)
from tests.fakes import FakeClock

NS, LEASE = "default", "report-july"


@dataclass
class Catalog:
    """The protected resource: a fenced pointer to an immutable object (the article's table)."""

    authority: MemoryAuthority
    visible: str | None = None
    history: list[str] = field(default_factory=list)

    def publish(self, token: int, object_key: str, operation_id: str) -> FenceResult:
        # Check and write are one step (no await in between): the atomic compare-and-apply.
        result = self.authority.fence(NS, LEASE, token, FencingPolicy.ALLOW_EQUAL, operation_id)
        if result.code is FenceCode.APPLIED:
            self.visible = object_key
            self.history.append(object_key)
        return result


def make(start_revision: int = 40) -> tuple[FakeClock, MemoryKV, MemoryAuthority, Catalog]:
    clock = FakeClock()
    kv = MemoryKV(revision=start_revision)
    authority = MemoryAuthority(kv, clock=clock, skew_seconds=1.0)
    return clock, kv, authority, Catalog(authority)


async def test_paused_writer_gets_stale_fence_and_newer_result_stays() -> None:
    clock, kv, authority, catalog = make()
    a_paused, a_resume, b_published = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def worker_a() -> tuple[Acquired, FenceResult]:
        grant = authority.acquire(NS, LEASE, "worker-a", 10.0)
        assert isinstance(grant, Acquired)
        staged = f"reports/july/{grant.lease_id}.tmp"  # immutable, not yet visible
        a_paused.set()
        await a_resume.wait()  # the GC pause / suspended VM
        return grant, catalog.publish(grant.token, staged, "publish-a")

    async def worker_b() -> Acquired:
        await a_paused.wait()
        busy = authority.acquire(NS, LEASE, "worker-b", 10.0)
        assert isinstance(busy, Busy) and busy.holder == "worker-a"
        clock.advance(10.0)  # A missed its renewals: the lease expires on the coordinator clock
        grant = authority.acquire(NS, LEASE, "worker-b", 10.0)
        assert isinstance(grant, Acquired)
        published = catalog.publish(grant.token, f"reports/july/{grant.lease_id}.tmp", "pub-b")
        assert published.code is FenceCode.APPLIED
        b_published.set()
        return grant

    task_a = asyncio.create_task(worker_a())
    task_b = asyncio.create_task(worker_b())
    await b_published.wait()
    grant_b = await task_b
    a_resume.set()
    grant_a, result_a = await task_a

    assert (grant_a.token, grant_b.token) == (41, 43)
    assert result_a.code is FenceCode.STALE_FENCE
    assert result_a.message == (
        "stale_fence: token 41 is below the high-water mark 43 of lease default/report-july"
    )
    assert catalog.visible == f"reports/july/{grant_b.lease_id}.tmp"
    assert catalog.history == [catalog.visible]
    # A's late release names its own generation: it must not release B.
    late = authority.release(NS, LEASE, grant_a.lease_id, grant_a.token)
    assert isinstance(late, NotHeld) and late.current_lease_id == grant_b.lease_id
    record = kv.leases[LeaseKey(NS, LEASE)]
    assert record.record.lease_id == grant_b.lease_id and record.record.state is LeaseState.HELD
    # The stale result is definitive: retrying under the same grant stays stale.
    assert catalog.publish(grant_a.token, "again", "publish-a-retry").code is FenceCode.STALE_FENCE
    hwm = authority.high_water_mark(NS, LEASE)
    assert hwm is not None and hwm.token == 43


async def test_delayed_request_is_rejected_after_newer_publish() -> None:
    """Same race as a delayed network request: A's publish is delivered after B's."""
    clock, _, authority, catalog = make()
    grant_a = authority.acquire(NS, LEASE, "worker-a", 5.0)
    assert isinstance(grant_a, Acquired)
    in_flight: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    await in_flight.put((grant_a.token, "a.tmp"))  # sent, not delivered
    clock.advance(5.0)
    grant_b = authority.acquire(NS, LEASE, "worker-b", 5.0)
    assert isinstance(grant_b, Acquired) and grant_b.token > grant_a.token
    assert catalog.publish(grant_b.token, "b.tmp", "b").code is FenceCode.APPLIED
    token, key = await in_flight.get()
    assert catalog.publish(token, key, "a").code is FenceCode.STALE_FENCE
    assert catalog.visible == "b.tmp"


async def test_same_token_retry_is_duplicate_not_second_apply() -> None:
    _, _, authority, catalog = make()
    grant = authority.acquire(NS, LEASE, "worker-a", 5.0)
    assert isinstance(grant, Acquired)
    assert catalog.publish(grant.token, "v1", "op-1").code is FenceCode.APPLIED
    assert catalog.publish(grant.token, "v2", "op-2").code is FenceCode.APPLIED
    # op-1 re-delivered late (reordered retry): must not move the pointer back to v1.
    assert catalog.publish(grant.token, "v1", "op-1").code is FenceCode.DUPLICATE
    assert catalog.visible == "v2"


async def test_restarted_replica_waits_a_full_duration_before_takeover() -> None:
    clock, kv, first, _ = make()
    grant = first.acquire(NS, LEASE, "worker-a", 10.0)
    assert isinstance(grant, Acquired)
    clock.advance(9.0)
    second = MemoryAuthority(kv, clock=clock)  # a replica that never saw the grant
    clock.advance(2.0)  # expired for `first`, but `second` only just observed it
    assert isinstance(second.acquire(NS, LEASE, "worker-b", 10.0), Busy)
    clock.advance(10.0)
    taken = second.acquire(NS, LEASE, "worker-b", 10.0)
    assert isinstance(taken, Acquired) and taken.took_over_expired
    assert taken.token > grant.token
    # Holder deadline of A came before any observer's expiry.
    assert grant.deadline_monotonic < 1000.0 + 10.0


async def test_deleting_the_lease_keeps_the_high_water_mark() -> None:
    _, _, authority, catalog = make()
    grant = authority.acquire(NS, LEASE, "worker-a", 5.0)
    assert isinstance(grant, Acquired)
    assert catalog.publish(grant.token, "v1", "op").code is FenceCode.APPLIED
    authority.delete(NS, LEASE)
    again = authority.acquire(NS, LEASE, "worker-b", 5.0)
    assert isinstance(again, Acquired) and again.token > grant.token
    hwm = authority.high_water_mark(NS, LEASE)
    assert hwm is not None and hwm.token == grant.token
    assert catalog.publish(grant.token - 1, "forged", "x").code is FenceCode.UNKNOWN_TOKEN
