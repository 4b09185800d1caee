"""Through the real kube-apiserver: a flood of stale writes on one artifact is one Event with
a growing count (the rest rate limited and counted as dropped), and under concurrent writers
``fence_results_total`` counts each write once, as its client saw it, although the API server
re-runs admission (``fence_checks_total`` counts those calls)."""

from __future__ import annotations

import asyncio
import time

import pytest

from fencedlease import metrics
from fencedlease.authority.correlation import BURST, REFILL_SECONDS

from .fence_harness import FenceHarness, Outcome, artifact, publish

pytestmark = pytest.mark.integration


def results(result: str) -> float:
    return metrics.fence_results_total(result, "update")


def checks(result: str) -> float:
    return metrics.counter_total(metrics.FENCE_CHECKS, result=result, operation="update")


IN_FLIGHT = 8
"""Stale writes of the flood in flight at once."""


def dropped() -> float:
    return metrics.counter_total(metrics.EVENTS_DROPPED, reason="FenceStaleFence")


async def test_a_flood_of_stale_writes_is_one_event_with_a_growing_count(
    fence: FenceHarness,
) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "flood")
    old = await fence.grant(ns, "flood", "worker-old")
    new = await fence.grant(ns, "flood", "worker-new")
    first = await publish(fence.custom, artifact(ns, "cat", "flood", new.token, "new.tmp"))
    assert first.ok, first.message
    await fence.accepted(ns, "cat", new.token)
    stale_before, dropped_before, calls_before = (
        results("stale_fence"),
        dropped(),
        checks("stale_fence"),
    )

    # Past the per-object burst, all queued at once but at most IN_FLIGHT at a time: the
    # first IN_FLIGHT start together (the race of the first Event's creation is still run),
    # and on a loaded machine no write waits behind 74 others past the webhook's deadline
    # (it would be refused as a failed webhook call, not observed as stale). The flood
    # lasts seconds, far under the bucket's refill (REFILL_SECONDS), so what is counted
    # past the burst is dropped either way.
    writers = 3 * BURST
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def late(i: int) -> Outcome:
        async with slots:
            return await publish(
                fence.custom, artifact(ns, "cat", "flood", old.token, f"late-{i}.tmp")
            )

    started = time.monotonic()
    outcomes = await asyncio.gather(*(late(i) for i in range(writers)))
    assert time.monotonic() - started < REFILL_SECONDS  # no token came back mid-flood
    observed = sum(1 for o in outcomes if not o.ok and "stale_fence" in o.message)
    assert observed == writers, [o.message for o in outcomes if o.ok or "stale" not in o.message]
    await fence.server.checker.settle()
    await fence.server.checker.events.drain()

    events = [e for e in await fence.events_for(ns, "cat") if e["reason"] == "FenceStaleFence"]
    counted = sum(e["count"] for e in events)
    lost = dropped() - dropped_before
    assert len(events) == 1, events  # one message: one Event, PATCHed
    assert events[0]["count"] == BURST and events[0]["series"]["count"] == BURST
    assert counted + lost == observed
    assert results("stale_fence") - stale_before == observed  # each write once
    assert checks("stale_fence") - calls_before >= observed  # the API server's calls


async def test_concurrent_writers_are_counted_as_their_clients_saw(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "race")
    grants = [await fence.grant(ns, "race", "worker-0")]
    first = await publish(fence.custom, artifact(ns, "cat", "race", grants[0].token, "0.tmp"))
    assert first.ok, first.message
    await fence.accepted(ns, "cat", grants[0].token)
    grants += [await fence.grant(ns, "race", f"worker-{i}") for i in range(1, 30)]
    before = {r: results(r) for r in ("applied", "stale_fence")}
    calls = sum(checks(r) for r in ("applied", "stale_fence"))

    # Every writer holds a token (the superseded generations' and, ten times, the current
    # one); all PATCH the one artifact at once (no precondition: the API server retries lost
    # races itself, re-running admission on the winner's object).
    tokens = [g.token for g in grants[1:]] + [grants[-1].token] * 10
    outcomes = await asyncio.gather(
        *(
            publish(fence.custom, artifact(ns, "cat", "race", token, f"{token}-{i}.tmp"))
            for i, token in enumerate(tokens)
        )
    )
    applied = sum(1 for o in outcomes if o.ok)
    stale = sum(1 for o in outcomes if not o.ok and "stale_fence" in o.message)
    assert applied + stale == len(outcomes), [o.message for o in outcomes if not o.ok]
    assert applied >= 1
    await fence.server.checker.settle()  # the clients have their answers: nothing re-runs

    assert results("applied") - before["applied"] == applied
    assert results("stale_fence") - before["stale_fence"] == stale
    made = sum(checks(r) for r in ("applied", "stale_fence")) - calls
    assert made >= len(outcomes)
    print(f"\n{len(outcomes)} writes: {applied} applied, {stale} stale; {made} admission calls")
