"""The bench's reading of Prometheus histograms (bench/api_rows.py): both sides of the webhook
call, summed over matching series, differenced between two scrapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
api_rows = pytest.importorskip("api_rows")

NAME = "apiserver_admission_webhook_admission_duration_seconds"


def _series(labels: str, buckets: dict[str, int], total: float, count: int) -> list[str]:
    return [
        *(f'{NAME}_bucket{{{labels},le="{le}"}} {n}' for le, n in buckets.items()),
        f"{NAME}_sum{{{labels}}} {total}",
        f"{NAME}_count{{{labels}}} {count}",
    ]


def exposition(admitted_fast: int = 90, admitted: int = 100) -> str:
    base = 'name="fence.fencedlease.io",operation="UPDATE"'
    lines = [f"# TYPE {NAME} histogram"]
    lines += _series(
        f'{base},rejected="false",type="admit"',
        {"0.005": admitted_fast, "0.025": 99, "+Inf": admitted},
        0.4,
        admitted,
    )
    lines += _series(
        f'{base},rejected="true",type="admit"', {"0.005": 10, "0.025": 10, "+Inf": 10}, 0.02, 10
    )
    lines += _series(
        'name="fence.fencedlease.io",operation="CREATE",rejected="false",type="admit"',
        {"+Inf": 7},
        0.1,
        7,
    )
    return "\n".join(lines) + "\n"


def test_series_with_the_labels_are_summed_and_others_left_out() -> None:
    found = api_rows.histogram(exposition(), NAME, operation="UPDATE", type="admit")
    assert found.count == 110  # both rejected="..." series, not the CREATE one
    assert found.total == pytest.approx(0.42)
    assert found.buckets[0.005] == 100 and found.buckets[float("inf")] == 110
    assert found.mean_ms == pytest.approx(0.42 / 110 * 1e3)
    assert found.over(0.005) == pytest.approx(10 / 110)
    assert found.over(0.025) == pytest.approx(1 / 110)


def test_a_difference_of_two_scrapes_is_what_happened_between_them() -> None:
    before = api_rows.histogram(exposition(), NAME, operation="UPDATE")
    after = api_rows.histogram(exposition(95, 105), NAME, operation="UPDATE")
    between = after.since(before)
    assert between.count == 5 and between.buckets[0.005] == 5
    assert between.over(0.005) == 0.0
    assert api_rows.Histogram(0, 0, {}).mean_ms == 0.0


def test_differences_of_several_windows_add_up_to_what_happened_in_them() -> None:
    """The throughput summary sums the measured windows' differences (not their ramps)."""
    first = api_rows.histogram(exposition(95, 105), NAME, operation="UPDATE").since(
        api_rows.histogram(exposition(), NAME, operation="UPDATE")
    )
    second = api_rows.Histogram(3, 0.3, {0.025: 1.0, float("inf"): 3.0})
    both = first.plus(second)
    assert both.count == 8 and both.total == pytest.approx(first.total + 0.3)
    assert both.buckets[0.005] == 5  # a bound only one side has counts that side alone
    assert both.buckets[0.025] == first.buckets[0.025] + 1
    assert both.buckets[float("inf")] == 8
    assert both.over(0.025) == pytest.approx(1 - (first.buckets[0.025] + 1) / 8)


def test_the_fence_webhooks_calls_leave_out_the_null_webhooks() -> None:
    """kube-apiserver counts every webhook's calls in one histogram; the bench's calls per
    fenced write must not count the null webhook's (it is called as often)."""
    null = _series(
        'name="null.fencedlease.io",operation="UPDATE",rejected="false",type="admit"',
        {"0.005": 500, "0.025": 500, "+Inf": 500},
        0.3,
        500,
    )
    calls = api_rows.fence_calls(exposition() + "\n".join(null) + "\n")
    assert calls.count == 110
    assert calls.total == pytest.approx(0.42)
