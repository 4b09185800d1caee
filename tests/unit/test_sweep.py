"""The legacy sweep: its pure rule (``retention.sweep_token``/``sweep_mark``) and the runner
that the leading controller starts (``controller/sweep.py``): leader only, paced, stopped
when leadership ends, retried after an etcd failure. Fake store and sleep, no real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from hypothesis import given
from hypothesis import strategies as st

from fencedlease.authority import retention
from fencedlease.authority.retention import Sweep, SweepReport
from fencedlease.authority.types import LeaseRecord, StoredLease, StoreUnavailable
from fencedlease.controller.sweep import LegacySweep

K = 3


def lease(retained: tuple[int, ...], token: int | None = 100, mod: int = 100) -> StoredLease:
    return StoredLease(LeaseRecord("id", "pod", 30.0, token, retained=retained), mod)


def test_a_live_lease_prunes_only_below_a_full_list() -> None:
    full = lease((50, 60, 70))
    assert retention.sweep_token(10, False, full, K) is Sweep.PRUNE
    assert retention.sweep_token(49, False, full, K) is Sweep.PRUNE
    assert retention.sweep_token(50, False, full, K) is Sweep.KEEP  # retained
    assert retention.sweep_token(55, False, full, K) is Sweep.KEEP  # not older than the list
    # A list not full yet: older records are still among "the last K generations".
    assert retention.sweep_token(10, False, lease((50, 60)), K) is Sweep.KEEP
    assert retention.sweep_token(10, False, lease(()), K) is Sweep.KEEP
    # The current generation's token is never pruned (a key at its grant version).
    assert retention.sweep_token(40, False, lease((50, 60, 70), token=None, mod=40), K) is (
        Sweep.KEEP
    )


def test_a_deleted_lease_prunes_what_no_window_holds() -> None:
    assert retention.sweep_token(10, False, None, K) is Sweep.PRUNE
    assert retention.sweep_token(10, True, None, K) is Sweep.KEEP  # in a deletion's window
    assert retention.sweep_token(10, True, lease((50, 60, 70)), K) is Sweep.KEEP
    gone = {"attached": False, "lease_exists": False}
    assert retention.sweep_mark(**gone, records_remain=False) is Sweep.PRUNE
    assert retention.sweep_mark(attached=True, lease_exists=False, records_remain=False) is (
        Sweep.KEEP
    )
    assert retention.sweep_mark(attached=False, lease_exists=True, records_remain=False) is (
        Sweep.KEEP
    )


def test_a_mark_stays_while_a_record_of_its_lease_stays() -> None:
    """A mark written back permanent after its lease's deletion was pruned while the deleted
    lease's records stayed in the window, so a token below it was admitted: no record may
    outlive its mark."""
    assert retention.sweep_mark(attached=False, lease_exists=False, records_remain=True) is (
        Sweep.KEEP
    )


@given(
    st.lists(st.integers(1, 10_000), min_size=0, max_size=6, unique=True),
    st.integers(1, 10_000),
)
def test_the_sweep_prunes_only_what_the_recording_rule_calls_retired(
    retained: list[int], token: int
) -> None:
    """Whatever the sweep prunes of a live lease, ``retired`` already treats as pruned (a
    committed write with it is not reported as unverified once the mark covers it)."""
    kept = tuple(sorted(retained))
    current = lease(kept)
    if retention.sweep_token(token, False, current, K) is Sweep.PRUNE:
        assert token not in kept
        assert retention.retired(False, token, token, kept, K)


class FakeStore:
    def __init__(self, pages: int = 3, fail: bool = False) -> None:
        self.pages = pages
        self.fail = fail
        self.sweeps = 0
        self.paused: list[int] = []
        self.swept = asyncio.Event()

    async def sweep_legacy(
        self,
        *,
        page: int = 500,
        pause: Callable[[int], Awaitable[None]] | None = None,
        progress: Callable[[SweepReport], None] | None = None,
    ) -> SweepReport:
        self.sweeps += 1
        if self.fail:
            raise StoreUnavailable("etcd_error", "down")
        report = SweepReport()
        for _ in range(self.pages):
            report.scanned += 10
            report.pruned += 4
            report.kept += 6
            if progress is not None:
                progress(report)
            if pause is not None:
                self.paused.append(4)
                await pause(4)
        self.swept.set()
        return report


class Leader:
    def __init__(self) -> None:
        self.leading = True

    def is_leader(self) -> bool:
        return self.leading


async def test_the_leader_sweeps_paced_and_is_due_again_after_the_interval() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    store = FakeStore()
    sweep = LegacySweep(store, Leader(), interval=3600.0, keys_per_second=8.0, sleep=sleep)
    assert await sweep.sweep_once() == 3600.0
    assert store.sweeps == 1
    assert slept == [0.5, 0.5, 0.5]  # 4 deletions per page at 8 per second
    assert sweep.last == SweepReport(scanned=30, pruned=12, kept=18)


async def test_a_standby_does_not_sweep_and_a_lost_leadership_stops_the_sweep() -> None:
    leader = Leader()
    leader.leading = False
    store = FakeStore()

    async def sleep(seconds: float) -> None:
        leader.leading = False  # the term ends during the first pause

    sweep = LegacySweep(store, leader, interval=3600.0, sleep=sleep)
    assert await sweep.sweep_once() == 3600.0 and store.sweeps == 0
    leader.leading = True
    assert await sweep.sweep_once() == 3600.0
    assert store.paused == [4, 4]  # the second page's pause found the term over
    assert sweep.last is None


async def test_an_etcd_failure_retries_sooner() -> None:
    sweep = LegacySweep(FakeStore(fail=True), Leader(), interval=3600.0, retry=300.0)
    assert await sweep.sweep_once() == 300.0
    assert sweep.last is None


async def test_leadership_starting_wakes_a_waiting_sweep() -> None:
    leader = Leader()
    leader.leading = False
    store = FakeStore(pages=1)

    async def sleep(seconds: float) -> None:
        return None

    sweep = LegacySweep(store, leader, interval=3600.0, sleep=sleep)
    task = asyncio.create_task(sweep.run())
    try:
        for _ in range(10):
            await asyncio.sleep(0)  # the first (standby) attempt, then the wait
        assert store.sweeps == 0
        leader.leading = True
        sweep.leadership_started()
        async with asyncio.timeout(5):
            await store.swept.wait()
        assert store.sweeps == 1
    finally:
        task.cancel()
