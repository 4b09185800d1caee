"""What the reconciler remembers stays bounded by what exists: holder Pods that come and go
(a job per Pod) leave nothing behind."""

from __future__ import annotations

from tests.unit.test_reconciler import NS, World


async def test_ticks_of_holder_pods_that_are_gone_are_dropped() -> None:
    w = World()
    for i in range(300):
        w.pod(f"job-{i}", f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z")
        if i:
            w.pods.remove(NS, f"job-{i - 1}")  # the previous holder's Pod is deleted
        w.clock.advance(31.0)  # the previous grant expires: job-i is granted
        await w.run()
        assert w.state(f"job-{i}") == "held"
        w.clock.advance(10.0)
        assert await w.run() is not None  # renewed on job-i's ticks
    assert len(w.pods) == 1
    assert len(w.reconciler._ticks) <= 2 * len(w.pods) + 64 + 1


async def test_ticks_of_pods_still_cached_are_kept() -> None:
    w = World()
    for i in range(100):
        w.pod(f"job-{i}", f"2026-01-01T00:00:{i:02d}Z")
    w.pod("holder", "2025-12-31T00:00:00Z")  # the oldest: it holds
    assert await w.run() is not None
    anchor = dict(w.reconciler._ticks)
    assert any(tick[1] == "holder" for tick in anchor)
    w.clock.advance(10.0)
    w.reconciler._prune_ticks()
    assert w.reconciler._ticks == anchor
