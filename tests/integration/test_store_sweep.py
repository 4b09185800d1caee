"""The legacy sweep on a real etcd (docs/tokens.md, "Retention"): token records and marks
written before retention existed are pruned by the rule the recording transactions apply,
never a record that a guarantee still needs, and never against a concurrent change.

"Legacy" state is made the way an older version left it: a lease record without a ``retained``
list (so nothing ever prunes its earlier records), and a deletion that removed only the lease
key, leaving records and mark behind without an etcd lease.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from aetcd import rpc

from fencedlease.authority.retention import SweepReport
from fencedlease.authority.types import (
    Acquired,
    HighWaterMark,
    LeaseKey,
    Released,
)
from fencedlease.store.etcd import EtcdStore
from tests.integration.conftest import StoreFactory
from tests.integration.store_checks import granted

pytestmark = pytest.mark.integration

NS = "default"
K = 3


async def handovers(store: EtcdStore, name: str, count: int) -> list[int]:
    tokens = []
    for i in range(count):
        grant = await store.acquire(NS, name, f"pod-{i}", 30.0)
        assert isinstance(grant, Acquired)
        assert isinstance(await store.release(NS, name, grant.lease_id, grant.token), Released)
        tokens.append(grant.token)
    return tokens


async def _kv(store: EtcdStore, key: bytes) -> Any | None:
    response = await store.client.kvstub.Range(
        rpc.RangeRequest(key=key), timeout=5, metadata=store.client.metadata
    )
    return response.kvs[0] if response.kvs else None


async def as_before_retention(store: EtcdStore, name: str) -> None:
    """Rewrite lease ``name``'s record without its retained list, as an older version wrote
    it (the lease is released, so its token is explicit and the rewrite changes no token)."""
    raw = store._lease_key(LeaseKey(NS, name))
    kv = await _kv(store, raw)
    assert kv is not None
    record = json.loads(kv.value)
    assert record["token"] is not None
    record.pop("retained")
    await store.client.put(raw, json.dumps(record).encode())
    store._forget(LeaseKey(NS, name))


async def known(store: EtcdStore, token: int) -> bool:
    return await granted(store, token) is not None


async def test_the_sweep_prunes_what_retention_would_have_and_keeps_the_rest(
    make_store: StoreFactory,
) -> None:
    older = make_store(generations=1000)  # an older version: records, but no pruning
    store = make_store()
    # A busy lease: six records from before, then K new generations fill its list.
    legacy = await handovers(older, "busy", 6)
    await as_before_retention(older, "busy")
    recent = await handovers(store, "busy", K)
    # A young lease: its list is not full yet, so its older records are still "the last K".
    young_legacy = await handovers(older, "young", 2)
    await as_before_retention(older, "young")
    young = await handovers(store, "young", 1)
    # A lease deleted by an older version: only its lease key went.
    gone = await handovers(older, "gone", 2)
    assert (await older.record_commit(NS, "gone", gone[-1])).advanced
    await older.client.delete(older._lease_key(LeaseKey(NS, "gone")))
    # A lease deleted by this version: records and mark wait in the window.
    windowed = await handovers(store, "windowed", 2)
    assert (await store.record_commit(NS, "windowed", windowed[-1])).advanced
    await store.delete(NS, "windowed")

    report = await store.sweep_legacy(page=4)  # several pages

    assert report.pruned == 6 + 2 + 1  # busy's legacy records; gone's records and mark
    assert report.changed == 0 and report.malformed == 0
    assert report.scanned == report.pruned + report.kept
    for token in legacy + gone:
        assert not await known(store, token)
    for token in recent + young_legacy + young + windowed:
        assert await known(store, token)
    assert await _kv(store, store._hwm_key(LeaseKey(NS, "gone"))) is None
    windowed_mark = await _kv(store, store._hwm_key(LeaseKey(NS, "windowed")))
    assert windowed_mark is not None and windowed_mark.lease != 0
    # What the guarantees need still answers; a pruned token is refused, as after pruning.
    assert not await known(store, legacy[-1])
    assert await known(store, recent[0])
    assert await known(store, young_legacy[0])

    again = await store.sweep_legacy()
    assert again.pruned == 0 and again.scanned == report.kept


async def test_a_mark_stays_while_a_record_of_its_lease_stays(make_store: StoreFactory) -> None:
    """Issue 31: a deleted lease's mark written back without the window's etcd lease (as
    ``record_commit`` did) was pruned by the sweep while the lease's records stayed in the
    window, so a token below the mark was admitted. No record may outlive its mark."""
    store = make_store()
    tokens = await handovers(store, "lx", 2)
    assert (await store.record_commit(NS, "lx", tokens[0])).advanced
    await store.delete(NS, "lx")
    raw = store._hwm_key(LeaseKey(NS, "lx"))
    await store.client.put(raw, HighWaterMark(tokens[-1]).to_json())  # permanent, lease gone

    report = await store.sweep_legacy()

    assert report.pruned == 0, report
    mark = await store.high_water_mark(NS, "lx")
    assert mark is not None and mark.token == tokens[-1]
    assert (await store.grant_and_mark(NS, "lx", tokens[0])).grant is not None  # in the window


async def test_a_lease_that_changes_under_the_sweep_keeps_its_records_until_the_next_one(
    make_store: StoreFactory,
) -> None:
    older = make_store(generations=1000)
    legacy = await handovers(older, "busy", 5)
    await as_before_retention(older, "busy")
    other = make_store()
    await handovers(other, "busy", K)

    class Raced(EtcdStore):
        """A handover commits between the sweep's read and its conditional delete."""

        raced = False

        async def _txn(self, operation: str, compare: list[Any], *args: Any) -> Any:
            if operation == "sweep" and compare and not self.raced:
                self.raced = True
                await handovers(other, "busy", 1)
            return await super()._txn(operation, compare, *args)

    store = cast(Raced, make_store(cls=Raced))
    report = await store.sweep_legacy()
    assert store.raced
    assert report.pruned == 0 and report.changed == len(legacy)
    for token in legacy:
        assert await known(store, token)

    assert (await store.sweep_legacy()).pruned == len(legacy)
    for token in legacy:
        assert not await known(store, token)


async def test_keys_it_cannot_read_are_left_alone(make_store: StoreFactory) -> None:
    store = make_store()
    await handovers(store, "job", 1)
    junk = store._key("tokens") + b"/not-a-number"
    await store.client.put(junk, b"{}")
    await store.client.put(store._token_key(1), b"not json")
    seen: list[SweepReport] = []
    report = await store.sweep_legacy(progress=lambda r: seen.append(SweepReport(**_fields(r))))
    assert report.malformed == 2 and report.pruned == 0
    assert seen and seen[-1] == report
    assert await _kv(store, junk) is not None


def _fields(report: SweepReport) -> dict[str, int]:
    return {f: getattr(report, f) for f in ("scanned", "pruned", "kept", "changed", "malformed")}
