"""Pure lease decisions: acquire/renew/release/expire/force-release on a stored record."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fencedlease.authority import decide
from fencedlease.authority.types import (
    Busy,
    EndedBy,
    LeaseRecord,
    LeaseState,
    NotHeld,
    Observation,
    Released,
    StoredLease,
    StoreUnavailable,
)


def held(
    lease_id: str = "a7", token: int | None = None, rev: int = 41, duration: float = 10.0
) -> StoredLease:
    return StoredLease(LeaseRecord(lease_id, "pod-a", duration, token), rev)


def test_record_json_round_trip_and_token_at() -> None:
    record = LeaseRecord("a7", "pod-a", 10.0, None, LeaseState.RELEASED, 3, EndedBy.EXPIRY)
    assert LeaseRecord.from_json(record.to_json()) == record
    assert record.token_at(41) == 41
    assert replace(record, token=7).token_at(41) == 7


def test_acquire_absent_lease_compares_on_absence() -> None:
    plan = decide.decide_acquire(
        None, None, 0.0, holder="pod-a", duration_seconds=10, lease_id="a7"
    )
    assert isinstance(plan, decide.AcquirePlan)
    assert plan.expected_mod_revision is None
    assert plan.record.token is None and plan.record.state is LeaseState.HELD
    assert not plan.took_over_expired


def test_acquire_released_lease_compares_on_its_mod_revision() -> None:
    current = StoredLease(replace(held().record, state=LeaseState.RELEASED), 50)
    plan = decide.decide_acquire(current, None, 0.0, holder="b", duration_seconds=5, lease_id="b9")
    assert isinstance(plan, decide.AcquirePlan)
    assert plan.expected_mod_revision == 50


def test_acquire_held_lease_is_busy_until_duration_passed_since_observation() -> None:
    current = held()
    obs = decide.observe(None, current, now=100.0)
    busy = decide.decide_acquire(current, obs, 109.9, holder="b", duration_seconds=5, lease_id="x")
    assert isinstance(busy, Busy)
    assert busy.holder == "pod-a" and busy.token == 41 and busy.lease_id == "a7"
    assert busy.remaining_seconds == pytest.approx(0.1)
    plan = decide.decide_acquire(current, obs, 110.0, holder="b", duration_seconds=5, lease_id="x")
    assert isinstance(plan, decide.AcquirePlan)
    assert plan.took_over_expired and plan.expected_mod_revision == 41


def test_observation_is_kept_per_version_and_restarts_on_change() -> None:
    first = decide.observe(None, held(rev=41), 1.0)
    assert decide.observe(first, held(rev=41), 5.0) == first
    changed = decide.observe(first, held(rev=42), 5.0)
    assert changed == Observation(42, "a7", 5.0)
    # Same revision but another lease id (revision reused after a bad restore): new observation.
    assert decide.observe(first, held("zz", rev=41), 6.0) == Observation(41, "zz", 6.0)
    assert decide.observe(first, None, 7.0) is None


def test_unmatched_observation_counts_as_made_now() -> None:
    stale = Observation(40, "a7", 0.0)
    assert decide.remaining_seconds(held(rev=41), stale, 100.0) == 10.0
    assert not decide.is_expired(held(rev=41), None, 100.0)


def test_renew_keeps_token_and_counts() -> None:
    current = held(rev=41)
    obs = decide.observe(None, current, 0.0)
    plan = decide.decide_renew(current, obs, 5.0, lease_id="a7", token=41)
    assert isinstance(plan, decide.WritePlan)
    assert plan.token == 41 and plan.record.token == 41 and plan.record.renewals == 1
    # The rewritten version (new mod_revision) still carries token 41.
    again = StoredLease(plan.record, 60)
    assert again.token == 41


@pytest.mark.parametrize(
    ("lease_id", "token", "reason"),
    [("old", 41, "lease_id mismatch: current is a7"), ("a7", 40, "token mismatch")],
)
def test_renew_and_release_of_other_generation_change_nothing(
    lease_id: str, token: int, reason: str
) -> None:
    current = held(rev=41)
    renew = decide.decide_renew(current, None, 0.0, lease_id=lease_id, token=token)
    release = decide.decide_release(current, lease_id=lease_id, token=token)
    for result in (renew, release):
        assert isinstance(result, NotHeld)
        assert result.reason.startswith(reason)
        assert result.current_lease_id == "a7"


def test_renew_refuses_expired_and_released_generations() -> None:
    current = held(rev=41)
    obs = decide.observe(None, current, 0.0)
    expired = decide.decide_renew(current, obs, 10.0, lease_id="a7", token=41)
    assert isinstance(expired, NotHeld) and "expired" in expired.reason
    released = StoredLease(replace(current.record, token=41, state=LeaseState.RELEASED), 44)
    gone = decide.decide_renew(released, None, 0.0, lease_id="a7", token=41)
    assert isinstance(gone, NotHeld) and "released" in gone.reason
    assert isinstance(decide.decide_renew(None, None, 0.0, lease_id="a7", token=41), NotHeld)


def test_release_marks_released_with_explicit_token_and_is_idempotent() -> None:
    plan = decide.decide_release(held(rev=41), lease_id="a7", token=41)
    assert isinstance(plan, decide.WritePlan)
    assert plan.record.state is LeaseState.RELEASED and plan.record.token == 41
    assert plan.record.ended_by is EndedBy.RELEASE
    again = decide.decide_release(StoredLease(plan.record, 45), lease_id="a7", token=41)
    assert again == Released("a7", 41, already_released=True)


def test_force_release_names_the_lease_id_only() -> None:
    plan = decide.decide_force_release(held(rev=41), lease_id="a7")
    assert isinstance(plan, decide.WritePlan)
    assert plan.record.ended_by is EndedBy.FORCE_RELEASE
    wrong = decide.decide_force_release(held(rev=41), lease_id="b9")
    assert isinstance(wrong, NotHeld)


def test_expire_only_after_duration() -> None:
    current = held(rev=41)
    obs = decide.observe(None, current, 0.0)
    assert isinstance(decide.decide_expire(current, obs, 9.0), Busy)
    plan = decide.decide_expire(current, obs, 10.0, lease_id="a7")
    assert isinstance(plan, decide.WritePlan) and plan.record.ended_by is EndedBy.EXPIRY
    assert isinstance(decide.decide_expire(current, obs, 10.0, lease_id="b9"), NotHeld)
    assert isinstance(decide.decide_expire(None, None, 10.0), NotHeld)


def test_deadlines_start_at_send_time_minus_skew() -> None:
    assert decide.holder_deadline(100.0, 15.0, 1.0) == 114.0
    w0 = datetime(2025, 7, 1, tzinfo=UTC)
    assert decide.valid_until(w0, 15.0, 1.0) == w0 + timedelta(seconds=14)


def test_restore_guard() -> None:
    assert decide.restore_guard(101, 100, 0) is None
    refused = decide.restore_guard(100, 100, 0)
    assert isinstance(refused, StoreUnavailable) and refused.code == "restore_guard"
    assert "--bump-revision" in refused.reason and "--mark-compacted" in refused.reason
    assert decide.restore_guard(100, 0, 100) is None  # our own last grant may be the head
    assert isinstance(decide.restore_guard(99, 0, 100), StoreUnavailable)


def test_invalid_duration_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        decide.decide_acquire(None, None, 0.0, holder="a", duration_seconds=0, lease_id="x")


def test_lease_ids_are_unique() -> None:
    assert len({decide.new_lease_id() for _ in range(1000)}) == 1000


def test_grant_guard_on_the_commit_revision() -> None:
    """One-transaction acquire: the guard judges the grant's own commit revision."""
    assert decide.grant_guard(101, 100, 0) is None
    assert decide.grant_guard(101, 0, 100, previous_token=100) is None
    for token, floor, seen, previous in [(100, 100, 0, None), (100, 0, 100, None), (5, 0, 0, 7)]:
        refused = decide.grant_guard(token, floor, seen, previous_token=previous)
        assert isinstance(refused, StoreUnavailable) and refused.code == "restore_guard"
        assert "--bump-revision" in refused.reason


def test_rollback_guard_on_a_read() -> None:
    """A read's header may equal the last token issued (that grant may be etcd's last
    write); only a header below a known token means etcd went back."""
    assert decide.rollback_guard(100, 100, 0) is None
    assert decide.rollback_guard(100, 0, 100) is None
    assert isinstance(decide.rollback_guard(99, 100, 0), StoreUnavailable)
    assert isinstance(decide.rollback_guard(99, 0, 100), StoreUnavailable)
