"""The campaign's checker on hand-made histories: clean ones pass, each violation is named.

And the checker bites on a generated campaign: the fenced run of the reference model is safe,
the same holders against an unfenced resource are reported unsafe.
"""

from __future__ import annotations

import pytest

from tests.chaos.checker import Report, check
from tests.chaos.history import (
    ArtifactState,
    Event,
    Fault,
    Grant,
    History,
    Policy,
    Vacant,
    WriteFail,
    WriteInvoke,
    WriteOk,
    WriteTimeout,
    dumps,
    loads,
)
from tests.chaos.sim import SimConfig, run


def history(*events: Event, policy: Policy = "AllowEqual") -> History:
    return History(policies={"l": policy}, durations={"l": 10.0}, events=list(events))


def write(t: float, op: str, holder: str, token: int, lease_id: str) -> WriteInvoke:
    return WriteInvoke(t, op, "l", holder, token, lease_id, "l-out")


def kinds(report: Report) -> list[str]:
    return [v.kind for v in report.violations]


CLEAN = (
    Grant(0.0, "l", "a", 41, "id-a"),
    write(1.0, "w1", "a", 41, "id-a"),
    WriteOk(1.1, "w1"),
    ArtifactState(1.1, "l-out", "l", 41, "l-out/w1"),
    Grant(5.0, "l", "a", 41, "id-a"),  # a renewal: the same grant observed again
    Vacant(18.0, "l", "Expired"),
    Grant(20.0, "l", "b", 43, "id-b"),
    write(20.5, "w2", "b", 43, "id-b"),
    WriteOk(20.6, "w2"),
    ArtifactState(20.6, "l-out", "l", 43, "l-out/w2"),
    write(21.0, "w3", "a", 41, "id-a"),  # the paused owner wakes up ...
    WriteFail(21.1, "w3", "stale_fence"),  # ... and is fenced
    write(21.0, "w4", "b", 43, "id-b"),
    WriteTimeout(25.0, "w4"),  # unknown outcome: never counted as admitted
    Fault(30.0, "webhook_down", 31.0),
    write(30.2, "w5", "b", 43, "id-b"),
    WriteFail(30.3, "w5", "unavailable"),
    write(31.5, "w6", "b", 43, "id-b"),
    WriteOk(31.6, "w6"),
)


def test_a_clean_history_has_no_violation_and_its_figures() -> None:
    report = check(history(*CLEAN))
    assert report.safe, report.violations
    assert report.admitted == 3
    assert report.refused == {"stale_fence": 1, "unavailable": 1}
    assert report.availability.grants_per_minute["l"] == pytest.approx(2 / (31.6 / 60))
    ((fault, recovery),) = report.availability.recovery_seconds
    assert fault.kind == "webhook_down" and recovery == pytest.approx(0.6)


def test_held_time_runs_from_a_grant_to_the_status_that_ends_it() -> None:
    # Renewals do not write the status: a grant seen once is held until the status shows a
    # newer grant or none. (Counting one duration from each sight gave 10 + 10 of these 100 s.)
    report = check(
        history(
            Grant(0.0, "l", "a", 41, "id-a"),
            Grant(45.0, "l", "b", 43, "id-b"),
            Grant(46.0, "l", "a", 41, "id-a"),  # a's Pod read late: not a new grant
            Vacant(70.0, "l", "Expired"),
            Vacant(75.0, "l", "Pending"),
            Grant(80.0, "l", "b", 43, "id-b"),  # Held again after Unavailable, say
            WriteOk(100.0, "end"),
        )
    )
    assert report.availability.held_share["l"] == pytest.approx((70 + 20) / 100)
    assert report.availability.grants_per_minute["l"] == pytest.approx(2 / (100 / 60))


def test_overlapping_writes_are_not_ordered() -> None:
    # w2 (token 41) was sent before w1 (token 43) was answered: either order is honest.
    report = check(
        history(
            Grant(0.0, "l", "a", 41, "id-a"),
            write(0.9, "w2", "a", 41, "id-a"),  # sent before 43 was granted
            Grant(1.0, "l", "b", 43, "id-b"),
            write(2.0, "w1", "b", 43, "id-b"),
            WriteOk(2.5, "w1"),
            WriteOk(2.6, "w2"),
        )
    )
    assert "stale_overwrite" not in kinds(report)


