"""The exposition has no ``*_created`` series (one extra timestamp per counter child)."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest

from fencedlease import metrics


def test_counters_and_histograms_export_no_created_series() -> None:
    metrics.GRANTS.inc()
    text = generate_latest(REGISTRY).decode()
    assert "fencedlease_grants_total" in text
    assert "_created" not in text
