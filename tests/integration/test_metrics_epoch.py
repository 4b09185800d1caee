"""Fence results carry the lease service's epoch (etcd cluster id) as a bounded label."""

from __future__ import annotations

import uuid

from fencedlease import metrics
from fencedlease.authority.types import Acquired, FenceCode
from fencedlease.store.etcd import EtcdStore


async def test_stale_rejection_is_counted_with_result_operation_and_epoch(
    etcd_endpoint: str,
) -> None:
    name = f"epoch-{uuid.uuid4().hex[:6]}"
    async with EtcdStore([etcd_endpoint], prefix=f"/t-{name}") as store:
        old = await store.acquire("ns", name, "pod-a", 30)
        assert isinstance(old, Acquired)
        assert (await store.release("ns", name, old.lease_id, old.token)).kind == "released"
        new = await store.acquire("ns", name, "pod-b", 30)
        assert isinstance(new, Acquired)
        applied = await store.fence("ns", name, new.token, operation="publish")
        assert getattr(applied, "code", None) is FenceCode.APPLIED
        epoch = await store.epoch()
        assert epoch != "unknown" and int(epoch, 16) > 0
        before = metrics.FENCE_RESULTS.labels("stale_fence", "publish", epoch)._value.get()
        stale = await store.fence("ns", name, old.token, operation="publish")
        assert getattr(stale, "code", None) is FenceCode.STALE_FENCE
        after = metrics.FENCE_RESULTS.labels("stale_fence", "publish", epoch)._value.get()
        assert after == before + 1
