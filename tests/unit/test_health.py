"""Liveness and readiness decisions (fencedlease.health) with a fake clock, each reason, and the
observations the parts record (scheduler progress, the watch loops)."""

from __future__ import annotations

import asyncio

import pytest

from fencedlease import health
from fencedlease.controller.scheduler import Scheduler
from fencedlease.health import (
    Bounds,
    EtcdContact,
    SchedulerProgress,
    WatchActivity,
    etcd_unreachable,
    liveness,
    readiness,
    scheduler_stuck,
    watches_silent,
)
from fencedlease.watching import ListWatch, Watched

BOUNDS = Bounds(scheduler_stall=60, watch_grace=60, etcd_liveness=120, etcd_readiness=10)


# ------------------------------------------------------------------------------- etcd


def test_etcd_quiet_is_not_unreachable() -> None:
    contact = EtcdContact(since=0)
    assert etcd_unreachable(contact, 10_000, 120) is None
    contact.succeeded(5)
    assert etcd_unreachable(contact, 10_000, 120) is None  # no failure: idle, not broken


def test_etcd_failing_past_the_bound_since_the_last_success() -> None:
    contact = EtcdContact(since=0)
    contact.succeeded(100)
    contact.failed(101, "read: connection refused")
    assert etcd_unreachable(contact, 220, 120) is None  # 120 s since the success: not past
    reason = etcd_unreachable(contact, 221, 120)
    assert reason is not None
    assert "121.0s" in reason and "connection refused" in reason


def test_etcd_a_success_after_failures_clears_it() -> None:
    contact = EtcdContact(since=0)
    contact.failed(10, "x")
    assert etcd_unreachable(contact, 500, 120) is not None
    contact.succeeded(501)
    assert etcd_unreachable(contact, 501, 120) is None


def test_etcd_never_reached_counts_from_the_start() -> None:
    contact = EtcdContact(since=50)
    contact.failed(51, "connect")
    assert etcd_unreachable(contact, 170, 120) is None
    assert etcd_unreachable(contact, 171, 120) is not None


# -------------------------------------------------------------------------- scheduler


def test_scheduler_idle_or_progressing_is_not_stuck() -> None:
    assert scheduler_stuck(SchedulerProgress("leases", None, 0), 10_000, 60) is None
    # a backlog waiting for an hour, but runs keep finishing: capacity, not a hang
    assert scheduler_stuck(SchedulerProgress("leases", 0, 3_590), 3_600, 60) is None
    # idle for an hour, work due a moment ago: not stuck yet
    assert scheduler_stuck(SchedulerProgress("leases", 3_595, 0), 3_600, 60) is None


def test_scheduler_due_work_and_no_run_past_the_bound_is_stuck() -> None:
    reason = scheduler_stuck(SchedulerProgress("artifacts", 100, 90), 161, 60)
    assert reason is not None
    assert reason.startswith("scheduler artifacts:") and "61.0s" in reason


async def test_scheduler_reports_progress_with_a_fake_clock() -> None:
    now = [0.0]
    release = asyncio.Event()
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def work(key: str) -> float | None:
        started[key].set()
        await release.wait()
        return None

    scheduler: Scheduler[str] = Scheduler(work, concurrency=1, clock=lambda: now[0])
    runner = asyncio.create_task(scheduler.run())
    try:
        assert scheduler.progress("leases").waiting_since is None
        scheduler.poke("a")
        scheduler.poke("b")
        async with asyncio.timeout(5):
            await started["a"].wait()
        now[0] = 100.0  # "a" hangs, "b" has been due since 0
        progress = scheduler.progress("leases")
        assert progress == SchedulerProgress("leases", 0.0, 0.0)
        assert scheduler_stuck(progress, now[0], 60) is not None
        release.set()
        async with asyncio.timeout(5):
            await started["b"].wait()  # dispatched: nothing is waiting any more
        assert scheduler.progress("leases") == SchedulerProgress("leases", None, 100.0)
        assert scheduler_stuck(scheduler.progress("leases"), now[0], 60) is None
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner


# ---------------------------------------------------------------------------- watches


def test_watch_silent_past_its_timeout_and_grace() -> None:
    activity = WatchActivity(timeout=330)
    activity.saw("pods", 0)
    activity.saw("fencedleases", 300)
    assert watches_silent(activity, 390, 60) == []
    assert watches_silent(activity, 391, 60) == ["watch pods: silent for 391.0s (bound 390s)"]


async def test_the_watch_loops_are_observed() -> None:
    """Every request, event, bookmark and ending of a list-watch loop is a sign of life: a
    loop that keeps failing shows it, one wedged in a silent stream does not."""
    from tests.unit.test_pod_watch import FakeApi, lines, pod_list, run_until_exhausted

    now = [10.0]
    activity = WatchActivity(timeout=330)
    seen: list[float] = []

    def saw() -> None:
        activity.saw("pods", now[0])
        seen.append(now[0])
        now[0] += 1

    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}}
    fake = FakeApi(
        lists=[ConnectionError("refused"), pod_list("10")],
        streams=[lines(bookmark, {"type": "ADDED", "object": {"metadata": {"name": "a"}}})],
    )
    loop = ListWatch(
        fake, Watched("", "v1", "pods"), lambda e: None, on_activity=saw, pause=lambda n: 0.0
    )
    await run_until_exhausted(loop, fake)
    # refused list (asked, failed), list (asked, done), watch (asked, bookmark, event, end),
    # the next watch (asked; it never answers: silent from here on)
    assert len(seen) == 9
    assert activity.last == {"pods": seen[-1]}
    assert health.watches_silent(activity, seen[-1] + 330 + 61, 60) == [
        "watch pods: silent for 391.0s (bound 390s)"
    ]


