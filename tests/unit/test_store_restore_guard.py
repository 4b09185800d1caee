"""The etcd store's restore guard without an etcd: ``EtcdStore`` over an in-memory etcd KV
(the two RPCs it uses, ``Txn`` and ``Range``, with etcd's revision rules).

The regression these tests pin: acquire writes without reading first, and a grant that
commits at or below the floor is refused and revoked, but that grant and its revoke still
advance etcd's revision by two.  Retried on every reconciler pass, the refusals climbed past
the floor by themselves, so a restored etcd started granting again without the
``--bump-revision`` restore, and the lease's RestoreGuard status lasted only a pass or two
(``tests/integration/test_operator_restore.py`` missed it).  The refusal must write nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aetcd import rpc

from fencedlease.authority.types import Acquired, StoreUnavailable
from fencedlease.controller.runtime import lease_reconciler
from fencedlease.models import FencedLeaseStatus
from fencedlease.store.etcd import EtcdStore
from tests.fakes import FakeClock, FakeWall
from tests.unit.test_reconciler import NS, PROOFS, World, condition

_EQUAL = rpc.Compare.CompareResult.EQUAL
_VERSION = rpc.Compare.CompareTarget.VERSION
_MOD = rpc.Compare.CompareTarget.MOD


@dataclass
class _Version:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


@dataclass
class FakeEtcdKV:
    """etcd's KV service in memory: one revision per writing transaction, compares on
    version and mod_revision, ranges with mod_revision filters.  ``revision`` starts at 1,
    as on a fresh (or freshly restored) etcd."""

    revision: int = 1
    data: dict[bytes, _Version] = field(default_factory=dict)
    writes: int = 0  # transactions that wrote

    def _header(self) -> Any:
        return rpc.ResponseHeader(revision=self.revision, cluster_id=1)

    def _kv(self, key: bytes) -> Any:
        v = self.data[key]
        return rpc.KeyValue(
            key=key,
            value=v.value,
            create_revision=v.create_revision,
            mod_revision=v.mod_revision,
            version=v.version,
        )

    def _range(self, request: Any) -> list[Any]:
        if not request.range_end:
            keys = [request.key] if request.key in self.data else []
        else:
            keys = sorted(k for k in self.data if request.key <= k < request.range_end)
        found = [self._kv(k) for k in keys]
        if request.min_mod_revision:
            found = [kv for kv in found if kv.mod_revision >= request.min_mod_revision]
        if request.max_mod_revision:
            found = [kv for kv in found if kv.mod_revision <= request.max_mod_revision]
        return found

    def _holds(self, compare: Any) -> bool:
        assert compare.result == _EQUAL, "the store compares for equality only"
        current = self.data.get(compare.key)
        if compare.target == _VERSION:
            return (current.version if current else 0) == cast(int, compare.version)
        assert compare.target == _MOD
        return (current.mod_revision if current else 0) == cast(int, compare.mod_revision)

    async def Range(self, request: Any, **_: Any) -> Any:  # the gRPC method name
        kvs = self._range(request)
        return rpc.RangeResponse(header=self._header(), kvs=kvs, count=len(kvs))

    async def Txn(self, request: Any, **_: Any) -> Any:  # the gRPC method name
        succeeded = all(self._holds(c) for c in request.compare)
        ops = request.success if succeeded else request.failure
        target = self.revision + 1  # every write of one transaction commits at one revision
        wrote = False
        responses = []
        for op in ops:
            kind = op.WhichOneof("request")
            if kind == "request_range":
                kvs = self._range(op.request_range)
                responses.append(
                    rpc.ResponseOp(response_range=rpc.RangeResponse(kvs=kvs, count=len(kvs)))
                )
            elif kind == "request_put":
                put, old = op.request_put, self.data.get(op.request_put.key)
                self.data[put.key] = _Version(
                    put.value,
                    old.create_revision if old else target,
                    target,
                    (old.version if old else 0) + 1,
                )
                wrote = True
                responses.append(rpc.ResponseOp(response_put=rpc.PutResponse()))
            else:
                assert kind == "request_delete_range"
                deleted = self.data.pop(op.request_delete_range.key, None) is not None
                wrote = wrote or deleted
                responses.append(
                    rpc.ResponseOp(
                        response_delete_range=rpc.DeleteRangeResponse(deleted=int(deleted))
                    )
                )
        if wrote:
            self.revision = target
            self.writes += 1
        return rpc.TxnResponse(header=self._header(), succeeded=succeeded, responses=responses)

    def bump(self, revisions: int) -> None:
        """``etcdutl snapshot restore --bump-revision``."""
        self.revision += revisions


def etcd_store(clock: FakeClock, kv: FakeEtcdKV) -> EtcdStore:
    store = EtcdStore(["http://etcd.invalid:2379"], clock=clock, wall=FakeWall(clock))
    store.client.kvstub = kv
    store.client._connected.set()
    return store


async def test_a_refused_grant_writes_nothing_until_etcd_is_bumped() -> None:
    kv, floor = FakeEtcdKV(), 40  # a restored etcd at revision 1; token 40 was issued
    store = etcd_store(FakeClock(), kv)
    assert await store.read(NS, "report") is None
    for _ in range(30):
        with pytest.raises(StoreUnavailable) as refused:
            await store.acquire(NS, "report", "a", 30.0, token_floor=floor)
        assert refused.value.code == "restore_guard"
        assert "--bump-revision" in refused.value.reason
    assert (kv.revision, kv.writes) == (1, 0)  # no grant committed, none revoked
    kv.bump(1_000)
    granted = await store.acquire(NS, "report", "a", 30.0, token_floor=floor)
    assert isinstance(granted, Acquired) and granted.token == 1_002 > floor


async def test_a_grant_that_committed_below_the_floor_is_revoked_once_then_reads_first() -> None:
    """A replica that saw etcd above the floor writes at once; if etcd went back meanwhile
    (restored under it), the grant commits below the floor: refused and revoked, and from
    then on this replica reads before it writes, so the next refusals write nothing."""
    kv, clock = FakeEtcdKV(), FakeClock()
    store = etcd_store(clock, kv)
    first = await store.acquire(NS, "report", "a", 5.0)
    assert isinstance(first, Acquired)
    for _ in range(10):  # renewals move etcd's revision well above the token
        clock.advance(1.0)
        await store.renew(NS, "report", first.lease_id, first.token)
    seen = kv.revision
    restored = FakeEtcdKV()  # restored from a snapshot taken before the grant
    store.client.kvstub = restored
    # A lease this replica never saw: compare on absence, which holds on the restored etcd.
    with pytest.raises(StoreUnavailable) as refused:
        await store.acquire(NS, "other", "b", 5.0, token_floor=seen)
    assert refused.value.code == "restore_guard"
    assert restored.writes == 2 and restored.data == {}  # the grant, then its revoke
    for name in ("other", "report", "third") * 7:
        with pytest.raises(StoreUnavailable) as again:
            await store.acquire(NS, name, "b", 5.0, token_floor=seen)
        assert again.value.code == "restore_guard"
    assert restored.writes == 2


async def test_the_reconciler_keeps_reporting_the_refusal_until_the_bump() -> None:
    """Through the reconciler: every pass shows RestoreGuard (one Event), the status keeps the
    signed token, nothing is granted; after the bump the next grant is above it."""
    w = World()
    clock, kv = w.clock, FakeEtcdKV()
    w.store = etcd_store(clock, kv)  # type: ignore[assignment]
    w.reconciler = lease_reconciler(
        w.store, w.kube, w.pods, w.leases, clock=clock, wall=FakeWall(clock)
    )
    w.pod("a", "2026-01-01T00:00:01Z")
    token, lease_id = 40, "before-restore"
    w.lease(
        FencedLeaseStatus.model_validate(
            {
                "fencingToken": token,
                "leaseId": lease_id,
                "tokenProof": PROOFS.sign(NS, "report", lease_id, token),
            }
        )
    )
    for _ in range(30):  # 2.5 minutes of passes at the reconciler's retry interval
        delay = await w.run()
        s = w.status
        assert s["phase"] == "Unavailable" and s["fencingToken"] == token
        assert condition(s, "TokensMonotonic")["reason"] == "RestoreGuard"
        assert delay is not None
        clock.advance(delay)
    assert w.kube.reasons().count("RestoreGuard") == 1 and "Granted" not in w.kube.reasons()
    assert kv.writes == 0
    kv.bump(1_000)
    await w.run()
    s = w.status
    assert s["phase"] == "Held" and s["fencingToken"] > token
    assert condition(s, "TokensMonotonic")["status"] == "True"
