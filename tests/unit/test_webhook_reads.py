"""Concurrent fence checks of one token share etcd reads, and never one that is too old."""

from __future__ import annotations

import asyncio

import pytest

from fencedlease.authority.types import (
    FenceRead,
    Generation,
    HighWaterMark,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.webhook.reads import CoalescedReads


class GatedStore:
    """Each ``grant_and_mark`` call waits for its own gate and answers the mark it was given
    when it *started* (so a test can tell which read answered which review)."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str, int]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.mark = 1
        self.fail: Exception | None = None

    async def epoch(self) -> str:
        return "e"

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        self.started.append((namespace, name, token))
        mark = self.mark
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        await gate
        if self.fail is not None:
            raise self.fail
        return FenceRead(
            TokenGrant(namespace, name, "id", "pod"), HighWaterMark(mark), Generation(7)
        )

    def open(self, index: int) -> None:
        self.gates[index].set_result(None)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_idle_review_reads_at_once() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    task = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    assert store.started == [("ns", "l", 7)]
    store.open(0)
    read = await task
    assert read.grant is not None and read.mark == HighWaterMark(1)


async def test_reviews_arriving_during_a_read_share_the_next_read_not_that_one() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    first = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    store.mark = 2  # the mark advanced after the first read started
    later = [asyncio.create_task(reads.grant_and_mark("ns", "l", 7)) for _ in range(5)]
    await settle()
    assert len(store.started) == 1  # they wait: the running read is too old for them
    store.open(0)
    assert (await first).mark == HighWaterMark(1)
    await settle()
    assert len(store.started) == 2  # one more read, for all five
    store.open(1)
    for task in later:
        assert (await task).mark == HighWaterMark(2)  # they saw the advanced mark
    assert reads.reads == 2 and reads.shared == 5


async def test_other_tokens_and_leases_read_on_their_own() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    tasks = [
        asyncio.create_task(reads.grant_and_mark(ns, lease, token))
        for ns, lease, token in (("ns", "l", 7), ("ns", "l", 8), ("ns", "m", 7), ("o", "l", 7))
    ]
    await settle()
    assert len(store.started) == 4
    for i in range(4):
        store.open(i)
    await asyncio.gather(*tasks)


async def test_a_failed_read_fails_every_review_waiting_for_it() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    first = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    waiting = [asyncio.create_task(reads.grant_and_mark("ns", "l", 7)) for _ in range(3)]
    await settle()
    store.open(0)
    await first
    await settle()
    store.fail = StoreUnavailable("timeout", "etcd did not answer")
    store.open(1)
    for task in waiting:
        with pytest.raises(StoreUnavailable):
            await task
    # The next review reads again (nothing is cached).
    store.fail = None
    again = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    store.open(2)
    assert (await again).grant is not None


async def test_a_review_that_gives_up_does_not_cancel_the_shared_read() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    first = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    a = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    b = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    store.open(0)
    await first
    await settle()
    a.cancel()  # its timeout
    await settle()
    store.open(1)
    assert (await b).mark == HighWaterMark(1)
    with pytest.raises(asyncio.CancelledError):
        await a


async def test_close_cancels_running_reads_and_their_waiters() -> None:
    store = GatedStore()
    reads = CoalescedReads(store)
    first = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    second = asyncio.create_task(reads.grant_and_mark("ns", "l", 7))
    await settle()
    await reads.close()
    for task in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert len(store.started) == 1
