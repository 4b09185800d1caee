"""A lapse of the leadership gate that never ends the term: the process is starved past its
renewal deadline, and the election's next renewal lands in time, so leadership is never seen
to stop or start. The passes dropped during the lapse run again once the gate opens (before:
they were dropped for good, and a lease poked only then stayed ungranted)."""

from __future__ import annotations

from typing import Any

from fencedlease.controller.runtime import Parked
from tests.unit.test_election_gate import (
    KEY,
    NS,
    nothing_written,
    pass_ran,
    run_scheduler_until,
    world,
)


async def test_a_pass_dropped_during_a_lapse_runs_once_the_gate_opens() -> None:
    controller, kube, store, switch = world()
    assert await controller.scheduler._work(KEY) is None  # the gate is closed: dropped
    assert nothing_written(kube)
    switch.leading = True  # the lapse ends; leadership_started() is never called
    ran = pass_ran(controller)
    controller.unpark()
    await run_scheduler_until(controller, ran)
    view = await store.read(NS, "report")
    assert view is not None and view.record.holder == "w-1"


async def test_a_pass_abandoned_mid_way_runs_again_once_the_gate_opens() -> None:
    controller, kube, store, switch = world()
    switch.leading = True
    acquire = store.acquire
    calls = 0

    async def acquire_then_lapse(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        result = await acquire(*args, **kwargs)
        if calls == 1:
            switch.leading = False  # starved past the deadline right after the grant
        return result

    store.acquire = acquire_then_lapse  # type: ignore[method-assign]
    assert await controller.scheduler._work(KEY) is None  # abandoned: NotLeader
    assert not kube.annotations
    controller.unpark()  # still closed: nothing to do yet
    assert controller.parked_leases is not None and len(controller.parked_leases) == 1
    switch.leading = True
    controller.unpark()
    assert controller.parked_leases is not None and len(controller.parked_leases) == 0
    done = pass_ran(controller)
    await run_scheduler_until(controller, done)
    state = "state.fencedlease.io/report"
    assert kube.annotations[(NS, "w-1")][state] == "held"


def test_parked_keys_of_deleted_objects_do_not_accumulate() -> None:
    """A standby parks every key it is poked for; keys of objects deleted since go."""
    alive = {f"k{i}" for i in range(10)}
    parked: Parked[str] = Parked(lambda k: k in alive)
    for i in range(10_000):
        parked.add(f"gone-{i}")
        parked.add(f"k{i % 10}")
    assert len(parked) <= 2 * len(alive) + 64 + 1
    assert alive <= parked.take()