# --------------------------------------------------------------------------- verdicts


def test_liveness_collects_every_reason() -> None:
    contact = EtcdContact(since=0)
    contact.failed(1, "read: refused")
    watches = WatchActivity(timeout=330)
    watches.saw("pods", 0)
    verdict = liveness(
        1_000,
        BOUNDS,
        schedulers=[SchedulerProgress("leases", 0, 0), SchedulerProgress("artifacts", None, 0)],
        watches=watches,
        etcd=contact,
    )
    assert not verdict.ok
    assert [r.split(":")[0] for r in verdict.reasons] == ["scheduler leases", "watch pods", "etcd"]
    assert verdict.as_json()["status"] == "failing"
    assert liveness(1_000, BOUNDS) == health.Health(True)


def test_readiness_of_the_webhook_is_its_ability_to_decide() -> None:
    contact = EtcdContact(since=0)
    assert readiness(0, BOUNDS, started=False).reasons == ("starting",)
    assert readiness(0, BOUNDS, started=True, etcd=contact, webhook_serving=True).ok
    assert not readiness(0, BOUNDS, started=True, etcd=contact, webhook_serving=False).ok
    contact.succeeded(100)
    contact.failed(105, "read: refused")
    assert readiness(110, BOUNDS, started=True, etcd=contact, webhook_serving=True).ok
    late = readiness(111, BOUNDS, started=True, etcd=contact, webhook_serving=True)
    assert not late.ok and late.reasons[0].startswith("etcd:")
    # a controller-only process does not answer admission: etcd is its liveness only
    assert readiness(111, BOUNDS, started=True, etcd=contact).ok


# ------------------------------------------------------------------- the endpoints (app)


async def test_endpoints_answer_ok_or_the_reasons_as_json() -> None:
    from aiohttp.test_utils import TestClient, TestServer
    from aiohttp.web import Application

    from fencedlease.app import Probes, _health_routes

    now = [0.0]
    ready = asyncio.Event()
    contact = EtcdContact(since=0)
    probes = Probes(BOUNDS, ready, contact, clock=lambda: now[0])
    app = Application()
    app.add_routes(_health_routes(probes))
    async with TestClient(TestServer(app)) as client:
        live = await client.get("/healthz")
        assert (live.status, await live.text()) == (200, "ok")
        starting = await client.get("/readyz")
        assert starting.status == 503
        assert await starting.json() == {"status": "failing", "reasons": ["starting"]}
        ready.set()
        assert (await client.get("/readyz")).status == 200

        contact.failed(1, "read: refused")
        now[0] = 200.0
        dead = await client.get("/healthz")
        assert dead.status == 500
        (reason,) = (await dead.json())["reasons"]
        assert reason.startswith("etcd: no successful round trip for 200.0s")
        verbose = await (await client.get("/healthz?verbose")).json()
        assert verbose["etcd"] == {
            "lastSuccessAgo": None,
            "lastFailureAgo": 199.0,
            "lastError": "read: refused",
        }
        assert (await client.get("/readyz")).status == 200  # no webhook: etcd is liveness only


class FakeStore:
    """What :func:`fencedlease.app.probe_etcd` uses of the store."""

    def __init__(self, now: list[float], error: Exception | None) -> None:
        self.now = now
        self.error = error
        self.contact = EtcdContact(since=0)
        self.read = asyncio.Event()

    def clock(self) -> float:
        return self.now[0]

    async def current_revision(self) -> int:
        self.read.set()
        if self.error is not None:
            raise self.error
        self.contact.succeeded(self.now[0])
        return 1


@pytest.mark.parametrize("error", [None, RuntimeError("not a StoreUnavailable")])
async def test_the_idle_probe_reads_etcd_and_records_what_the_store_did_not(
    error: Exception | None,
) -> None:
    from fencedlease.app import probe_etcd

    now = [10.0]
    store = FakeStore(now, error)
    task = asyncio.create_task(probe_etcd(store, every=0.02, bound=1.0))  # type: ignore[arg-type]
    try:
        async with asyncio.timeout(5):
            await store.read.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    if error is None:
        assert store.contact.last_success == 10.0 and store.contact.last_failure is None
    else:
        assert store.contact.last_failure == 10.0
        assert "not a StoreUnavailable" in store.contact.error


def test_a_process_told_to_stop_is_not_ready_while_it_drains() -> None:
    serving = health.readiness(0.0, BOUNDS, started=True, webhook_serving=True)
    draining = health.readiness(0.0, BOUNDS, started=True, webhook_serving=True, stopping=True)
    assert serving.ok
    assert not draining.ok and draining.reasons == ("stopping: draining before exit",)