@pytest.mark.parametrize(
    ("kind", "events"),
    [
        (
            "token_not_increasing",
            (Grant(0.0, "l", "a", 43, "id-a"), Grant(9.0, "l", "b", 41, "id-b")),
        ),
        (
            "token_granted_twice",
            (Grant(0.0, "l", "a", 43, "id-a"), Grant(0.0, "m", "b", 43, "id-m")),
        ),
        (
            "lease_id_granted_twice",
            (Grant(0.0, "l", "a", 41, "id-a"), Grant(9.0, "l", "a", 43, "id-a")),
        ),
        (
            "ungranted_token",
            (Grant(0.0, "l", "a", 41, "id-a"), write(1.0, "w", "a", 99, "id-a"), WriteOk(1.1, "w")),
        ),
        (
            "wrong_holder",
            (Grant(0.0, "l", "a", 41, "id-a"), write(1.0, "w", "b", 41, "id-a"), WriteOk(1.1, "w")),
        ),
        (
            "stale_overwrite",
            (
                Grant(0.0, "l", "a", 41, "id-a"),
                Grant(9.0, "l", "b", 43, "id-b"),
                write(10.0, "w1", "b", 43, "id-b"),
                WriteOk(10.1, "w1"),
                write(10.5, "w2", "a", 41, "id-a"),
                WriteOk(10.6, "w2"),
            ),
        ),
        (
            "superseded_admitted",
            (
                Grant(0.0, "l", "a", 41, "id-a"),
                write(1.0, "w1", "a", 41, "id-a"),
                WriteOk(1.1, "w1"),
                Grant(5.0, "l", "b", 43, "id-b"),  # a force release and the next grant ...
                write(6.0, "w2", "a", 41, "id-a"),  # ... before 43 wrote anything
                WriteOk(6.1, "w2"),
            ),
        ),
        (
            "visible_regressed",
            (
                ArtifactState(1.0, "l-out", "l", 43, "l-out/new"),
                ArtifactState(2.0, "l-out", "l", 41, "l-out/old"),
            ),
        ),
        (
            "write_after_stale",
            (
                Grant(0.0, "l", "a", 41, "id-a"),
                write(1.0, "w1", "a", 41, "id-a"),
                WriteFail(1.1, "w1", "stale_fence"),
                write(2.0, "w2", "a", 41, "id-a"),
                WriteOk(2.1, "w2"),
            ),
        ),
        (
            "admitted_without_webhook",
            (
                Grant(0.0, "l", "a", 41, "id-a"),
                Fault(1.0, "webhook_down", 3.0),
                write(1.5, "w", "a", 41, "id-a"),
                WriteOk(1.6, "w"),
            ),
        ),
    ],
)
def test_each_violation_is_reported(kind: str, events: tuple[Event, ...]) -> None:
    report = check(history(*events))
    assert kind in kinds(report), report.violations
    assert not report.safe
    assert all(v.detail and v.events for v in report.violations)


def test_strictly_greater_refuses_a_second_admitted_write_with_the_same_token() -> None:
    events = (
        Grant(0.0, "l", "a", 41, "id-a"),
        write(1.0, "w1", "a", 41, "id-a"),
        WriteOk(1.1, "w1"),
        write(2.0, "w2", "a", 41, "id-a"),
        WriteOk(2.1, "w2"),
    )
    assert check(history(*events, policy="AllowEqual")).safe
    assert kinds(check(history(*events, policy="StrictlyGreater"))) == ["stale_overwrite"]


def test_the_old_rule_is_now_reported() -> None:
    """Issue 36: under the article's rule a token was refused only below one already written,
    so a superseded holder's write to an artifact its successor never reached was admitted.
    The model follows the stronger rule: that history is a violation now, and only that."""
    events = (
        Grant(0.0, "l", "a", 41, "id-a"),
        write(1.0, "w1", "a", 41, "id-a"),
        WriteOk(1.1, "w1"),
        ArtifactState(1.1, "l-out", "l", 41, "l-out/w1"),
        Grant(5.0, "l", "b", 43, "id-b"),
        WriteInvoke(6.0, "w2", "l", "a", 41, "id-a", "l-other"),
        WriteOk(6.1, "w2"),
    )
    assert kinds(check(history(*events))) == ["superseded_admitted"]
    # The reference model with the webhook of before is reported on a generated campaign.
    old = check(run(SimConfig(seed=1, writes=1000, superseding=False)))
    assert "superseded_admitted" in kinds(old)
    # The same write sent before the newer grant was observed is honest.
    early = (*events[:4], WriteInvoke(4.0, "w2", "l", "a", 41, "id-a", "l-other"), *events[4:5])
    assert check(history(*early, WriteOk(6.1, "w2"))).safe


def test_a_history_round_trips_through_json_lines() -> None:
    original = history(*CLEAN)
    again = loads(dumps(original))
    assert again == original
    with pytest.raises(ValueError, match="history line 2"):
        loads([*dumps(original).splitlines()[:1], '{"type": "Grant", "t": 1}'])


def test_the_fenced_campaign_on_the_reference_model_is_safe() -> None:
    generated = run(SimConfig(seed=1, writes=1000))
    report = check(generated)
    assert report.safe, report.violations[:5]
    # The faults really happened and were fenced, not avoided.
    assert sum(1 for e in generated.events if isinstance(e, Fault) and e.kind == "pause") >= 20
    assert report.refused.get("stale_fence", 0) >= 10
    assert report.admitted >= 800


def test_the_checker_bites_on_the_unfenced_control() -> None:
    report = check(run(SimConfig(seed=1, writes=1000, fenced=False)))
    assert {"stale_overwrite", "visible_regressed"} <= set(kinds(report))
