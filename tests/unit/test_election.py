"""The election's pure decisions on a fake monotonic clock: who may write, and when a standby
may take over (client-go style, stricter for a replica that lost its term)."""

from __future__ import annotations

import pytest

from fencedlease.election.decisions import (
    Action,
    ElectionTiming,
    Elector,
    LeaseRecord,
)
from tests.fakes import FakeClock

TIMING = ElectionTiming(lease_duration=5, renew_deadline=3, retry_period=1, skew=1)


def record(rv: str, holder: str | None, transitions: int = 0) -> LeaseRecord:
    return LeaseRecord(rv, holder, 5.0, transitions)


def leader(clock: FakeClock, identity: str = "a") -> Elector:
    elector = Elector(identity, TIMING)
    assert elector.decide(None, clock()).action is Action.CREATE
    elector.written(clock())
    return elector


def test_timing_must_leave_the_leader_time_to_stop_first() -> None:
    for bad in ((5, 5, 1), (5, 3, 3), (5, 6, 1), (5, 3, 0)):
        with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
            ElectionTiming(*bad)


def test_no_lease_creates_it_and_a_successful_write_starts_a_term() -> None:
    clock = FakeClock()
    elector = Elector("a", TIMING)
    assert not elector.is_leader(clock())
    assert elector.decide(None, clock()).action is Action.CREATE
    assert not elector.is_leader(clock())  # deciding is not writing
    elector.written(clock())
    assert elector.is_leader(clock())


def test_the_leader_renews_and_each_renewal_moves_the_deadline_from_its_start() -> None:
    clock = FakeClock()
    elector = leader(clock)
    for i in range(10):
        clock.advance(1)
        assert elector.decide(record(str(i), "a"), clock()).action is Action.RENEW
        started = clock()
        clock.advance(0.4)  # the round trip
        elector.written(started)
    assert elector.deadline() == started + TIMING.renew_deadline


def test_the_leader_stops_writing_at_its_deadline_by_its_own_clock_alone() -> None:
    """No timer, no API answer: a paused process resumes past its deadline and may not write."""
    clock = FakeClock()
    elector = leader(clock)
    clock.advance(TIMING.renew_deadline - 0.001)
    assert elector.is_leader(clock())
    clock.advance(0.001)
    assert not elector.is_leader(clock())


def test_failed_renewals_keep_the_term_only_until_the_deadline() -> None:
    clock = FakeClock()
    elector = leader(clock)
    clock.advance(1)
    assert elector.decide(record("1", "a"), clock()).action is Action.RENEW
    # the write fails (timeout, 5xx): nothing is reported, the deadline stays
    clock.advance(1)
    assert elector.is_leader(clock())
    clock.advance(1)
    assert not elector.is_leader(clock())
    # the Lease still names us, but the term is over: we wait like any standby
    assert elector.decide(record("1", "a"), clock()).action is Action.WAIT


def test_a_conflict_ends_the_term_at_once() -> None:
    clock = FakeClock()
    elector = leader(clock)
    clock.advance(1)
    elector.decide(record("1", "a"), clock())
    elector.conflicted()
    assert not elector.is_leader(clock())


def test_a_lease_naming_someone_else_ends_our_term() -> None:
    clock = FakeClock()
    elector = leader(clock)
    clock.advance(1)
    assert elector.decide(record("9", "b"), clock()).action is Action.WAIT
    assert not elector.is_leader(clock())


def test_a_standby_waits_a_full_duration_plus_skew_of_an_unchanged_version() -> None:
    clock = FakeClock()
    standby = Elector("b", TIMING)
    assert standby.decide(record("1", "a", transitions=3), clock()).action is Action.WAIT
    clock.advance(TIMING.lease_duration + TIMING.skew - 0.001)
    assert standby.decide(record("1", "a", 3), clock()).action is Action.WAIT
    clock.advance(0.001)
    decision = standby.decide(record("1", "a", 3), clock())
    assert decision.action is Action.ACQUIRE and decision.transitions == 4


def test_every_renewal_seen_restarts_the_standbys_wait() -> None:
    clock = FakeClock()
    standby = Elector("b", TIMING)
    for i in range(20):
        assert standby.decide(record(str(i), "a"), clock()).action is Action.WAIT
        clock.advance(1)


def test_a_longer_duration_in_the_record_is_honoured() -> None:
    clock = FakeClock()
    standby = Elector("b", TIMING)
    slow = LeaseRecord("1", "a", 15.0)
    standby.decide(slow, clock())
    clock.advance(TIMING.lease_duration + TIMING.skew)
    assert standby.decide(slow, clock()).action is Action.WAIT
    clock.advance(15 - TIMING.lease_duration)
    assert standby.decide(slow, clock()).action is Action.ACQUIRE


def test_a_released_lease_is_taken_at_once() -> None:
    clock = FakeClock()
    standby = Elector("b", TIMING)
    assert standby.decide(record("7", "", 2), clock()).action is Action.ACQUIRE


def test_a_replica_that_lost_its_term_waits_even_for_a_lease_naming_itself() -> None:
    """Stricter than client-go: a former leader (or a restart reusing the identity) must not
    resume on a stale view; it waits a full duration like any standby."""
    clock = FakeClock()
    elector = leader(clock)
    clock.advance(30)  # SIGSTOP
    assert elector.decide(record("5", "a"), clock()).action is Action.WAIT
    fresh = Elector("a", TIMING)  # a new process with the same identity
    assert fresh.decide(record("5", "a"), clock()).action is Action.WAIT
    clock.advance(TIMING.lease_duration + TIMING.skew)
    assert elector.decide(record("5", "a"), clock()).action is Action.ACQUIRE


def test_the_old_leader_stops_before_any_standby_can_take_over() -> None:
    """The safety argument, on one clock: the standby sees the version after the renewal
    committed, so its earliest takeover is after the leader's deadline."""
    clock = FakeClock()
    a = leader(clock)
    b = Elector("b", TIMING)
    for rv in range(1, 6):
        clock.advance(TIMING.retry_period)
        started = clock()
        a.decide(record(str(rv), "a"), started)
        clock.advance(0.2)  # commit
        a.written(started)
        b.decide(record(str(rv), "a"), clock())  # the standby's read sees it
    # a freezes here; b keeps reading the same version
    while b.decide(record("5", "a"), clock()).action is Action.WAIT:
        clock.advance(0.01)
    deadline = a.deadline()
    assert deadline is not None and not a.is_leader(clock())
    assert clock() - deadline >= TIMING.lease_duration - TIMING.renew_deadline


def test_next_attempt_wakes_the_leader_by_its_deadline() -> None:
    clock = FakeClock()
    elector = leader(clock)
    assert elector.next_attempt(clock()) == TIMING.retry_period
    clock.advance(2.5)
    assert elector.next_attempt(clock()) == pytest.approx(0.5)
