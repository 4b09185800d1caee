"""KubeEvents: one Event created, then patched; failures and floods counted as dropped.

The core/v1 API is a recording fake; the correlator runs on a fake clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.authority.correlation import EventCorrelator
from fencedlease.events import KubeEvents, artifact_ref
from fencedlease.webhook.events import BackgroundEvents
from tests.fakes import FakeClock

REF = artifact_ref("ns", "cat", "uid-1")


class FakeCore:
    """Records creates and patches; ``fail`` makes the next call raise; ``gate`` holds
    creates until set (a barrier)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail: list[ApiException] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise self.fail.pop()
        self.created.append(body)

    async def patch_namespaced_event(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        if self.fail:
            raise self.fail.pop()
        self.patched.append((name, body))


def sink(clock: FakeClock, **limits: Any) -> tuple[KubeEvents, FakeCore]:
    events = KubeEvents(object(), correlator=EventCorrelator(clock, **limits))  # type: ignore[arg-type]
    core = FakeCore()
    events.core = core  # type: ignore[assignment]  # the fake core/v1 API
    return events, core


def dropped(cause: str, reason: str = "FenceStaleFence") -> float:
    return metrics.counter_total(metrics.EVENTS_DROPPED, reason=reason, cause=cause)


async def test_one_event_is_created_then_patched_with_a_growing_count() -> None:
    clock = FakeClock(now=1_780_000_000.0)
    events, core = sink(clock)
    for _ in range(3):
        await events.event(REF, "Warning", "FenceStaleFence", "stale_fence: token 5")
        clock.advance(2)
    (created,) = core.created
    assert created["count"] == 1 and "series" not in created
    assert created["involvedObject"]["uid"] == "uid-1"
    name = created["metadata"]["name"]
    assert [(n, p["count"], p["series"]["count"]) for n, p in core.patched] == [
        (name, 2, 2),
        (name, 3, 3),
    ]
    assert core.patched[-1][1]["lastTimestamp"] == "2026-05-28T20:26:44Z"
    assert core.patched[-1][1]["series"]["lastObservedTime"].endswith(".000000Z")


async def test_a_patched_event_that_is_gone_is_created_again_with_the_count() -> None:
    events, core = sink(FakeClock(now=1_780_000_000.0))
    await events.event(REF, "Warning", "FenceStaleFence", "m")
    core.fail.append(ApiException(status=404))  # the API server's event TTL deleted it
    await events.event(REF, "Warning", "FenceStaleFence", "m")
    assert [c["count"] for c in core.created] == [1, 2]
    assert core.created[1]["series"]["count"] == 2
    await events.event(REF, "Warning", "FenceStaleFence", "m")
    assert core.patched[-1][0] == core.created[1]["metadata"]["name"]


async def test_an_api_error_is_a_dropped_observation_not_a_count() -> None:
    events, core = sink(FakeClock(now=1_780_000_000.0))
    before = dropped("api_error")
    core.fail.append(ApiException(status=500))
    await events.event(REF, "Warning", "FenceStaleFence", "m")  # never raises
    assert dropped("api_error") == before + 1 and core.created == []
    await events.event(REF, "Warning", "FenceStaleFence", "m")
    assert [c["count"] for c in core.created] == [1]


async def test_a_flood_is_rate_limited_and_the_drops_are_counted() -> None:
    events, core = sink(FakeClock(now=1_780_000_000.0), burst=25, refill_seconds=300)
    before = dropped("rate_limited")
    for _ in range(296):
        await events.event(REF, "Warning", "FenceStaleFence", "m")
    assert len(core.created) == 1 and core.patched[-1][1]["count"] == 25
    assert dropped("rate_limited") == before + 271


async def test_concurrent_observations_wait_for_the_create() -> None:
    events, core = sink(FakeClock(now=1_780_000_000.0))
    core.gate = asyncio.Event()
    first = asyncio.create_task(events.event(REF, "Warning", "FenceStaleFence", "m"))
    await asyncio.wait_for(core.entered.wait(), 5)  # the create is in flight
    second = asyncio.create_task(events.event(REF, "Warning", "FenceStaleFence", "m"))
    await asyncio.sleep(0)  # let the second reach the lock
    assert core.patched == [] and len(events._locks) == 1
    core.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert len(core.created) == 1 and [p["count"] for _, p in core.patched] == [2]
    assert events._locks == {}  # forgotten once nobody waits


async def test_the_webhooks_queue_drops_and_counts_when_full() -> None:
    events, core = sink(FakeClock(now=1_780_000_000.0))
    core.gate = asyncio.Event()
    background = BackgroundEvents(events, max_in_flight=2)
    before = dropped("queue_full")
    for _ in range(5):
        background.emit(REF, "Warning", "FenceStaleFence", "m")
    assert dropped("queue_full") == before + 3
    core.gate.set()
    await background.drain()
    assert [c["count"] for c in core.created] == [1] and core.patched[-1][1]["count"] == 2


async def test_uncorrelated_events_are_one_object_each() -> None:
    events = KubeEvents(object(), correlate=False, wall=lambda: 1_780_000_000.0)  # type: ignore[arg-type]
    core = FakeCore()
    events.core = core  # type: ignore[assignment]
    for _ in range(30):  # the controller's lifecycle Events: no rate limit, no aggregation
        await events.event(REF, "Normal", "Granted", "granted")
    assert len(core.created) == 30 and {c["count"] for c in core.created} == {1}
    assert core.patched == []
