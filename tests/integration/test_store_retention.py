"""Retention on a real etcd (docs/tokens.md, "Retention"): token records are pruned by the
transaction that records a new one, a deleted lease's records and mark go to a bucketed etcd
lease, and the key count stays bounded (the short version of ``bench/etcd_soak.py``).

Pruning only ever removes a token record: a pruned token is refused (``unknown_token``) and
never accepted again, not even by a lease re-created under the same name.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from aetcd import rpc
from bench.etcd_soak import SoakConfig, count_keys, over_bound, run_soak

from fencedlease.authority.types import (
    Acquired,
    FenceCode,
    LeaseKey,
    Released,
    Renewed,
    StoreUnavailable,
)
from fencedlease.local.cluster import EtcdServer
from fencedlease.store.etcd import EtcdStore
from tests.fakes import FakeClock
from tests.integration.conftest import StoreFactory
from tests.integration.store_checks import granted, publish

pytestmark = pytest.mark.integration

NS = "default"


async def handovers(store: EtcdStore, name: str, count: int) -> list[Acquired]:
    out = []
    for i in range(count):
        grant = await store.acquire(NS, name, f"pod-{i}", 30.0)
        assert isinstance(grant, Acquired)
        released = await store.release(NS, name, grant.lease_id, grant.token)
        assert isinstance(released, Released)
        out.append(grant)
    return out


async def fence_code(store: EtcdStore, name: str, token: int, **kwargs: object) -> FenceCode:
    """The webhook's verdict, and the mark advanced as the controller would once committed."""
    return await publish(store, name, token, **kwargs)


async def token_records(store: EtcdStore) -> int:
    count, _ = await count_keys(store, store._key("tokens").decode())
    return count


async def test_pruned_tokens_are_refused_and_never_accepted(make_store: StoreFactory) -> None:
    store = make_store(generations=3)
    grants = await handovers(store, "job", 8)
    assert await token_records(store) == 3  # the last K recorded generations
    lease = await store.read(NS, "job")
    assert lease is not None and lease.record.retained == tuple(g.token for g in grants[5:])
    # No write was ever fenced (no mark), so before retention every one of these tokens was
    # "applied": a pruned token is refused instead, and never moves the mark. It is below the
    # lease's current generation, so the answer stays precise: stale_fence, not unknown_token.
    for old in grants[:5]:
        assert await granted(store, old.token) is None
        assert await fence_code(store, "job", old.token) is FenceCode.STALE_FENCE
        mark = await store.record_commit(NS, "job", old.token)
        assert not mark.verified and not mark.advanced
    assert await store.high_water_mark(NS, "job") is None
    assert await fence_code(store, "job", grants[-1].token) is FenceCode.APPLIED
    assert await fence_code(store, "job", grants[-2].token) is FenceCode.STALE_FENCE


async def test_the_first_renew_records_and_prunes_in_its_one_transaction(
    make_store: StoreFactory,
) -> None:
    store = make_store(generations=2)
    first, second = await handovers(store, "renewed", 2)
    grant = await store.acquire(NS, "renewed", "pod-now", 30.0)
    assert isinstance(grant, Acquired)
    # The current generation is known from its lease key; the two before from their records.
    assert await token_records(store) == 2
    assert await granted(store, first.token) is not None
    renewed = await store.renew(NS, "renewed", grant.lease_id, grant.token)
    assert isinstance(renewed, Renewed)
    assert await token_records(store) == 2  # recorded grant's token, pruned `first`
    assert await granted(store, first.token) is None
    assert await granted(store, second.token) is not None
    assert await fence_code(store, "renewed", grant.token, holder="pod-now") is FenceCode.APPLIED


async def _attached_lease(store: EtcdStore, key: bytes) -> int:
    response = await store.client.kvstub.Range(
        rpc.RangeRequest(key=key), timeout=5, metadata=store.client.metadata
    )
    (kv,) = response.kvs
    return int(kv.lease)


