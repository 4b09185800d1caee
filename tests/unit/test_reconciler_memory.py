"""What the reconciler remembers stays bounded by what exists: holder Pods that come and go
(a job per Pod) leave nothing behind."""

from __future__ import annotations

from fencedlease.models import FencedLeaseStatus
from tests.unit.test_reconciler import KEY, NS, World


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
    assert len(w.reconciler.ticks) <= 2 * len(w.pods) + 64 + 1


async def test_ticks_of_pods_still_cached_are_kept() -> None:
    w = World()
    for i in range(100):
        w.pod(f"job-{i}", f"2026-01-01T00:00:{i:02d}Z")
    w.pod("holder", "2025-12-31T00:00:00Z")  # the oldest: it holds
    assert await w.run() is not None
    anchor = dict(w.reconciler.ticks.anchors)
    assert any(tick[1] == "holder" for tick in anchor)
    w.clock.advance(10.0)
    w.reconciler.ticks.prune()
    assert w.reconciler.ticks.anchors == anchor


async def test_what_was_reported_about_a_lease_goes_with_it() -> None:
    """An invalid lease is reported once per generation; deleted (its DELETED event pokes a
    last pass), nothing about it stays, and a lease re-created under its name is reported
    again."""
    w = World()
    w.spec = {"leaseDurationSeconds": "soon", "holderSelector": {}}
    for round_ in range(2):
        w.lease(FencedLeaseStatus())
        await w.run()
        await w.run()  # once per generation
        assert w.reconciler.memory.reported_spec_error(KEY) == 1
        assert len([e for e in w.kube.events if e[2] == "InvalidSpec"]) == round_ + 1
        w.leases.remove(KEY)
        assert await w.run() is None
        assert KEY not in w.reconciler.memory
