"""A FencedLease's deletion on its own (``controller/deletions.py``): the in-memory authority,
recorded Kubernetes writes, no reconciler."""

from __future__ import annotations

from typing import Any

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import Acquired, LeaseKey
from fencedlease.controller.deletions import Deletions
from fencedlease.controller.grants import Memories
from fencedlease.controller.leases import LEASE_FINALIZER, LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.controller.podwrites import PodWrites
from fencedlease.models import pod_annotation_keys
from tests.fakes import FakeClock, FakeWall, RecordingKube

NS = "ns"
KEY = LeaseKey(NS, "report")
STATE = pod_annotation_keys("report")["state"]


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.store = AsyncMemoryStore(clock=self.clock, wall=FakeWall(self.clock))
        self.kube = RecordingKube()
        self.pods = PodCache()
        self.leases = LeaseCache(TokenProofs(b"k" * 32))
        self.deletions = Deletions(
            self.store,
            self.kube,
            self.leases,
            Memories(),
            PodWrites(self.kube, self.pods, clock=self.clock),
        )

    async def held_by_a(self, *finalizers: str) -> tuple[LeaseObject, int]:
        """The lease in the cache with ``finalizers``, granted in etcd to Pod "a", which reads
        it ``held``; returns the lease and the grant's token."""
        body: dict[str, Any] = {
            "metadata": {"namespace": NS, "name": "report", "uid": "u", "generation": 1},
            "spec": {"leaseDurationSeconds": 30, "holderSelector": {"matchLabels": {"a": "w"}}},
            "status": {},
        }
        lease = LeaseObject.from_body(body)
        lease.finalizers = finalizers
        self.leases.upsert(lease)
        result = await self.store.acquire(NS, "report", "a", 30, holder_uid="uid-a")
        assert isinstance(result, Acquired)
        self.pods.upsert(
            PodInfo(NS, "a", "uid-a", "2026-01-01T00:00:01Z", {}, {STATE: "held"}, True, True)
        )
        return lease, result.token

    def state(self) -> str | None:
        return self.kube.annotations.get((NS, "a"), {}).get(STATE)


async def test_deleting_releases_cleans_the_holder_and_takes_only_our_finalizer_off() -> None:
    w = World()
    lease, _ = await w.held_by_a(LEASE_FINALIZER, "example.com/other")
    lease.deleting = True
    await w.deletions.deleting(lease)
    assert await w.store.read(NS, "report") is None  # released, its record deleted
    assert w.state() is None  # Pod "a" no longer reads a grant
    assert w.kube.lease_finalizers == [(NS, "report", ["example.com/other"])]
    assert w.leases.get(KEY) is not None  # another finalizer holds it: its watch says when


async def test_deleting_with_only_our_finalizer_forgets_the_lease_at_once() -> None:
    """Gone by our own write: forgotten here, not on a DELETED event a watch gap could lose."""
    w = World()
    lease, _ = await w.held_by_a(LEASE_FINALIZER)
    lease.deleting = True
    await w.deletions.deleting(lease)
    assert w.kube.lease_finalizers == [(NS, "report", [])]
    assert w.leases.get(KEY) is None


async def test_a_lease_re_created_after_its_deletion_grants_above_the_old_token() -> None:
    """The token records and the mark stay in etcd: the old holder's token stays refused."""
    w = World()
    _, old = await w.held_by_a(LEASE_FINALIZER)
    await w.deletions.finalize(KEY)
    again = await w.store.acquire(NS, "report", "b", 30, holder_uid="uid-b")
    assert isinstance(again, Acquired) and again.token > old


async def test_the_finalizer_is_written_once_and_a_gone_lease_is_forgotten() -> None:
    w = World()
    lease, _ = await w.held_by_a()
    assert await w.deletions.ensure_finalizer(lease)
    assert await w.deletions.ensure_finalizer(lease)  # already there: no second write
    assert w.kube.lease_finalizers == [(NS, "report", [LEASE_FINALIZER])]
    lease.finalizers = ()  # the object deleted and made again, before our finalizer landed
    w.kube.leases_gone.add((NS, "report"))
    assert not await w.deletions.ensure_finalizer(lease)
    assert w.leases.get(KEY) is None  # no DELETED event needed
    # No grant of this term to release: etcd's record is the next pass's to decide on.
    assert await w.store.read(NS, "report") is not None