async def test_delete_hands_records_and_mark_to_the_window_and_an_old_token_stays_refused(
    make_store: StoreFactory,
) -> None:
    window = 600.0
    store = make_store(generations=3, window=window)
    old = await handovers(store, "job", 4)
    assert await fence_code(store, "job", old[-1].token) is FenceCode.APPLIED
    live = await store.acquire(NS, "job", "pod-live", 30.0)  # deleted while held
    assert isinstance(live, Acquired)
    await store.delete(NS, "job")
    assert store._bucket_lease is not None
    bucket_lease = store._bucket_lease[1]
    ttl = await store.client.leasestub.LeaseTimeToLive(
        rpc.LeaseTimeToLiveRequest(ID=bucket_lease, keys=True),
        timeout=5,
        metadata=store.client.metadata,
    )
    assert window <= ttl.grantedTTL <= 2 * window + 1
    attached = set(ttl.keys)
    expected = {store._token_key(g.token) for g in [*old[1:], live]}
    assert expected | {store._hwm_key(LeaseKey(NS, "job"))} == attached

    # Inside the window: a re-created lease of the same name refuses the old tokens, the
    # deleted lease's newest one too (it was applied until a newer write reached the lease).
    new = await store.acquire(NS, "job", "pod-new", 30.0)
    assert isinstance(new, Acquired) and new.token > live.token
    assert await fence_code(store, "job", old[-2].token) is FenceCode.STALE_FENCE
    assert await fence_code(store, "job", live.token) is FenceCode.STALE_FENCE

    # The window ends (etcd revokes the lease at its TTL; here at once): records and mark go
    # together, and no old token is accepted against the re-created lease, even with no mark.
    await store.client.leasestub.LeaseRevoke(
        rpc.LeaseRevokeRequest(ID=bucket_lease), timeout=5, metadata=store.client.metadata
    )
    assert await store.high_water_mark(NS, "job") is None
    for token in [g.token for g in old] + [live.token]:
        assert await granted(store, token) is None
        assert await fence_code(store, "job", token) is FenceCode.STALE_FENCE  # below `new`
    assert await fence_code(store, "job", new.token) is FenceCode.APPLIED
    # The re-created lease's own mark is not attached to any window.
    assert await _attached_lease(store, store._hwm_key(LeaseKey(NS, "job"))) == 0


async def test_a_mark_advanced_after_the_delete_belongs_to_the_recreated_lease(
    make_store: StoreFactory,
) -> None:
    store = make_store(generations=3)
    (old,) = await handovers(store, "job", 1)
    assert await fence_code(store, "job", old.token) is FenceCode.APPLIED
    await store.delete(NS, "job")
    assert await _attached_lease(store, store._hwm_key(LeaseKey(NS, "job"))) != 0
    new = await store.acquire(NS, "job", "pod-new", 30.0)
    assert isinstance(new, Acquired)
    assert (await store.record_commit(NS, "job", new.token)).advanced
    assert await _attached_lease(store, store._hwm_key(LeaseKey(NS, "job"))) == 0
    assert store._bucket_lease is not None
    await store.client.leasestub.LeaseRevoke(
        rpc.LeaseRevokeRequest(ID=store._bucket_lease[1]),
        timeout=5,
        metadata=store.client.metadata,
    )
    mark = await store.high_water_mark(NS, "job")
    assert mark is not None and mark.token == new.token
    assert await granted(store, old.token) is None
    assert await fence_code(store, "job", old.token) is FenceCode.STALE_FENCE  # below the mark
    # The next delete in this bucket finds its etcd lease gone: it grants another one.
    revoked = store._bucket_lease[1]
    await store.delete(NS, "job")
    assert store._bucket_lease is not None and store._bucket_lease[1] != revoked
    assert await _attached_lease(store, store._hwm_key(LeaseKey(NS, "job"))) != 0


async def test_short_soak_key_count_stays_bounded(etcd: EtcdServer) -> None:
    """2,000 handovers on 20 leases with deletes and re-creates, K = 4, a 2 s window: once
    the window has passed, every lease holds at most its key, its mark and K records.
    Without pruning this would be over 2,000 token records (and without the window, five
    keys per deleted lease)."""
    generations, leases = 4, 20
    config = SoakConfig(
        handovers=2_000,
        leases=leases,
        workers=4,
        samples=4,
        delete_every=25,
        keep_revisions=500,
        generations=generations,
        deleted_window_seconds=2.0,
        prefix=f"/soak-{uuid.uuid4().hex[:8]}",
    )
    samples = await run_soak(etcd.endpoint, config)
    assert samples[-1].handovers == 2_000
    assert not over_bound(samples), samples
    bound = leases * (generations + 2)
    store = EtcdStore([etcd.endpoint], prefix=config.prefix)
    async with store:
        deadline = time.monotonic() + 30.0  # two windows, plus etcd's lease expiry checks
        while (keys := (await count_keys(store, config.prefix))[0]) > bound:
            assert time.monotonic() < deadline, f"{keys} keys under the prefix, bound {bound}"
            await asyncio.sleep(0.5)  # waiting for etcd's TTL, a deadline, not a race
    assert max(s.keys for s in samples) < 2_000 // 4


