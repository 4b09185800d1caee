"""Each write's outcome once: the pure rule (fake clock) and the checker's counting.

The API server re-runs admission for one write (a stale watch-cache copy, a conflict in
storage); ``fence_results_total`` and the denial Events must follow the write, not the calls.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencedlease import metrics
from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.events import ObjectRef
from fencedlease.webhook import reviews
from fencedlease.webhook.checker import FenceChecker
from fencedlease.webhook.outcomes import Ruling, WriteId, WriteOutcomes, content_digest
from tests.fakes import FakeClock

from .reviews import answer, art, commit, grant, review

W = WriteId("ns", "cat", "update", "pod-a", 7, "op-1", content_digest({"a": 1}))
V = WriteId("ns", "cat", "update", "pod-b", 8, "op-2", content_digest({"a": 2}))


def test_a_denial_counts_at_once_and_its_re_run_does_not() -> None:
    clock = FakeClock()
    w: WriteOutcomes[str] = WriteOutcomes(clock, window=5)
    assert w.observe(W, Ruling.DENIED, "stale#1") == ["stale#1"]
    clock.advance(0.01)
    assert w.observe(W, Ruling.DENIED, "stale#2") == []  # the re-run on the current object
    clock.advance(5)
    assert w.due() == [] and w.observe(W, Ruling.DENIED, "stale#3") == ["stale#3"]  # a new write


def test_an_admission_waits_until_its_write_is_quiet_and_the_last_call_wins() -> None:
    clock = FakeClock()
    w: WriteOutcomes[str] = WriteOutcomes(clock, window=5)
    assert w.observe(W, Ruling.ALLOWED, "applied#1") == []
    clock.advance(1)
    assert w.observe(W, Ruling.ALLOWED, "applied#2") == []  # a conflict in storage: re-run
    clock.advance(4.9)
    assert w.due() == [] and w.pending == 1
    clock.advance(0.1)
    assert w.due() == ["applied#2"] and w.pending == 0


def test_an_admission_re_run_into_a_denial_counts_the_denial_only() -> None:
    clock = FakeClock()
    w: WriteOutcomes[str] = WriteOutcomes(clock, window=5)
    w.observe(W, Ruling.ALLOWED, "applied")
    assert w.observe(W, Ruling.DENIED, "stale") == ["stale"]  # another writer won the race
    clock.advance(10)
    assert w.due() == []


def test_a_write_that_cannot_commit_counts_nothing() -> None:
    clock = FakeClock()
    w: WriteOutcomes[str] = WriteOutcomes(clock, window=5)
    w.observe(W, Ruling.ALLOWED, "applied")  # admitted on a stale copy
    assert w.observe(W, Ruling.VOID, "void") == []  # the precondition fails on the current one
    clock.advance(10)
    assert w.due() == [] and w.flush() == []


def test_writes_are_told_apart_and_state_is_bounded() -> None:
    clock = FakeClock()
    w: WriteOutcomes[str] = WriteOutcomes(clock, window=5, max_writes=1)
    w.observe(W, Ruling.ALLOWED, "w")
    assert w.observe(V, Ruling.ALLOWED, "v") == ["w"]  # the oldest is settled early
    assert w.flush() == ["v"] and w.pending == 0
    with pytest.raises(ValueError, match="window"):
        WriteOutcomes(clock, window=0)


# ------------------------------------------------------------------- the checker's counting


def results(result: str, operation: str = "update") -> float:
    return metrics.fence_results_total(result, operation)


def checks(result: str, operation: str = "update") -> float:
    return metrics.counter_total(metrics.FENCE_CHECKS, result=result, operation=operation)


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref.name, reason, message))


def make_checker(store: AsyncMemoryStore, clock: FakeClock) -> tuple[FenceChecker, RecordingSink]:
    async def lookup(namespace: str, name: str) -> str | None:
        return "AllowEqual"

    sink = RecordingSink()
    c = FenceChecker(
        store,
        lookup,
        sink,
        writers=reviews.AllowedWriters.parse(["admin"]),
        clock=clock,
        outcome_window=5,
    )
    return c, sink


def stored(token: int, rv: str, op: str | None = None) -> dict[str, Any]:
    body = art(token, op=op, rv=rv)
    body["metadata"]["uid"] = "uid-1"
    return body


async def test_re_runs_of_one_stale_write_count_once_with_one_event() -> None:
    store = AsyncMemoryStore()
    a, b = grant(store, "pod-a"), grant(store, "pod-b")
    commit(store, b)
    clock = FakeClock()
    c, sink = make_checker(store, clock)
    before, calls = results("stale_fence"), checks("stale_fence")
    # The API server tries the PATCH on its cached copy, then on the current object.
    for old_rv in ("10", "11"):
        ok, _ = answer(await c.review(review("UPDATE", art(a, op="x"), stored(b, old_rv))))
        assert not ok
    await c.events.drain()
    assert checks("stale_fence") == calls + 2
    assert results("stale_fence") == before + 1
    assert [reason for _, reason, _ in sink.events] == ["FenceStaleFence"]


async def test_an_admitted_write_re_run_after_a_conflict_counts_once_when_settled() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    clock = FakeClock()
    c, sink = make_checker(store, clock)
    before, calls = results("applied"), checks("applied")
    for rv in ("10", "11"):  # lost a race in storage (someone touched metadata): re-run
        ok, _ = answer(await c.review(review("UPDATE", art(a, obj="v2", rv=rv), stored(a, rv))))
        assert ok
    assert checks("applied") == calls + 2
    assert results("applied") == before  # not final yet
    clock.advance(5)
    await c.settle_due()
    assert results("applied") == before + 1
    assert sink.events == []  # accepted fences are evented by the controller


async def test_an_admission_overtaken_by_a_newer_write_counts_as_the_stale_the_client_saw() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    clock = FakeClock()
    c, sink = make_checker(store, clock)
    applied, stale = results("applied"), results("stale_fence")
    # pod-a's write is admitted on the object at token a; pod-b's write commits first ...
    assert answer(await c.review(review("UPDATE", art(a, obj="mine", rv="10"), stored(a, "10"))))[0]
    b = grant(store, "pod-b")
    commit(store, b)
    # ... so the API server re-runs pod-a's write on pod-b's object: stale.
    assert not answer(
        await c.review(review("UPDATE", art(a, obj="mine", rv="11"), stored(b, "11")))
    )[0]
    await c.stop()  # settles everything pending
    assert results("applied") == applied and results("stale_fence") == stale + 1
    assert [reason for _, reason, _ in sink.events] == ["FenceStaleFence"]


async def test_a_precondition_failure_is_no_fence_result() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    clock = FakeClock()
    c, _ = make_checker(store, clock)
    applied = results("applied")
    # a PUT at resourceVersion 10: admitted on a cached copy at 10, re-run on the current 11
    assert answer(await c.review(review("UPDATE", art(a, obj="v2", rv="10"), stored(a, "10"))))[0]
    await c.review(review("UPDATE", art(a, obj="v2", rv="10"), stored(a, "11")))
    await c.stop()
    assert results("applied") == applied  # the client saw 409 Conflict


async def test_two_writes_are_two_outcomes_and_dry_runs_none() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    c, _ = make_checker(store, FakeClock())
    applied, calls = results("applied"), checks("applied")
    assert answer(await c.review(review("UPDATE", art(a, obj="v2", rv="10"), stored(a, "10"))))[0]
    assert answer(await c.review(review("UPDATE", art(a, obj="v3", rv="11"), stored(a, "11"))))[0]
    await c.review(review("UPDATE", art(a, obj="v4", rv="12"), stored(a, "12"), dry_run=True))
    await c.stop()
    assert results("applied") == applied + 2 and checks("applied") == calls + 2


class _EpochNeverAnswers(AsyncMemoryStore):
    """The fence read answers; the epoch read (a metric label only) never does."""

    async def epoch(self) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover


async def test_counting_never_turns_a_denial_into_unavailable() -> None:
    """The outcome's counting waited for the store's epoch inside the check's own timeout:
    a slow epoch read turned a final ``stale_fence`` into a 503 (retry later), and the
    denial was neither counted nor evented."""
    store = _EpochNeverAnswers()
    a, b = grant(store, "pod-a"), grant(store, "pod-b")
    commit(store, b)
    sink = RecordingSink()

    async def lookup(namespace: str, name: str) -> str | None:
        return "AllowEqual"

    c = FenceChecker(
        store, lookup, sink, writers=reviews.AllowedWriters.parse(["admin"]), timeout=0.05
    )
    before = metrics.counter_total(metrics.FENCE_RESULTS, result="stale_fence", epoch="unknown")
    async with asyncio.timeout(5):  # bounded: a regression fails, never hangs
        ok, msg = answer(await c.review(review("UPDATE", art(a, op="x"), stored(b, "10"))))
        await c.events.drain()
    assert not ok and msg.startswith("stale_fence"), msg
    assert metrics.counter_total(metrics.FENCE_RESULTS, result="stale_fence", epoch="unknown") == (
        before + 1
    )
    assert [reason for _, reason, _ in sink.events] == ["FenceStaleFence"]
