"""The etcd store against a real etcd (started here as a local process on loopback ports).

Each test uses its own key prefix, so they share one etcd.  Clocks are fake (injected), so
expiry is deterministic; concurrency is real (etcd's compare decides every race).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import pytest
from prometheus_client import REGISTRY

from fencedlease.authority.types import (
    Acquired,
    Busy,
    FenceCode,
    FencingPolicy,
    LeaseState,
    NotHeld,
    Released,
    Renewed,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import EtcdServer, free_port
from fencedlease.store.connection import parse_endpoint
from fencedlease.store.etcd import EtcdStore
from tests.chaos.etcd import reserved_port
from tests.fakes import FakeClock
from tests.integration.store_checks import cached_leases, check, granted, publish, tls_etcd

pytestmark = pytest.mark.integration

NS = "default"


StoreFactory = Callable[..., EtcdStore]


@pytest.fixture
async def make_store(etcd: EtcdServer) -> AsyncIterator[StoreFactory]:
    """Stores ("operator replicas") on a per-test prefix; all closed at the end."""
    prefix = f"/t-{uuid.uuid4().hex[:8]}"
    stores: list[EtcdStore] = []

    def make(clock: Callable[[], float] | None = None, **kwargs: object) -> EtcdStore:
        store = EtcdStore(
            [etcd.endpoint],
            prefix=prefix,
            clock=clock or FakeClock(),
            **kwargs,  # type: ignore[arg-type]
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://127.0.0.1:2379") == ("127.0.0.1", 2379, False)
    assert parse_endpoint("https://etcd.example:4001") == ("etcd.example", 4001, True)
    assert parse_endpoint("10.0.0.1:2379") == ("10.0.0.1", 2379, False)
    with pytest.raises(ValueError):
        parse_endpoint("ftp://x:1")


async def test_token_is_commit_revision_and_renew_keeps_it(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock, skew_seconds=1.0)
    await store.connect()
    before = await store.current_revision()
    grants_before = _sample("fencedlease_grants_total")
    grant = await store.acquire(NS, "lease-a", "pod-a", 10.0)
    assert isinstance(grant, Acquired)
    assert _sample("fencedlease_grants_total") == grants_before + 1
    assert _sample("fencedlease_max_token_issued") >= grant.token
    assert grant.token > before
    assert grant.deadline_monotonic == clock.now + 10.0 - 1.0
    view = await store.read(NS, "lease-a")
    assert view is not None and view.token == grant.token == view.mod_revision
    assert view.record.token is None and not view.expired
    assert await granted(store, grant.token) == TokenGrant(NS, "lease-a", grant.lease_id, "pod-a")
    assert store.max_token_seen == grant.token

    clock.advance(5.0)
    renewed = await store.renew(NS, "lease-a", grant.lease_id, grant.token)
    assert isinstance(renewed, Renewed)
    assert (renewed.token, renewed.renewals) == (grant.token, 1)
    assert renewed.deadline_monotonic == clock.now + 9.0
    view = await store.read(NS, "lease-a")
    assert view is not None and view.token == grant.token and view.mod_revision > grant.token

    busy_before = _sample("fencedlease_acquire_busy_total")
    busy = await store.acquire(NS, "lease-a", "pod-b", 10.0)
    assert isinstance(busy, Busy) and busy.holder == "pod-a" and busy.token == grant.token
    assert _sample("fencedlease_acquire_busy_total") == busy_before + 1
    assert _sample("fencedlease_renewals_total", result="renewed") >= 1

    released = await store.release(NS, "lease-a", grant.lease_id, grant.token)
    assert released == Released(grant.lease_id, grant.token)
    again = await store.release(NS, "lease-a", grant.lease_id, grant.token)
    assert isinstance(again, Released) and again.already_released
    nxt = await store.acquire(NS, "lease-a", "pod-b", 10.0)
    assert isinstance(nxt, Acquired) and nxt.token > grant.token


async def test_50_concurrent_acquirers_one_grant_per_generation(
    make_store: StoreFactory,
) -> None:
    """50 acquirers spread over 5 replicas, 200 generations: exactly one ``Acquired`` per
    generation, and tokens strictly increase."""
    stores = [make_store() for _ in range(5)]
    for store in stores:
        await store.connect()
    tokens: list[int] = []
    for generation in range(200):
        results = await asyncio.gather(
            *(
                stores[i % 5].acquire(NS, "contended", f"pod-{i}", 60.0)
                for i in random.sample(range(50), 50)
            )
        )
        winners = [(i, r) for i, r in enumerate(results) if isinstance(r, Acquired)]
        assert len(winners) == 1, (generation, results)
        assert all(isinstance(r, Acquired | Busy) for r in results), results
        _, won = winners[0]
        assert not tokens or won.token > tokens[-1]
        tokens.append(won.token)
        holder = int(won.holder.removeprefix("pod-"))
        released = await stores[holder % 5].release(NS, "contended", won.lease_id, won.token)
        assert isinstance(released, Released) and not released.already_released
    assert len(set(tokens)) == 200


async def _contend(go: asyncio.Event, replica: EtcdStore, holder: str) -> object:
    await go.wait()
    return await replica.acquire(NS, "race", holder, 10.0)


async def test_two_replicas_racing_for_an_expired_lease_never_both_grant(
    make_store: StoreFactory,
) -> None:
    clock_a, clock_b = FakeClock(), FakeClock(5_000.0)  # unrelated monotonic origins
    replica_a, replica_b = make_store(clock_a), make_store(clock_b)
    first = await replica_a.acquire(NS, "race", "pod-0", 10.0)
    assert isinstance(first, Acquired)
    last = first.token
    for round_ in range(30):
        # Both replicas observe the current generation, then it expires on both clocks.
        for replica in (replica_a, replica_b):
            view = await replica.read(NS, "race")
            assert view is not None and not view.expired
        clock_a.advance(10.0)
        clock_b.advance(10.0)
        go = asyncio.Event()
        tasks = [
            asyncio.create_task(_contend(go, replica_a, f"a-{round_}")),
            asyncio.create_task(_contend(go, replica_b, f"b-{round_}")),
        ]
        go.set()
        results = await asyncio.gather(*tasks)
        granted = [r for r in results if isinstance(r, Acquired)]
        assert len(granted) == 1, results
        assert granted[0].took_over_expired and granted[0].token > last
        last = granted[0].token


async def test_delayed_release_and_renew_from_a_do_not_touch_b(make_store: StoreFactory) -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    replica_a, replica_b = make_store(clock_a), make_store(clock_b)
    grant_a = await replica_a.acquire(NS, "report-july", "worker-a", 10.0)
    assert isinstance(grant_a, Acquired)
    assert isinstance(await replica_b.acquire(NS, "report-july", "worker-b", 10.0), Busy)
    clock_a.advance(10.0)
    clock_b.advance(10.0)
    grant_b = await replica_b.acquire(NS, "report-july", "worker-b", 10.0)
    assert isinstance(grant_b, Acquired) and grant_b.token > grant_a.token

    late_release = await replica_a.release(NS, "report-july", grant_a.lease_id, grant_a.token)
    assert isinstance(late_release, NotHeld)
    assert late_release.reason.startswith("lease_id mismatch: current is " + grant_b.lease_id)
    late_renew = await replica_a.renew(NS, "report-july", grant_a.lease_id, grant_a.token)
    assert isinstance(late_renew, NotHeld) and late_renew.current_lease_id == grant_b.lease_id
    forged = await replica_a.release(NS, "report-july", grant_b.lease_id, grant_a.token)
    assert isinstance(forged, NotHeld) and forged.reason.startswith("token mismatch")
    old_force = await replica_a.force_release(NS, "report-july", grant_a.lease_id)
    assert isinstance(old_force, NotHeld)

    view = await replica_b.read(NS, "report-july")
    assert view is not None
    assert view.record.lease_id == grant_b.lease_id and view.record.state is LeaseState.HELD
    assert view.token == grant_b.token and view.mod_revision == grant_b.token  # untouched

    forced = await replica_a.force_release(NS, "report-july", grant_b.lease_id)
    assert isinstance(forced, Released) and forced.forced


async def test_expire_and_delete_keep_tokens_and_high_water_mark(make_store: StoreFactory) -> None:
    clock = FakeClock()
    store = make_store(clock)
    grant = await store.acquire(NS, "exp", "pod-a", 5.0)
    assert isinstance(grant, Acquired)
    assert isinstance(await store.expire(NS, "exp"), Busy)
    clock.advance(5.0)
    expired = await store.expire(NS, "exp", grant.lease_id)
    assert expired.kind == "expired"
    renew = await store.renew(NS, "exp", grant.lease_id, grant.token)
    assert isinstance(renew, NotHeld)
    assert await publish(store, "exp", grant.token) is FenceCode.APPLIED
    await store.delete(NS, "exp")
    assert await store.read(NS, "exp") is None
    hwm = await store.high_water_mark(NS, "exp")
    assert hwm is not None and hwm.token == grant.token
    assert await granted(store, grant.token) is not None
    regrant = await store.acquire(NS, "exp", "pod-b", 5.0)
    assert isinstance(regrant, Acquired) and regrant.token > grant.token


async def test_deleted_leases_leave_nothing_in_the_store_caches(
    make_store: StoreFactory,
) -> None:
    """Leases come and go under new names (a per-item job system): what the store caches about
    a lease goes with the lease, or memory grows with every name ever used."""
    store = make_store()
    for i in range(20):
        name = f"gone-{i}"
        grant = await store.acquire(NS, name, "pod", 30.0)
        assert isinstance(grant, Acquired)
        assert isinstance(await store.renew(NS, name, grant.lease_id, grant.token), Renewed)
        if i % 2:
            assert isinstance(await store.release(NS, name, grant.lease_id, grant.token), Released)
        await store.delete(NS, name)
    assert cached_leases(store) == 0
    kept = await store.acquire(NS, "kept", "pod", 30.0)
    assert isinstance(kept, Acquired)
    assert cached_leases(store) == 1


async def _grants(store: EtcdStore, name: str, count: int, holder: str = "pod") -> list[Acquired]:
    out = []
    for i in range(count):
        grant = await store.acquire(NS, name, f"{holder}-{i}", 30.0)
        assert isinstance(grant, Acquired)
        out.append(grant)
        released = await store.release(NS, name, grant.lease_id, grant.token)
        assert isinstance(released, Released)
    return out


async def test_fence_codes(make_store: StoreFactory) -> None:
    """The webhook's one read, decided by the pure rule; the mark follows committed writes."""
    store = make_store()
    g41, g42 = await _grants(store, "report-july", 2)
    (other,) = await _grants(store, "report-june", 1)
    allow, strict = FencingPolicy.ALLOW_EQUAL, FencingPolicy.STRICTLY_GREATER

    assert await publish(store, "report-july", g42.token) is FenceCode.APPLIED
    stale = await check(store, "report-july", g41.token)
    assert stale.code is FenceCode.STALE_FENCE
    assert stale.message == (
        f"stale_fence: token {g41.token} is below the high-water mark {g42.token} "
        "of lease default/report-july"
    )
    assert (await check(store, "report-july", g42.token, allow)).code is FenceCode.APPLIED
    assert (await check(store, "report-july", g42.token, strict)).code is FenceCode.STALE_FENCE
    future = await check(store, "report-july", other.token + 1_000)
    assert future.code is FenceCode.UNKNOWN_TOKEN
    mismatch = await check(store, "report-july", other.token)
    assert mismatch.code is FenceCode.LEASE_MISMATCH and other.token > g42.token
    wrong = await check(store, "report-july", g42.token, holder="intruder")
    assert wrong.code is FenceCode.HOLDER_MISMATCH
    assert wrong.message.startswith("holder_mismatch: ")
    hwm = await store.high_water_mark(NS, "report-july")
    assert hwm is not None and hwm.token == g42.token