def test_soak_script_writes_its_report(tmp_path: Path, etcd: EtcdServer) -> None:
    del etcd  # the script starts its own etcd
    from bench.etcd_soak import main

    code = main(
        ["--handovers", "600", "--leases", "10", "--workers", "2", "--samples", "4",
         "--generations", "2", "--delete-every", "0", "--keep-revisions", "50",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    report = (tmp_path / "etcd_soak.md").read_text()
    assert "| 600 |" in report and (tmp_path / "etcd_soak.png").stat().st_size > 0


async def test_an_old_committed_token_whose_record_was_pruned_is_retired(
    make_store: StoreFactory,
) -> None:
    store = make_store(generations=2)
    (first,) = await handovers(store, "art", 1)
    assert (await store.record_commit(NS, "art", first.token)).advanced
    later = await handovers(store, "art", 3)
    assert (await store.record_commit(NS, "art", later[-1].token)).advanced
    old = await store.record_commit(NS, "art", first.token)  # an old artifact, re-listed
    assert (old.verified, old.advanced, old.retired) == (False, False, True)
    forged = await store.record_commit(NS, "art", later[-1].token + 1)
    assert (forged.verified, forged.advanced, forged.retired) == (False, False, False)


async def test_at_the_quota_writes_are_unavailable_and_fence_checks_still_answer(
    tmp_path: Path,
) -> None:
    """docs/operations.md, "etcd maintenance": the NOSPACE alarm refuses every writing
    transaction (a grant raises ``StoreUnavailable``, never a wrong answer) while the webhook's
    read-only fence check keeps answering; compaction, defrag and disarm recover."""
    server = EtcdServer(tmp_path / "data", tmp_path / "etcd.log", quota_backend_bytes=4 * 2**20)
    server.start()
    try:
        store = EtcdStore([server.endpoint], prefix="/quota", clock=FakeClock(), timeout=10)
        async with store:
            (grant,) = await handovers(store, "job", 1)
            client, blob = store.client, b"x" * 1_000_000
            with pytest.raises(Exception, match="space"):
                # Fill the backend past its quota. etcd checks the quota against the backend's
                # size as of its last commit (one every 100 ms): twenty quick puts can all land
                # in one batch, so keep writing (bounded) until etcd refuses.
                for i in range(200):
                    await client.put(b"/filler/%d" % (i % 20), blob)
            with pytest.raises(StoreUnavailable) as refused:
                await store.acquire(NS, "job", "pod-b", 30.0)
            assert refused.value.code == "etcd_error"
            found = (await store.grant_and_mark(NS, "job", grant.token)).grant
            assert found is not None and found.lease_id == grant.lease_id
            # Recovery: free space, compact, defragment, disarm.
            await client.delete_prefix(b"/filler/")
            _, head = await count_keys(store, "/")
            await client.kvstub.Compact(
                rpc.CompactionRequest(revision=head, physical=True), timeout=30
            )
            await client.maintenancestub.Defragment(rpc.DefragmentRequest(), timeout=60)
            alarms = await client.maintenancestub.Alarm(
                rpc.AlarmRequest(action=rpc.AlarmRequest.GET), timeout=10
            )
            assert [a.alarm for a in alarms.alarms] == [rpc.NOSPACE]
            for alarm in alarms.alarms:  # what `etcdctl alarm disarm` does
                await client.maintenancestub.Alarm(
                    rpc.AlarmRequest(
                        action=rpc.AlarmRequest.DEACTIVATE,
                        memberID=alarm.memberID,
                        alarm=alarm.alarm,
                    ),
                    timeout=10,
                )
            assert isinstance(await store.acquire(NS, "job", "pod-b", 30.0), Acquired)
    finally:
        server.stop()
