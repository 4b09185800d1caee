"""The Event correlator's decisions (client-go's EventCorrelator), on a fake clock."""

from __future__ import annotations

import pytest

from fencedlease.authority.correlation import COMBINED, Dropped, EventCorrelator, Record
from tests.fakes import FakeClock

ART = ("FencedArtifact", "ns", "cat")
OTHER = ("FencedArtifact", "ns", "dog")


def post(c: EventCorrelator, obj: object, message: str = "stale", reason: str = "R") -> Record:
    """Observe and, like the sink after a successful API call, record the post."""
    decision = c.observe(obj, "Warning", reason, message)
    assert isinstance(decision, Record), decision
    c.posted(decision, decision.name or f"event-{len(decision.key)}-{decision.count}")
    return decision


def test_the_same_reason_on_the_same_object_is_one_event_with_a_growing_count() -> None:
    clock = FakeClock()
    c = EventCorrelator(clock)
    first = post(c, ART)
    assert (first.name, first.count) == (None, 1)  # create
    clock.advance(7)
    later = [post(c, ART) for _ in range(4)]
    assert [r.count for r in later] == [2, 3, 4, 5]
    assert {r.name for r in later} == {"event-4-1"}  # all patch the Event the first created
    assert later[-1].first == first.first and later[-1].last == clock.now


def test_another_object_type_or_reason_is_another_event() -> None:
    c = EventCorrelator(FakeClock())
    post(c, ART)
    assert post(c, OTHER).name is None
    assert post(c, ART, reason="Other").name is None
    assert isinstance(d := c.observe(ART, "Normal", "R", "stale"), Record) and d.name is None


def test_an_observation_whose_post_failed_is_not_in_the_count() -> None:
    c = EventCorrelator(FakeClock())
    assert isinstance(lost := c.observe(ART, "Warning", "R", "stale"), Record)
    assert lost.name is None  # never posted: the next one creates the Event again
    again = post(c, ART)
    assert (again.name, again.count) == (None, 1)
    assert post(c, ART).count == 2


def test_a_flood_on_one_object_is_rate_limited_and_refills_slowly() -> None:
    clock = FakeClock()
    c = EventCorrelator(clock, burst=25, refill_seconds=300)
    decisions = [c.observe(ART, "Warning", "R", "stale") for _ in range(296)]
    posted = [d for d in decisions if isinstance(d, Record)]
    assert len(posted) == 25 and all(d == Dropped("rate_limited") for d in decisions[25:])
    assert isinstance(post(c, OTHER), Record)  # the bucket is per object
    clock.advance(299)
    assert isinstance(c.observe(ART, "Warning", "R", "stale"), Dropped)
    clock.advance(1)  # one token per 300 s
    assert isinstance(c.observe(ART, "Warning", "R", "stale"), Record)
    assert isinstance(c.observe(ART, "Warning", "R", "stale"), Dropped)
    clock.advance(300 * 100)
    assert sum(isinstance(c.observe(ART, "Warning", "R", "s"), Record) for _ in range(30)) == 25


def test_counts_plus_drops_are_every_observation() -> None:
    clock = FakeClock()
    c = EventCorrelator(clock, burst=5, refill_seconds=10)
    counts: dict[object, int] = {}
    dropped = 0
    for i in range(200):
        clock.advance(1)
        decision = c.observe(ART, "Warning", "R", f"token {i % 3}")
        if isinstance(decision, Dropped):
            dropped += 1
            continue
        c.posted(decision, decision.name or f"e{i}")
        counts[decision.key] = decision.count
    assert len(counts) == 3  # one Event per message
    assert sum(counts.values()) + dropped == 200 and dropped > 0


def test_many_different_messages_are_combined_into_one_event() -> None:
    clock = FakeClock()
    c = EventCorrelator(clock, similar_max=10, similar_window=600, burst=1000)
    singles = [post(c, ART, f"token {i} below mark 99") for i in range(9)]
    assert all(r.name is None and r.count == 1 for r in singles)
    combined = [post(c, ART, f"token {i} below mark 99") for i in range(9, 40)]
    assert combined[0].name is None and combined[0].message == COMBINED + "token 9 below mark 99"
    assert [r.count for r in combined] == list(range(1, 32))
    assert len({r.name for r in combined[1:]}) == 1
    assert post(c, ART, "token 3 below mark 99").count == 2  # a known message keeps its Event
    clock.advance(601)  # a pause resets the similarity window
    fresh = post(c, ART, "token 77 below mark 99")
    assert not fresh.message.startswith(COMBINED)


def test_state_is_bounded() -> None:
    c = EventCorrelator(FakeClock(), max_entries=3, burst=1)
    for i in range(10):
        post(c, ("FencedArtifact", "ns", f"a{i}"))
    first = c.observe(("FencedArtifact", "ns", "a0"), "Warning", "R", "stale")
    assert isinstance(first, Record) and first.name is None  # forgotten: a full burst, new Event


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="burst"):
        EventCorrelator(FakeClock(), burst=0)
