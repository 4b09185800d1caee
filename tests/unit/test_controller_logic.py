"""Pure parts of the controller: holder choice, label selectors, spec parsing, the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import pytest
import yaml

from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo, choose_holder
from fencedlease.controller.scheduler import Scheduler
from fencedlease.models import (
    FencedLeaseSpec,
    LabelSelector,
    Phase,
    pod_annotation_keys,
    set_condition,
)
from tests.fakes import FakeClock


class PodFlags(TypedDict, total=False):
    """The keyword flags of :func:`pod` a parametrized test overrides."""

    ready: bool
    running: bool
    deleting: bool


def pod(
    name: str,
    created: str,
    *,
    ready: bool = True,
    running: bool = True,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> PodInfo:
    return PodInfo(
        "ns",
        name,
        f"uid-{name}",
        created,
        labels or {"app": "w"},
        running=running,
        ready=ready,
        deleting=deleting,
    )


def test_oldest_eligible_pod_is_chosen_and_ties_break_by_name() -> None:
    pods = [
        pod("c", "2026-01-01T00:00:02Z"),
        pod("b", "2026-01-01T00:00:01Z"),
        pod("a", "2026-01-01T00:00:01Z"),
        pod("old-but-not-ready", "2026-01-01T00:00:00Z", ready=False),
    ]
    chosen = choose_holder(pods, None)
    assert chosen is not None and chosen.name == "a"


def test_healthy_current_holder_is_kept_no_flapping() -> None:
    pods = [pod("a", "2026-01-01T00:00:00Z"), pod("b", "2026-01-01T00:00:05Z")]
    chosen = choose_holder(pods, "b")
    assert chosen is not None and chosen.name == "b"


@pytest.mark.parametrize("bad", [{"ready": False}, {"running": False}, {"deleting": True}])
def test_ineligible_current_holder_is_replaced(bad: PodFlags) -> None:
    pods = [pod("a", "2026-01-01T00:00:00Z"), pod("b", "2026-01-01T00:00:05Z", **bad)]
    chosen = choose_holder(pods, "b")
    assert chosen is not None and chosen.name == "a"
    assert choose_holder([pods[1]], "b") is None


def test_pod_info_from_watch_body() -> None:
    body = {
        "metadata": {
            "name": "p",
            "namespace": "n",
            "uid": "u",
            "labels": {"app": "w"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    info = PodInfo.from_body(body)
    assert info.eligible
    body["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"  # type: ignore[index]
    assert not PodInfo.from_body(body).eligible


def test_label_selector_semantics() -> None:
    sel = LabelSelector.model_validate(
        {
            "matchLabels": {"app": "w"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel.matches({"app": "w", "tier": "a"})
    assert not sel.matches({"app": "w", "tier": "c"})
    assert not sel.matches({"app": "w", "tier": "a", "canary": "1"})
    assert not sel.matches({"tier": "a"})
    assert LabelSelector().matches({"anything": "x"})


def test_pod_cache_candidates_by_selector() -> None:
    cache = PodCache()
    cache.upsert(pod("a", "t", labels={"app": "w"}))
    cache.upsert(pod("b", "t", labels={"app": "other"}))
    sel = LabelSelector.model_validate({"matchLabels": {"app": "w"}})
    assert [p.name for p in cache.candidates("ns", sel)] == ["a"]
    assert cache.remove("ns", "a") is not None
    assert cache.candidates("ns", sel) == []


def test_pod_cache_indexes_the_pods_that_carry_a_leases_annotations() -> None:
    """``annotated`` follows every upsert, refresh and removal (the renewal's question "who
    still reads held?" is answered from it, not by a scan of the namespace)."""
    cache = PodCache()
    a = pod("a", "t")
    held = {
        pod_annotation_keys("report")["state"]: "held",
        pod_annotation_keys("other")["token"]: "7",
    }
    cache.upsert(a)
    cache.upsert(pod("b", "t"))
    assert cache.annotated("ns", "report") == []
    cache.upsert(replace(a, annotations=held))
    assert [p.name for p in cache.annotated("ns", "report")] == ["a"]
    assert [p.name for p in cache.annotated("ns", "other")] == ["a"]
    assert cache.annotated("elsewhere", "report") == []
    # A write of ours coming back, with one lease's annotations removed.
    assert cache.refresh(replace(a, annotations={pod_annotation_keys("other")["token"]: "7"}))
    assert cache.annotated("ns", "report") == []
    assert [p.name for p in cache.annotated("ns", "other")] == ["a"]
    # The same annotations again (a renewal's echo): the index keeps the newest Pod version.
    newer = replace(a, annotations={pod_annotation_keys("other")["token"]: "7"}, ready=False)
    cache.upsert(newer)
    assert cache.annotated("ns", "other") == [newer]
    assert cache.remove("ns", "a") is not None
    assert cache.annotated("ns", "other") == []
    assert cache._annotated == {}  # nothing left behind for Pods that are gone


def test_invalid_spec_becomes_a_user_facing_message_not_a_crash() -> None:
    body = {
        "metadata": {"name": "l", "namespace": "n", "uid": "u", "generation": 3},
        "spec": {"leaseDurationSeconds": -5, "fencingPolicy": "Sometimes"},
    }
    lease = LeaseObject.from_body(body)
    assert isinstance(lease.spec, str)
    assert "spec.leaseDurationSeconds" in lease.spec
    assert "spec.fencingPolicy" in lease.spec
    assert "spec.holderSelector" in lease.spec
    good = LeaseObject.from_body(
        {**body, "spec": {"leaseDurationSeconds": 5, "holderSelector": {}}}
    )
    assert isinstance(good.spec, FencedLeaseSpec)


def test_the_crd_admits_exactly_the_phases_the_model_parses() -> None:
    """A phase the CRD lets in but the model refuses makes the whole status unparsable
    (reported and rewritten, but a needless forgery path): the two lists are one."""
    crd = Path(__file__).resolve().parents[2] / "crds" / "fencedleases.fencedlease.io.yaml"
    schema = yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    phase = schema["properties"]["status"]["properties"]["phase"]
    assert phase["enum"] == [p.value for p in Phase]


def test_condition_transition_time_only_moves_on_status_change() -> None:
    import datetime as dt

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(minutes=1)
    conds = set_condition([], "Held", "True", "Granted", "", t0, 1)
    conds = set_condition(conds, "Held", "True", "Renewed", "", t1, 1)
    assert conds[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert conds[0].reason == "Renewed"
    conds = set_condition(conds, "Held", "False", "Expired", "", t1, 1)
    assert conds[0].last_transition_time == "2026-01-01T00:01:00Z"


class Calls:
    """Counts work calls; ``await calls.reach(n)`` is a barrier, not a sleep."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self._changed = asyncio.Condition()

    async def record(self, key: str) -> None:
        async with self._changed:
            self.keys.append(key)
            self._changed.notify_all()

    async def reach(self, n: int) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.keys) >= n), 5)


async def settle() -> None:
    """Let every ready task run (the scheduler loop has nothing left to do without a poke)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_scheduler_runs_due_keys_once_and_reschedules_by_return_value() -> None:
    clock = FakeClock(0.0)
    calls = Calls()

    async def work(key: str) -> float | None:
        await calls.record(key)
        return 10.0 if key == "a" else None

    sched: Scheduler[str] = Scheduler(work, clock=clock)
    task = asyncio.create_task(sched.run())
    sched.poke("a")
    sched.poke("a")  # coalesced with the pending run
    sched.poke("b")
    await calls.reach(2)
    await settle()
    assert sorted(calls.keys) == ["a", "b"]
    assert len(sched) == 1  # only "a" asked to run again
    clock.now = 10.0
    sched.poke("c", delay=100)  # wakes the loop; "a" is now due
    await calls.reach(3)
    await settle()
    assert calls.keys.count("a") == 2 and "c" not in calls.keys
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_scheduler_heap_keeps_no_pile_of_superseded_entries() -> None:
    """Each poke that moves a key earlier leaves its old entry in the heap until that entry's
    time comes: a 3 h lease (renewed hourly) poked every second piled up 3,600 per key."""

    async def work(key: str) -> float | None:
        return None

    clock = FakeClock(0.0)
    sched: Scheduler[str] = Scheduler(work, clock=clock)
    for key in ("a", "b"):
        sched.poke(key, delay=3600.0)
    for i in range(10_000):  # events poke "a" ever earlier; the loop is not running
        sched.poke("a", delay=3600.0 - 0.1 * (i + 1))
    assert len(sched) == 2
    assert len(sched._heap) <= 2 * len(sched) + 65
    assert sorted(key for when, _, key in sched._heap if sched._due.get(key) == when) == [
        "a",
        "b",
    ]


@pytest.mark.parametrize("slack", [0.005, 0.0])
async def test_scheduler_runs_keys_due_within_its_slack_in_one_wake(slack: float) -> None:
    """Renewals on one slot's ticks fall due a few microseconds to milliseconds apart (each
    pass computes its delay from its own clock reading): the leases scheduler's slack runs
    them in the wake of the first, not in a wake each; without slack the later one waits."""
    clock = FakeClock(0.0)
    calls = Calls()

    async def work(key: str) -> float | None:
        await calls.record(key)
        return None

    sched: Scheduler[str] = Scheduler(work, clock=clock, slack=slack)
    task = asyncio.create_task(sched.run())
    sched.poke("a", delay=10.0)
    sched.poke("b", delay=10.003)
    sched.poke("c", delay=10.02)  # beyond the slack: its own wake
    await settle()
    clock.now = 10.0
    sched.poke("wake", delay=100)  # wakes the loop: "a" is due
    await calls.reach(1)
    await settle()
    assert sorted(calls.keys) == (["a", "b"] if slack else ["a"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_scheduler_never_runs_one_key_concurrently() -> None:
    gate = asyncio.Event()
    calls = Calls()
    active = 0
    peak = 0

    async def work(key: str) -> float | None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await calls.record(key)
        if len(calls.keys) == 1:
            await gate.wait()
        active -= 1
        return None

    sched: Scheduler[str] = Scheduler(work)
    task = asyncio.create_task(sched.run())
    sched.poke("k")
    await calls.reach(1)
    sched.poke("k")  # arrives during the run: one more run after it, not a parallel one
    await settle()
    assert len(calls.keys) == 1
    gate.set()
    await calls.reach(2)
    assert peak == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_scheduler_retries_a_failing_key_with_backoff() -> None:
    clock = FakeClock(0.0)
    calls = Calls()

    async def work(key: str) -> float | None:
        await calls.record(key)
        raise RuntimeError("boom")

    sched: Scheduler[str] = Scheduler(work, clock=clock, error_backoff=2.0)
    task = asyncio.create_task(sched.run())
    sched.poke("k")
    await calls.reach(1)
    await settle()
    assert len(sched) == 1 and len(calls.keys) == 1  # scheduled again, not yet due
    clock.now = 2.0
    sched.poke("other", delay=50)  # wake the loop: "k" is due after the backoff
    await calls.reach(2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class OneBusyWorker:
    """A one-worker scheduler whose worker is busy with key ``blocker`` until :meth:`order`:
    keys poked meanwhile queue up, to run in the scheduler's order."""

    def __init__(self, clock: FakeClock, **options: Any) -> None:
        self.calls = Calls()
        self.gate = asyncio.Event()
        self.sched: Scheduler[str] = Scheduler(self.work, clock=clock, concurrency=1, **options)

    async def work(self, key: str) -> float | None:
        await self.calls.record(key)
        if key == "blocker":
            await self.gate.wait()
        return None

    async def __aenter__(self) -> Scheduler[str]:
        self.task = asyncio.create_task(self.sched.run())
        self.sched.poke("blocker")
        await self.calls.reach(1)
        return self.sched

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def order(self, runs: int) -> list[str]:
        """Free the worker and wait for ``runs`` runs in all: the keys in the order they ran."""
        await settle()
        self.gate.set()
        await self.calls.reach(runs)
        return self.calls.keys


async def test_scheduler_runs_urgent_keys_first_among_due_ones() -> None:
    """Renewals of live grants (priority 0) go before a backlog of new grants (priority 1)."""
    urgent = {"renew-1", "renew-2"}
    busy = OneBusyWorker(FakeClock(0.0), priority=lambda k: 0 if k in urgent else 1)
    async with busy as sched:
        for key in ("grant-1", "grant-2", "renew-1", "grant-3", "renew-2"):
            sched.poke(key)  # all due now, in this order, while the only slot is busy
        order = await busy.order(6)
    assert order == ["blocker", "renew-1", "renew-2", "grant-1", "grant-2", "grant-3"]


async def test_scheduler_runs_one_wakes_keys_group_by_group_and_earlier_wakes_first() -> None:
    """Keys found due in one wake run grouped (e.g. one holder Pod's renewals back to back,
    sharing its write), each group by due time; keys of a later wake wait for the earlier
    wake's, whatever their group, so no group starves another."""
    clock = FakeClock(0.0)
    busy = OneBusyWorker(clock, group=lambda k: "" if k == "blocker" else k[0])
    async with busy as sched:
        for key in ("b1", "a1", "b2", "a2"):
            sched.poke(key)  # due in one wake while the only slot is busy
        await settle()
        clock.now = 1.0
        sched.poke("a3")  # due in a later wake: after b1 and b2, though its group sorts first
        order = await busy.order(6)
    assert order == ["blocker", "a1", "a2", "b1", "b2", "a3"]


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_scheduler_metrics_count_passes_their_duration_lateness_and_queue() -> None:
    """Reconcile count/errors/duration, the queue of due passes and their lateness, by kind."""
    clock = FakeClock(0.0)
    calls = Calls()
    gate = asyncio.Event()

    async def work(key: str) -> float | None:
        await calls.record(key)
        if key == "blocker":
            await gate.wait()
            clock.now += 0.5  # the pass took half a second
        if key == "bad":
            raise RuntimeError("boom")
        return None

    kind = {"kind": "artifacts"}
    ok0 = _sample("fencedlease_reconciles_total", result="ok", **kind)
    err0 = _sample("fencedlease_reconciles_total", result="error", **kind)
    errors0 = _sample("fencedlease_reconcile_errors_total", **kind)
    runs0 = _sample("fencedlease_reconcile_duration_seconds_count", **kind)
    spent0 = _sample("fencedlease_reconcile_duration_seconds_sum", **kind)
    late0 = _sample("fencedlease_scheduler_lateness_seconds_sum", **kind)
    sched: Scheduler[str] = Scheduler(work, clock=clock, concurrency=1, kind="artifacts")
    task = asyncio.create_task(sched.run())
    sched.poke("blocker")
    await calls.reach(1)
    sched.poke("bad")
    sched.poke("late", delay=1.0)
    clock.now = 4.0  # "late" is due since 1.0; both wait for the one worker
    sched.poke("wake", delay=100)
    await settle()
    assert _sample("fencedlease_scheduler_queue_depth", **kind) == 2
    gate.set()
    await calls.reach(3)
    await settle()
    assert _sample("fencedlease_scheduler_queue_depth", **kind) == 0
    assert _sample("fencedlease_reconciles_total", result="ok", **kind) - ok0 == 2
    assert _sample("fencedlease_reconciles_total", result="error", **kind) - err0 == 1
    assert _sample("fencedlease_reconcile_errors_total", **kind) - errors0 == 1
    assert _sample("fencedlease_reconcile_duration_seconds_count", **kind) - runs0 == 3
    # The blocker ran from 0.0 to 4.5 (the clock moved on while it waited); the others took 0.
    assert _sample("fencedlease_reconcile_duration_seconds_sum", **kind) - spent0 == 4.5
    # "bad" was due at 0.0 and "late" at 1.0; both started at 4.5, after the blocker.
    assert _sample("fencedlease_scheduler_lateness_seconds_sum", **kind) - late0 == 4.5 + 3.5
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_scheduler_kinds_are_bounded_and_build_info_names_the_version() -> None:
    from fencedlease import __version__

    with pytest.raises(ValueError, match="scheduler kind"):
        Scheduler(lambda key: asyncio.sleep(0, None), kind="per-lease-name")
    import platform

    version = {"version": __version__, "python": platform.python_version()}
    assert _sample("fencedlease_build_info", **version) == 1


async def test_scheduler_runs_again_a_pass_cancelled_from_below() -> None:
    """A pass that ends in ``CancelledError`` while the scheduler is not stopping (a gRPC call
    cancelled when another call's failover closed the shared etcd channel) runs again after
    the error backoff. The scheduler used to re-raise it: the task ended, nothing poked the
    key again, and the lease froze (seen after an etcd restore on the real node)."""
    clock = FakeClock(0.0)
    calls = Calls()

    async def work(key: str) -> float | None:
        await calls.record(key)
        if len(calls.keys) == 1:
            raise asyncio.CancelledError
        return None

    sched: Scheduler[str] = Scheduler(work, clock=clock, error_backoff=2.0)
    task = asyncio.create_task(sched.run())
    sched.poke("a")
    await calls.reach(1)
    await settle()
    assert len(sched) == 1, "the cancelled pass was not scheduled again"
    clock.now = 2.0
    sched.poke("b", delay=100)  # wakes the loop; "a" is now due
    await calls.reach(2)
    assert calls.keys == ["a", "a"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