async def test_concurrent_commits_never_move_the_high_water_mark_back(
    make_store: StoreFactory,
) -> None:
    stores = [make_store(), make_store()]
    grants = await _grants(stores[0], "concurrent", 10)
    tokens = [g.token for g in grants]
    done = asyncio.Event()
    samples: list[int] = []

    async def sample() -> None:
        while not done.is_set():
            hwm = await stores[1].high_water_mark(NS, "concurrent")
            samples.append(hwm.token if hwm else 0)

    sampler = asyncio.create_task(sample())
    order = [random.choice(tokens) for _ in range(60)]
    results = await asyncio.gather(
        *(stores[i % 2].record_commit(NS, "concurrent", t) for i, t in enumerate(order))
    )
    done.set()
    await sampler
    assert samples == sorted(samples) and len(samples) > 1
    hwm = await stores[0].high_water_mark(NS, "concurrent")
    assert hwm is not None and hwm.token == max(order)
    for token, result in zip(order, results, strict=True):
        assert result.verified and result.high_water_mark is not None
        assert result.high_water_mark >= token
    assert any(r.advanced and r.token == max(order) for r in results)


async def test_unreachable_etcd_is_unavailable_not_stale() -> None:
    store = EtcdStore([f"http://127.0.0.1:{free_port()}"], prefix="/x", timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable) as acquired:
            await store.acquire(NS, "l", "pod", 5.0)
        assert acquired.value.code == "etcd_error"
        with pytest.raises(StoreUnavailable) as raised:
            await store.grant_and_mark(NS, "l", 42)
        assert raised.value.code == "etcd_error"
        with pytest.raises(StoreUnavailable):
            await store.renew(NS, "l", "id", 42)
    finally:
        await store.close()


