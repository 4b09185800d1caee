"""``make demo``'s verdict: exit 0 only when the stale write was refused and the new holder's
report kept (the story itself runs in tests/integration/test_demo.py)."""

from __future__ import annotations

import dataclasses

import pytest

from fencedlease.local.demo import REPORT_A, REPORT_B, Step, Timeline, _verdict


def fenced() -> Timeline:
    return Timeline(
        steps=[Step(0.0, "writer-a", "granted")],
        token_a=14,
        token_b=21,
        b_result="applied",
        a_result="stale_fence",
        refusal="stale_fence: token 14 is below the high-water mark 21 of lease d/report-july",
        kept_ref=REPORT_B,
        kept_token=21,
    )


def test_a_refused_stale_write_with_the_new_report_kept_exits_0() -> None:
    assert fenced().fenced
    assert _verdict(fenced()) == 0


@pytest.mark.parametrize(
    "change",
    [
        {"a_result": "applied"},  # the stale write went through
        {"kept_ref": REPORT_A},  # the old holder's report is visible
        {"kept_token": 14},
        {"b_result": "unavailable"},  # the new holder never wrote
        {"token_b": 14},  # no greater token
        {"token_b": None},
    ],
)
def test_anything_else_exits_1(
    change: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    timeline = dataclasses.replace(fenced(), **change)  # type: ignore[arg-type]
    assert not timeline.fenced
    assert _verdict(timeline) == 1
    assert "FAILED" in capsys.readouterr().err


def test_a_step_prints_as_a_timeline_line() -> None:
    assert Step(1.25, "fence", "REFUSED").line() == "   1.2s  fence     REFUSED"
