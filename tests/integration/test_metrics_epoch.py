"""Fence results carry the lease service's epoch (etcd cluster id) as a bounded label."""

from __future__ import annotations

import uuid

from fencedlease import metrics
from fencedlease.authority.types import Acquired
from fencedlease.store.etcd import EtcdStore
from tests.unit.reviews import NS, answer, art, checker, review


async def test_stale_rejection_is_counted_with_result_operation_and_epoch(
    etcd_endpoint: str,
) -> None:
    name = f"epoch-{uuid.uuid4().hex[:6]}"
    async with EtcdStore([etcd_endpoint], prefix=f"/t-{name}") as store:
        old = await store.acquire(NS, name, "pod-a", 30)
        assert isinstance(old, Acquired)
        assert (await store.release(NS, name, old.lease_id, old.token)).kind == "released"
        new = await store.acquire(NS, name, "pod-b", 30)
        assert isinstance(new, Acquired)
        c = checker(store)  # type: ignore[arg-type]  # the real store behind the webhook
        epoch = await store.epoch()
        assert epoch != "unknown" and int(epoch, 16) > 0
        before = metrics.FENCE_RESULTS.labels("stale_fence", "create", epoch)._value.get()
        ok, message = answer(await c.review(review("CREATE", art(old.token, lease=name))))
        assert not ok and message.startswith("stale_fence"), message
        ok, message = answer(await c.review(review("CREATE", art(new.token, lease=name))))
        assert ok, message
        await c.settle()
        after = metrics.FENCE_RESULTS.labels("stale_fence", "create", epoch)._value.get()
        assert after == before + 1