async def test_fails_over_to_the_next_endpoint(etcd: EtcdServer) -> None:
    """A dead first endpoint: that request raises StoreUnavailable, the next goes to the
    live one."""
    dead = f"http://127.0.0.1:{free_port()}"
    store = EtcdStore([dead, etcd.endpoint], prefix=f"/t-{uuid.uuid4().hex[:8]}", timeout=0.5)
    try:
        with pytest.raises(StoreUnavailable) as first:
            await store.acquire(NS, "failover", "pod-a", 5.0)
        assert first.value.code == "etcd_error"
        second = await store.acquire(NS, "failover", "pod-a", 5.0)
        assert isinstance(second, Acquired)
    finally:
        await store.close()


# ----------------------------------------------------------------------- restore guard


def _etcdutl_restore(snapshot: Path, data_dir: Path, peer_port: int, *extra: str) -> None:
    peer = f"http://127.0.0.1:{peer_port}"
    subprocess.run(
        [
            str(binary_path("etcdutl")),
            "snapshot",
            "restore",
            str(snapshot),
            f"--data-dir={data_dir}",
            "--name=default",
            f"--initial-cluster=default={peer}",
            f"--initial-advertise-peer-urls={peer}",
            *extra,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


async def test_restore_guard_and_bump_revision(tmp_path: Path) -> None:
    rng = random.Random()
    client_port, peer_port = reserved_port(rng), reserved_port(rng)

    def server(data: str) -> EtcdServer:
        return EtcdServer(tmp_path / data, tmp_path / f"{data}.log", client_port, peer_port)

    endpoint = f"http://127.0.0.1:{client_port}"
    live = EtcdStore([endpoint], prefix="/fencedlease", clock=FakeClock())  # survives restores
    etcd = server("original")
    etcd.start()
    try:
        await _grants(live, "report", 3)
        snapshot = tmp_path / "snap.db"
        with snapshot.open("wb") as out:
            await live.client.snapshot(out)
        issued = [g.token for g in await _grants(live, "report", 3)]
        highest = max(issued)
        assert live.max_token_seen == highest
    finally:
        etcd.stop()

    # 1. Restore the old snapshot as is: revisions go back below tokens already issued.
    _etcdutl_restore(snapshot, tmp_path / "restored", peer_port)
    etcd = server("restored")
    etcd.start()
    fresh = EtcdStore([endpoint], prefix="/fencedlease", clock=FakeClock())
    try:
        assert await fresh.current_revision() <= highest
        with pytest.raises(StoreUnavailable) as refused:
            await fresh.acquire(NS, "report", "pod-x", 30.0, token_floor=highest)
        assert refused.value.code == "restore_guard"
        assert "--bump-revision" in refused.value.reason
        await live.close()  # new channel to the restarted etcd; in-process memory is kept
        with pytest.raises(StoreUnavailable) as remembered:
            await live.acquire(NS, "report", "pod-x", 30.0)  # no floor passed
        assert remembered.value.code == "restore_guard"
        # Why the floor matters: a replica without it would reissue an old number.
        reissued = await fresh.acquire(NS, "report", "pod-x", 30.0)
        assert isinstance(reissued, Acquired) and reissued.token <= highest
    finally:
        await fresh.close()
        etcd.stop()

    # 2. Restore with --bump-revision: the next token is above everything issued before.
    _etcdutl_restore(
        snapshot, tmp_path / "bumped", peer_port, "--bump-revision=1000000", "--mark-compacted"
    )
    etcd = server("bumped")
    etcd.start()
    try:
        await live.close()
        grant = await live.acquire(NS, "report", "pod-y", 30.0, token_floor=highest)
        assert isinstance(grant, Acquired)
        assert grant.token > highest and grant.token > 1_000_000
    finally:
        await live.close()
        etcd.stop()


# ------------------------------------------------------------------------------------ TLS


async def test_tls_with_client_certificates(tmp_path: Path) -> None:
    """The TLS channel (aetcd only does plaintext): mutual TLS like the chart's external etcd."""
    process, endpoint, ca, client_pair = tls_etcd(tmp_path, "fencedlease")
    store = EtcdStore(
        [endpoint],
        ca_file=ca.cert,
        cert_file=client_pair.cert,
        key_file=client_pair.key,
        timeout=2.0,
    )
    no_cert = EtcdStore([endpoint], ca_file=ca.cert, timeout=2.0)
    try:
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # wait for etcd to serve (readiness poll, not an interleaving)
            assert process.alive(), process.log_tail()
            try:
                await store.current_revision()
                break
            except StoreUnavailable:
                assert asyncio.get_running_loop().time() < deadline, process.log_tail()
                await store.close()
                await asyncio.sleep(0.2)
        grant = await store.acquire(NS, "tls", "pod-a", 10.0)
        assert isinstance(grant, Acquired)
        with pytest.raises(StoreUnavailable) as refused:
            await no_cert.acquire(NS, "tls", "pod-b", 10.0)
        assert refused.value.code == "etcd_error"
    finally:
        await store.close()
        await no_cert.close()
        process.stop()


# ------------------------------------------------------------------- round trips (issue 15)


class _CountingKV:
    """Wraps the aetcd client's KV stub: counts every etcd KV round trip by method."""

    def __init__(self, stub: object) -> None:
        self._stub = stub
        self.calls: list[str] = []

    def __getattr__(self, method: str) -> object:
        target = getattr(self._stub, method)

        def call(*args: object, **kwargs: object) -> object:
            self.calls.append(method)
            return target(*args, **kwargs)

        return call

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


async def _counting(store: EtcdStore) -> _CountingKV:
    await store.connect()
    counter = _CountingKV(store.client.kvstub)
    store.client.kvstub = counter
    return counter


async def test_one_transaction_per_acquire_renew_release_and_fence_check(
    make_store: StoreFactory,
) -> None:
    clock = FakeClock()
    store = make_store(clock)
    kv = await _counting(store)
    grant = await store.acquire(NS, "rt", "pod-a", 10.0)  # first use: compare on absence
    assert isinstance(grant, Acquired) and kv.take() == ["Txn"]
    for _ in range(3):
        clock.advance(1.0)
        renewed = await store.renew(NS, "rt", grant.lease_id, grant.token)
        assert isinstance(renewed, Renewed) and kv.take() == ["Txn"]
    assert isinstance(await store.release(NS, "rt", grant.lease_id, grant.token), Released)
    assert kv.take() == ["Txn"]
    for i in range(3):  # acquire+release cycles on the cached version: 2 transactions each
        again = await store.acquire(NS, "rt", f"pod-{i}", 10.0)
        assert isinstance(again, Acquired) and again.token > grant.token
        assert kv.take() == ["Txn"]
        assert isinstance(await store.release(NS, "rt", again.lease_id, again.token), Released)
        assert kv.take() == ["Txn"]
    await store.grant_and_mark(NS, "rt", cast(Acquired, again).token)
    assert kv.take() == ["Txn"]
    await store.epoch()  # the metric label, read once per store
    kv.take()
    assert (await store.record_commit(NS, "rt", cast(Acquired, again).token)).advanced
    assert kv.take() == ["Txn", "Txn"]  # the read, then the mark's compare-and-swap


async def test_stale_cache_costs_one_more_transaction_and_stays_correct(
    make_store: StoreFactory,
) -> None:
    """Replica A decides on what it last saw; replica B changed the lease meanwhile. A's
    compare fails, its failure branch reads the key back, and A re-decides on that."""
    clock_a, clock_b = FakeClock(), FakeClock()
    replica_a, replica_b = make_store(clock_a), make_store(clock_b)
    grant = await replica_a.acquire(NS, "stale", "pod-a", 10.0)
    assert isinstance(grant, Acquired)
    assert isinstance(await replica_b.read(NS, "stale"), object)
    assert isinstance(await replica_b.release(NS, "stale", grant.lease_id, grant.token), Released)
    kv = await _counting(replica_a)
    renewed = await replica_a.renew(NS, "stale", grant.lease_id, grant.token)
    assert isinstance(renewed, NotHeld) and "released" in renewed.reason
    assert kv.take() == ["Txn"]  # failed compare + read-back, decided on the fresh version
    taken = await replica_b.acquire(NS, "stale", "pod-b", 10.0)
    assert isinstance(taken, Acquired)
    busy = await replica_a.acquire(NS, "stale", "pod-a", 10.0)
    assert isinstance(busy, Busy) and busy.holder == "pod-b" and kv.take() == ["Txn"]
    busy_again = await replica_a.acquire(NS, "stale", "pod-a", 10.0)  # cached as held
    assert isinstance(busy_again, Busy) and kv.take() == ["Range"]


async def test_token_record_written_when_the_grant_version_is_replaced(
    make_store: StoreFactory, etcd: EtcdServer
) -> None:
    """Until its version is replaced, a grant is found in the lease key; the replacing
    transaction (renew, release, expire, takeover, delete) writes ``<p>/tokens/<token>``."""
    clock = FakeClock()
    store = make_store(clock)
    first = await store.acquire(NS, "rec-a", "pod-a", 10.0, holder_uid="uid-a")
    assert isinstance(first, Acquired)
    raw = store._token_key(first.token)
    assert await store.client.get(raw) is None  # not yet: the lease key is the grant
    expected = TokenGrant(NS, "rec-a", first.lease_id, "pod-a", "uid-a")
    assert await granted(store, first.token) == expected
    assert (await store.grant_and_mark(NS, "rec-a", first.token)).grant == expected

    other = await store.acquire(NS, "rec-b", "pod-b", 10.0)
    assert isinstance(other, Acquired)  # another lease's fresh grant: lease_mismatch
    mismatch = await check(store, "rec-a", other.token)
    assert mismatch.code is FenceCode.LEASE_MISMATCH
    forged = await check(store, "rec-a", other.token + 1_000)
    assert forged.code is FenceCode.UNKNOWN_TOKEN

    clock.advance(1.0)
    assert isinstance(await store.renew(NS, "rec-a", first.lease_id, first.token), Renewed)
    found = await store.client.get(raw)
    assert found is not None and TokenGrant.from_json(found.value) == expected

    await store.delete(NS, "rec-b")  # deleting a grant version records its token
    assert await granted(store, other.token) == TokenGrant(NS, "rec-b", other.lease_id, "pod-b")
    assert (await store.grant_and_mark(NS, "rec-b", other.token)).grant is not None

    clock.advance(10.0)  # rec-a expires on this replica's clock: a takeover of a renewed one
    second = await store.acquire(NS, "rec-a", "pod-c", 10.0)
    assert isinstance(second, Acquired) and second.took_over_expired
    clock.advance(10.0)  # second expires without a renewal: the takeover records its token
    third = await store.acquire(NS, "rec-a", "pod-d", 10.0)
    assert isinstance(third, Acquired) and third.took_over_expired
    assert await store.client.get(store._token_key(second.token)) is not None
    superseded = await check(store, "rec-a", second.token, holder="pod-c")
    assert superseded.code is FenceCode.STALE_FENCE  # known (its record), and superseded
    assert superseded.message.startswith(f"stale_fence: token {second.token} was superseded")


async def test_grant_below_the_floor_is_revoked_in_etcd(make_store: StoreFactory) -> None:
    """The restore guard on the commit revision: a grant that committed at or below the
    floor is refused and deleted again, so its token never becomes issued.  (A replica
    writes without reading first only when it saw etcd at or above the floor: here it
    saw a revision the etcd it talks to now does not have yet, as after a restore.)"""
    store = make_store()
    floor = await store.current_revision() + 1_000
    store._head_revision = floor  # seen before the "restore"
    with pytest.raises(StoreUnavailable) as refused:
        await store.acquire(NS, "floor", "pod-a", 10.0, token_floor=floor)
    assert refused.value.code == "restore_guard"
    assert await store.read(NS, "floor") is None  # the committed grant was deleted
    head = await store.current_revision()
    assert await granted(store, head - 1) is None  # the revoked grant's revision
    fenced = await check(store, "floor", head - 1)
    assert fenced.code is FenceCode.UNKNOWN_TOKEN
    regranted = await store.acquire(NS, "floor", "pod-a", 10.0)
    assert isinstance(regranted, Acquired) and regranted.token > head


async def test_refused_grants_write_nothing_until_etcd_is_bumped(
    make_store: StoreFactory,
) -> None:
    """The restore guard's refusals must not advance etcd's revision by themselves (a
    committed-then-revoked grant costs two revisions; retried every pass, they would climb
    past the floor without the administrator's `--bump-revision` restore)."""
    store = make_store()
    await store.read(NS, "bump")  # what the reconciler does before it acquires
    floor = await store.current_revision() + 50
    kv = await _counting(store)
    for _ in range(40):
        with pytest.raises(StoreUnavailable) as refused:
            await store.acquire(NS, "bump", "pod-a", 10.0, token_floor=floor)
        assert refused.value.code == "restore_guard"
        assert "Txn" not in kv.take()  # read, judged, refused: nothing written
    assert await store.current_revision() < floor
    for i in range(floor - await store.current_revision()):  # the bump, by the administrator
        await store.client.put(b"/bump-" + NS.encode(), str(i).encode())
    granted = await store.acquire(NS, "bump", "pod-a", 10.0, token_floor=floor)
    assert isinstance(granted, Acquired) and granted.token > floor
