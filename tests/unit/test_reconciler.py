"""The lease reconciler without a cluster: the in-memory authority, recorded Kubernetes writes
and a fake clock (grant, renew, expiry, handover, force release, restore guard, Pod UIDs)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from dataclasses import replace
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey, StoreUnavailable
from fencedlease.controller import projection
from fencedlease.controller.leadership import Leadership, gated_writes
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.controller.runtime import lease_reconciler
from fencedlease.controller.scheduler import Scheduler
from fencedlease.models import ANNOTATION_FORCE_RELEASE, FencedLeaseStatus, pod_annotation_keys
from tests.fakes import FakeClock, FakeWall, RecordingKube

NS = "ns"
KEY = LeaseKey(NS, "report")
PROOFS = TokenProofs(b"k" * 32)


class World:
    def __init__(
        self, duration: int = 30, policy: str = "AllowEqual", gate: Leadership | None = None
    ) -> None:
        """``gate``: the reconciler writes to Kubernetes through the leadership gate."""
        self.clock = FakeClock()
        self.store = AsyncMemoryStore(clock=self.clock, wall=FakeWall(self.clock))
        self.kube = RecordingKube()
        self.pods = PodCache()
        self.leases = LeaseCache(PROOFS)
        self.gate = gate
        kube = self.kube if gate is None else gated_writes(self.kube, gate)
        self.reconciler = lease_reconciler(
            self.store, kube, self.pods, self.leases, clock=self.clock, wall=FakeWall(self.clock)
        )
        self.spec = {
            "leaseDurationSeconds": duration,
            "fencingPolicy": policy,
            "holderSelector": {"matchLabels": {"app": "w"}},
        }
        self.annotations: dict[str, str] = {}
        self.lease(FencedLeaseStatus())

    def lease(self, status: FencedLeaseStatus | dict[str, Any]) -> None:
        """The watch shows the lease with ``status`` (a raw dict: as anyone wrote it)."""
        raw = status if isinstance(status, dict) else status.to_patch()
        body: dict[str, Any] = {
            "metadata": {
                "namespace": NS,
                "name": "report",
                "uid": "lease-uid",
                "generation": 1,
                "annotations": dict(self.annotations),
            },
            "spec": self.spec,
            "status": raw,
        }
        self.leases.upsert(LeaseObject.from_body(body))

    def new_leases(self, *names: str, app: str = "w") -> None:
        """More never-granted leases with the same spec (uid = name), for the Pods labelled
        ``app``."""
        spec = {**self.spec, "holderSelector": {"matchLabels": {"app": app}}}
        for name in names:
            body: dict[str, Any] = {
                "metadata": {"namespace": NS, "name": name, "uid": name, "generation": 1},
                "spec": spec,
                "status": FencedLeaseStatus().to_patch(),
            }
            self.leases.upsert(LeaseObject.from_body(body))

    def pod(
        self, name: str, created: str, *, ready: bool = True, uid: str | None = None, app: str = "w"
    ) -> None:
        annotations = self.kube.annotations.get((NS, name), {})
        self.pods.upsert(
            PodInfo(
                NS,
                name,
                uid or f"uid-{name}",
                created,
                {"app": app},
                dict(annotations),
                running=True,
                ready=ready,
            )
        )

    async def run(self) -> float | None:
        delay = await self.reconciler.reconcile(KEY)
        for (ns, name), written in self.kube.annotations.items():  # the watch comes back
            pod = self.pods.get(ns, name)
            if pod is not None:
                self.pods.upsert(replace(pod, annotations=dict(written)))
        return delay

    @property
    def status(self) -> dict[str, Any]:
        return self.kube.statuses[-1][2] if self.kube.statuses else {}

    def state(self, pod: str) -> str | None:
        return self.kube.annotations.get((NS, pod), {}).get(pod_annotation_keys("report")["state"])


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


async def test_grant_goes_to_the_oldest_ready_pod_with_a_signed_token() -> None:
    w = World()
    w.pod("b", "2026-01-01T00:00:02Z")
    w.pod("a", "2026-01-01T00:00:01Z")
    delay = await w.run()
    s = w.status
    assert s["phase"] == "Held" and s["holder"] == "a" and delay == 10
    assert PROOFS.verify(NS, "report", s["leaseId"], s["fencingToken"], s["tokenProof"])
    assert w.state("a") == "held" and w.state("b") is None
    assert condition(s, "Held")["reason"] == "Granted" and "Granted" in w.kube.reasons()


async def test_renewal_keeps_the_token_and_extends_the_deadline() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    first = dict(w.status)
    until = w.kube.annotations[(NS, "a")][pod_annotation_keys("report")["valid_until"]]
    w.clock.advance(10)
    await w.run()
    assert w.status["fencingToken"] == first["fencingToken"]
    # The deadline moves on the holder Pod (downward API); the status shows the policy.
    assert w.kube.annotations[(NS, "a")][pod_annotation_keys("report")["valid_until"]] > until
    assert w.status["leaseDurationSeconds"] == 30 and w.status["renewIntervalSeconds"] == 10
    assert condition(w.status, "Held")["reason"] == "Renewed"


async def test_expiry_hands_over_to_a_greater_token_and_marks_the_old_holder_lost() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    first = dict(w.status)
    w.pod("a", "2026-01-01T00:00:01Z", ready=False)
    await w.run()
    assert condition(w.status, "Held")["reason"] == "HolderNotReady"
    assert w.status["fencingToken"] == first["fencingToken"]  # not renewed, not yet expired
    w.clock.advance(31)
    await w.run()
    s = w.status
    assert s["holder"] == "b" and s["fencingToken"] > first["fencingToken"]
    assert w.state("a") == "lost" and w.state("b") == "held"
    assert "Expired" in w.kube.reasons()


async def test_force_release_by_lease_id_grants_the_next_candidate() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    first = dict(w.status)
    w.annotations[ANNOTATION_FORCE_RELEASE] = first["leaseId"]
    w.lease(w.leases.status(KEY) or FencedLeaseStatus())
    await w.run()
    s = w.status
    assert s["holder"] == "b" and s["fencingToken"] > first["fencingToken"]
    assert "ForceReleased" in w.kube.reasons() and w.state("a") == "lost"
    assert w.kube.lease_annotations[-1][2] == {ANNOTATION_FORCE_RELEASE: None}


async def test_a_recreated_pod_with_the_holders_name_is_not_the_holder() -> None:
    w = World()
    w.pod("w-0", "2026-01-01T00:00:01Z", uid="old")
    await w.run()
    first = dict(w.status)
    w.pod("w-0", "2026-01-01T00:01:00Z", uid="new")  # deleted and re-created
    await w.run()
    assert condition(w.status, "Held")["reason"] == "HolderNotReady"
    assert w.status["fencingToken"] == first["fencingToken"]
    w.clock.advance(31)
    await w.run()
    assert w.status["holder"] == "w-0" and w.status["fencingToken"] > first["fencingToken"]


async def test_restore_guard_trusts_signed_statuses_only() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    forged = FencedLeaseStatus.model_validate({"fencingToken": 2**62, "leaseId": "x"})
    w.lease(forged)  # a status someone else wrote: reported, never the floor
    await w.run()
    assert w.status["phase"] == "Held" and w.status["fencingToken"] < 2**62
    assert w.kube.reasons().count("UnverifiedToken") == 1

    w2 = World()
    w2.pod("a", "2026-01-01T00:00:01Z")
    token, lease_id = 5_000, "gone-after-restore"
    signed = FencedLeaseStatus.model_validate(
        {
            "fencingToken": token,
            "leaseId": lease_id,
            "tokenProof": PROOFS.sign(NS, "report", lease_id, token),
        }
    )
    w2.lease(signed)  # signed by us before etcd was restored to revision 40
    await w2.run()
    s = w2.status
    assert s["phase"] == "Unavailable" and s["fencingToken"] == token
    assert condition(s, "TokensMonotonic")["reason"] == "RestoreGuard"
    await w2.run()
    assert w2.kube.reasons().count("RestoreGuard") == 1  # evented once, not every pass


def unverified_reports() -> float:
    return (
        REGISTRY.get_sample_value("fencedlease_unverified_tokens_total", {"kind": "lease_status"})
        or 0.0
    )


async def test_a_forged_status_that_does_not_parse_is_reported_and_rewritten() -> None:
    """Issue 31, defect 2: a forged token beside a value the model refuses (``phase: Bogus``)
    left an empty parsed status: nothing was reported, and the pass compared with the status
    it wrote last, so the forgery stayed."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    held = dict(w.status)
    w.lease(held)  # our write comes back
    await w.run()
    writes, before = len(w.kube.statuses), unverified_reports()
    w.lease({**held, "fencingToken": 2**62, "phase": "Bogus", "holder": "evil-pod"})
    await w.run()
    assert len(w.kube.statuses) == writes + 1
    s = w.status
    assert (s["phase"], s["holder"], s["fencingToken"]) == ("Held", "a", held["fencingToken"])
    assert w.kube.reasons().count("UnverifiedToken") == 1
    assert unverified_reports() == before + 1
    message = next(e[3] for e in w.kube.events if e[2] == "UnverifiedToken")
    assert "status.phase" in message and str(2**62) in message
    assert w.leases.max_token < 2**62  # never the restore guard's floor

    w.lease(s)  # the signed truth comes back: nothing left to report
    await w.run()
    assert w.leases.unverified(KEY) is None
    assert w.kube.reasons().count("UnverifiedToken") == 1
    w.lease({**s, "phase": "Bogus"})  # forged again (no token this time): reported again
    await w.run()
    assert w.kube.reasons().count("UnverifiedToken") == 2
    assert w.status["phase"] == "Held"


async def test_a_status_that_is_not_an_object_is_unverified() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.leases.upsert(
        LeaseObject.from_body(
            {
                "metadata": {"namespace": NS, "name": "report", "uid": "u", "generation": 1},
                "spec": w.spec,
                "status": ["not", "an", "object"],
            }
        )
    )
    found = w.leases.unverified(KEY)
    assert found is not None and found.token is None and "not an object" in (found.error or "")
    await w.run()
    assert w.status["phase"] == "Held" and "UnverifiedToken" in w.kube.reasons()


async def test_a_generation_restored_from_an_old_snapshot_is_never_renewed_or_shown() -> None:
    """Found by the fault campaign: after etcd was restored without --bump-revision, etcd held
    the generation of the snapshot (Pod a, an old token) and the controller renewed it and
    published it as Held, although this lease had already granted a greater token to b."""
    w = World(duration=10)
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    old = dict(w.status)
    snapshot = copy.deepcopy(w.store.auth.kv)  # etcdutl snapshot save
    w.pod("a", "2026-01-01T00:00:01Z", ready=False)
    await w.run()
    w.clock.advance(11)
    await w.run()
    newer = dict(w.status)
    assert newer["holder"] == "b" and newer["fencingToken"] > old["fencingToken"]
    w.pod("a", "2026-01-01T00:00:01Z", ready=True)

    w.store.auth.kv = snapshot  # etcdutl snapshot restore, no --bump-revision
    for _ in range(3):
        await w.run()
        w.clock.advance(4)
        assert w.status.get("fencingToken") != old["fencingToken"]
        assert w.state("a") != "held"
    assert "RestoredGeneration" in w.kube.reasons()
    assert condition(w.status, "TokensMonotonic")["reason"] == "RestoreGuard"

    w.store.auth.kv.revision += 1_000  # restored again, with --bump-revision
    await w.run()
    s = w.status
    assert s["phase"] == "Held" and s["fencingToken"] > newer["fencingToken"]


async def test_etcd_down_is_unavailable_and_reported_once() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.store.fail = True
    assert await w.run() == 5.0
    await w.run()
    assert w.status["phase"] == "Unavailable"
    assert condition(w.status, "EtcdAvailable")["status"] == "False"
    assert w.kube.reasons().count("EtcdUnavailable") == 1
    w.store.fail = False
    await w.run()
    assert w.status["phase"] == "Held"


async def test_a_refusal_after_a_read_reports_on_what_the_read_said() -> None:
    """Every store call raises ``StoreUnavailable`` when it cannot decide, and the pass
    handles it in one place: on the status decided before that call.  etcd comes back
    restored from a snapshot older than the grant: the read answers (``EtcdAvailable`` turns
    True again), the grant is refused by the restore guard (``TokensMonotonic`` False).  Had
    the pass reported on the status it started from, etcd would still read as unavailable."""
    w = World()
    snapshot = copy.deepcopy(w.store.auth.kv)  # etcdutl snapshot save, before any grant
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    assert w.status["phase"] == "Held"
    w.store.fail = True
    await w.run()
    assert condition(w.status, "EtcdAvailable")["status"] == "False"
    w.store.auth.kv, w.store.fail = snapshot, False  # restored, no --bump-revision
    assert await w.run() == 5.0
    assert w.status["phase"] == "Unavailable"
    assert condition(w.status, "EtcdAvailable")["status"] == "True"
    guard = condition(w.status, "TokensMonotonic")
    assert (guard["status"], guard["reason"]) == ("False", "RestoreGuard")
    assert "--bump-revision" in guard["message"]
    assert w.kube.reasons().count("RestoreGuard") == 1


async def test_a_renewal_after_a_read_that_cannot_decide_reports_on_the_generation_read() -> None:
    """A new term decides on a read: etcd shows the generation held by "a" (this replica's
    status of it was lost), and its renewal raises ``StoreUnavailable``. The pass reports on
    the status decided before that call (holder and token from the read), not on the empty
    one it started from."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    token = w.status["fencingToken"]
    w.reconciler.leadership_started()  # a new term: nothing of ours to renew without a read
    w.lease(FencedLeaseStatus())  # what the watch shows: no status
    w.clock.advance(10)

    async def cannot_decide(*_: Any) -> Any:
        raise StoreUnavailable("etcd_error", "deadline exceeded")

    w.store.renew = cannot_decide  # type: ignore[method-assign,assignment]
    assert await w.run() == 5.0
    assert w.status["phase"] == "Unavailable"
    assert w.status["holder"] == "a" and w.status["fencingToken"] == token


async def test_a_status_decided_from_an_outdated_version_is_not_written() -> None:
    """The fault campaign's ``controller_pause`` found it: a leader paused between its
    leadership check and its status write resumed and wrote the old holder and token over
    the status its successor had written meanwhile. The write is now conditional on the
    version the pass decided from."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    lease = w.leases.get(KEY)
    assert lease is not None
    lease.resource_version = "7"  # what this replica last saw
    w.kube.lease_versions[(NS, "report")] = "8"  # another replica wrote since
    await w.run()
    assert w.kube.statuses == []  # nothing from the outdated view
    lease.resource_version = "8"  # the watch brings the newer version
    await w.run()
    assert w.status["holder"] == "a" and w.status["phase"] == "Held"
    # The finalizer (8 → 9) and the status (9 → 10): each write follows the one before it.
    assert w.kube.lease_versions[(NS, "report")] == "10"
    assert lease.resource_version == "10"


# --------------------------------------------------------------- one API write per renewal


class Counted:
    """Counts the reconciler's etcd calls and Kubernetes writes (fake ports)."""

    def __init__(self, w: World) -> None:
        self.calls: list[str] = []
        self.pod_patches: list[dict[str, str | None]] = []
        for name in ("read", "acquire", "renew", "release", "force_release", "expire"):
            setattr(w.store, name, self._count(name, getattr(w.store, name)))
        patch = w.kube.patch_pod_annotations

        async def patch_pod(
            namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
        ) -> str | None:
            self.pod_patches.append(dict(annotations))
            return await patch(namespace, name, annotations, resource_version)

        w.kube.patch_pod_annotations = patch_pod  # type: ignore[method-assign]
        self.w = w
        self.mark()

    def _count(self, name: str, call: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await call(*args, **kwargs)

        return counted

    def mark(self) -> None:
        self.calls.clear()
        self.pod_patches.clear()
        self.statuses = len(self.w.kube.statuses)
        self.events = len(self.w.kube.events)
        self.lease_writes = len(self.w.kube.lease_finalizers) + len(self.w.kube.lease_annotations)

    def writes(self) -> dict[str, int]:
        return {
            "pod": len(self.pod_patches),
            "status": len(self.w.kube.statuses) - self.statuses,
            "event": len(self.w.kube.events) - self.events,
            "lease": len(self.w.kube.lease_finalizers)
            + len(self.w.kube.lease_annotations)
            - self.lease_writes,
        }


async def test_a_steady_state_renewal_is_one_transaction_and_one_pod_write() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    n = Counted(w)
    await w.run()  # the grant
    await w.run()  # the finalizer's watch event: nothing is due, nothing is written
    w.clock.advance(10)
    await w.run()  # the first renewal: the status says Renewed instead of Granted
    keys = pod_annotation_keys("report")
    for _ in range(5):
        n.mark()
        until = w.kube.annotations[(NS, "a")][keys["valid_until"]]
        w.clock.advance(10)
        assert await w.run() == 10
        assert n.calls == ["renew"]  # no read: decided on this term's grant
        assert n.writes() == {"pod": 1, "status": 0, "event": 0, "lease": 0}
        (patch,) = n.pod_patches
        assert (
            list(patch) == [keys["valid_until"]] and cast(str, patch[keys["valid_until"]]) > until
        )
    assert w.state("a") == "held" and w.status["phase"] == "Held"


async def test_a_renewal_asks_the_pod_index_not_a_scan_of_the_namespace() -> None:
    """Each renewal marks ``lost`` any other Pod still reading ``held`` for its lease; that is
    answered from the cache's per-lease index. A scan of every Pod in the namespace per
    renewal cost O(Pods) each time: with one lease per Pod, quadratic in the leases."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    for i in range(20):
        w.pod(f"idle-{i}", f"2026-01-01T00:01:{i:02}Z")
    await w.run()
    await w.run()
    keys = pod_annotation_keys("report")
    w.kube.annotations[(NS, "stale")] = {keys["state"]: "held", keys["lease_id"]: "an-old-one"}
    w.pod("stale", "2026-01-01T00:02:00Z")
    scans: list[str] = []
    in_namespace = w.pods.in_namespace

    def counted(namespace: str) -> list[PodInfo]:
        scans.append(namespace)
        return in_namespace(namespace)

    w.pods.in_namespace = counted  # type: ignore[method-assign]
    w.clock.advance(10)
    assert await w.run() == 10
    assert condition(w.status, "Held")["reason"] == "Renewed"
    assert w.state("a") == "held" and w.state("stale") == "lost"
    assert all(w.state(f"idle-{i}") is None for i in range(20))
    assert scans == []


async def test_the_status_records_a_renewal_per_term_and_per_refresh_period() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    n = Counted(w)
    await w.run()
    granted = w.status["renewTime"]
    assert w.status["acquireTime"] == granted
    w.clock.advance(10)
    await w.run()
    assert w.status["renewTime"] == granted  # Renewed, not recorded (the grant was)
    w.reconciler.leadership_started()  # a new term: its first renewal is recorded
    w.clock.advance(10)
    n.mark()
    await w.run()
    assert n.writes()["status"] == 1 and w.status["renewTime"] > granted
    recorded = w.status["renewTime"]
    steps = int(projection.STATUS_REFRESH_SECONDS // 10)
    for _ in range(steps - 1):
        w.clock.advance(10)
        await w.run()
    assert w.status["renewTime"] == recorded
    w.clock.advance(10)
    await w.run()
    assert w.status["renewTime"] > recorded
    assert w.status["expireTime"] is None and w.status["renewIntervalSeconds"] == 10


async def test_a_renewal_refused_from_the_cache_is_decided_on_a_read() -> None:
    """Another writer moved the record (here: a force release behind this replica's back):
    the cached renewal's compare fails, the store confirms NotHeld with a read, and the same
    pass decides on what etcd says: the next candidate gets a greater token."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    first = dict(w.status)
    other = AsyncMemoryStore(w.store.auth)  # the same etcd, another client
    await other.force_release(NS, "report", first["leaseId"])
    n = Counted(w)
    w.clock.advance(10)
    await w.run()
    assert n.calls[:2] == ["renew", "read"]
    assert "acquire" in n.calls
    assert w.status["fencingToken"] > first["fencingToken"]
    assert w.status["holder"] == "a" and w.state("a") == "held"  # a new grant, same Pod


async def test_a_changed_duration_applies_from_the_next_grant_not_to_the_live_one() -> None:
    """Raising ``leaseDurationSeconds`` on a held lease: etcd's generation and its holder's
    deadline still run on the duration it was granted with, so its renewals keep that
    cadence (read-free, and after a read in a new term) and it is never left to expire; the
    new duration comes with the next grant."""
    w = World(duration=15)
    w.pod("a", "2026-01-01T00:00:01Z")
    assert await w.run() == 5
    token = w.status["fencingToken"]
    w.spec["leaseDurationSeconds"] = 60  # kubectl edit: a longer lease
    w.lease(w.leases.status(KEY) or FencedLeaseStatus())
    for _ in range(6):  # twice the live grant's 15 s
        w.clock.advance(5)
        assert await w.run() == 5
    w.reconciler.leadership_started()  # a new term: decided on a read of etcd
    w.clock.advance(5)
    assert await w.run() == 5
    w.clock.advance(2)
    assert await w.run() == 3  # not due: read, nothing renewed
    assert w.status["fencingToken"] == token and w.state("a") == "held"
    assert w.kube.reasons() == ["Granted"]
    assert w.status["leaseDurationSeconds"] == 15 and w.status["renewIntervalSeconds"] == 5
    w.annotations[ANNOTATION_FORCE_RELEASE] = w.status["leaseId"]  # the next grant
    w.lease(w.leases.status(KEY) or FencedLeaseStatus())
    assert await w.run() == 20
    assert w.status["fencingToken"] > token and w.state("a") == "held"
    assert w.status["leaseDurationSeconds"] == 60 and w.status["renewIntervalSeconds"] == 20


async def test_the_delay_returned_is_counted_from_the_return_not_from_the_schedule() -> None:
    """A pass schedules the next renewal on its holder's ticks, then writes the finalizer,
    Events and the status; the scheduler counts the returned delay from when the pass
    returns, so the time those writes took comes off it, or every renewal after a slow write
    would land that much late (here 0.8 s of a 1 s interval)."""
    w = World(duration=3)
    w.pod("a", "2026-01-01T00:00:01Z")
    patch = w.kube.patch_lease_status

    async def slow(*args: Any, **kwargs: Any) -> Any:
        w.clock.advance(0.8)  # a slow API server
        return await patch(*args, **kwargs)

    w.kube.patch_lease_status = slow  # type: ignore[method-assign]
    granted = w.clock.now
    delay = await w.run()
    assert w.clock.now == granted + 0.8
    assert delay is not None and delay == pytest.approx(0.2)  # a renew interval after the grant
    w.clock.advance(delay)
    n = Counted(w)
    delay = await w.run()  # Granted -> Renewed: a status write again
    assert n.calls == ["renew"] and n.writes()["status"] == 1
    assert delay is not None and w.clock.now + delay == pytest.approx(granted + 2)
    assert condition(w.status, "Held")["reason"] == "Renewed" and w.state("a") == "held"


async def test_a_lease_never_granted_is_granted_without_a_read() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    n = Counted(w)
    await w.run()
    assert n.calls == ["acquire"]
    assert w.state("a") == "held" and w.status["phase"] == "Held"
    assert condition(w.status, "EtcdAvailable")["status"] == "True"


async def test_a_grant_the_status_missed_is_adopted_not_acquired_blindly() -> None:
    """A previous term granted and annotated the Pod but its status write was lost: the Pod's
    annotations say a grant exists, so the pass reads etcd and renews that grant."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    token = w.status["fencingToken"]
    w.kube.statuses.clear()
    w.leases.forget_written()
    w.lease(FencedLeaseStatus())  # the status never showed the grant
    w.reconciler.leadership_started()
    n = Counted(w)
    await w.run()
    assert n.calls[0] == "read" and "acquire" not in n.calls
    assert w.state("a") == "held" and w.status["fencingToken"] == token


def pod_writes_in_flight(w: World) -> None:
    """Each Pod write yields once before it is made: the request is in flight, and other
    passes run meanwhile."""
    patch = w.kube.patch_pod_annotations

    async def in_flight(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        await asyncio.sleep(0)
        return await patch(namespace, name, annotations, resource_version)

    w.kube.patch_pod_annotations = in_flight  # type: ignore[method-assign]


async def test_leases_held_by_one_pod_renew_together_and_share_its_write() -> None:
    """Three leases granted to one Pod at different times: each joins the Pod's renewal
    ticks (renewing early once), and renewals due together share Pod writes: every deadline
    moves, in fewer writes than renewals, each conditional on the version before it."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    names = ["report", "job-1", "job-2"]
    w.new_leases(*names[1:])
    delays = []
    for name in names:
        delays.append(await w.reconciler.reconcile(LeaseKey(NS, name)))
        w.clock.advance(3)
    assert delays[0] == 10 and delays[1] == 7 and delays[2] == 4  # all due at grant + 10
    w.clock.advance(1)  # grant of "report" + 10: every lease is due
    n = Counted(w)
    pod_writes_in_flight(w)
    before = dict(w.kube.annotations[(NS, "a")])
    results = await asyncio.gather(*(w.reconciler.reconcile(LeaseKey(NS, x)) for x in names))
    assert results == [10, 10, 10]
    assert n.calls == ["renew"] * 3
    assert 1 <= len(n.pod_patches) < 3
    after = w.kube.annotations[(NS, "a")]
    for name in names:
        key = pod_annotation_keys(name)["valid_until"]
        assert after[key] > before[key], name
        assert after[pod_annotation_keys(name)["state"]] == "held"


async def test_a_pod_write_waits_for_the_renewals_of_that_pod_still_in_etcd() -> None:
    """Renewals of one Pod's leases that are in etcd at the same time publish in one Pod
    write: the first to commit opens the write and holds it until the others committed (or
    failed), instead of sending at once and leaving the rest for a second write. A renewal
    whose etcd call fails releases the write too."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    names = ["report", "job-1", "job-2", "job-3", "job-4"]
    w.new_leases(*names[1:])
    for name in names:
        assert await w.reconciler.reconcile(LeaseKey(NS, name)) == 10
    w.clock.advance(10)  # every lease is due on the Pod's tick
    n = Counted(w)
    renew = w.store.renew
    gates = [asyncio.Event() for _ in names]
    returned = [asyncio.Event() for _ in names]
    in_etcd = asyncio.Event()
    started: list[str] = []

    async def gated(namespace: str, name: str, lease_id: str, token: int) -> Any:
        i = len(started)
        started.append(name)
        if len(started) == len(names):
            in_etcd.set()
        await gates[i].wait()
        try:
            if name == "job-4":
                raise RuntimeError("etcd went away")  # this one never publishes
            return await renew(namespace, name, lease_id, token)
        finally:
            returned[i].set()

    w.store.renew = gated  # type: ignore[method-assign]
    pod_writes_in_flight(w)
    before = dict(w.kube.annotations[(NS, "a")])
    passes = [asyncio.create_task(w.reconciler.reconcile(LeaseKey(NS, x))) for x in names]
    async with asyncio.timeout(5):
        await in_etcd.wait()
        gates[0].set()
        await returned[0].wait()  # the first renewal committed and reached its Pod write
        for gate in gates[1:]:
            gate.set()
        results = await asyncio.gather(*passes, return_exceptions=True)
    assert results[:4] == [10, 10, 10, 10]
    assert isinstance(results[4], RuntimeError)
    assert len(n.pod_patches) == 1, n.pod_patches
    after = w.kube.annotations[(NS, "a")]
    for name in names[:4]:
        key = pod_annotation_keys(name)["valid_until"]
        assert after[key] > before[key], name
    assert (
        after[pod_annotation_keys("job-4")["valid_until"]]
        == before[pod_annotation_keys("job-4")["valid_until"]]
    )


async def test_one_pods_renewals_run_back_to_back_and_share_one_write() -> None:
    """The leases scheduler groups the renewals due in one wake by holder Pod: with fewer
    workers than renewals due, each Pod's run together and share one write, instead of
    interleaving with the other Pod's and leaving a second write to each Pod."""
    w = World()
    per_pod = 3
    names = {pod: [f"{pod}-{i}" for i in range(per_pod)] for pod in ("a", "b")}
    for pod, leases in names.items():
        w.pod(pod, "2026-01-01T00:00:01Z", app=pod)
        w.new_leases(*leases, app=pod)
    interleaved = [name for pair in zip(names["a"], names["b"], strict=True) for name in pair]
    for name in interleaved:
        assert await w.reconciler.reconcile(LeaseKey(NS, name)) == 10
    w.clock.advance(10)  # every lease is due on its Pod's tick
    n = Counted(w)
    renew = w.store.renew

    async def in_etcd(namespace: str, name: str, lease_id: str, token: int) -> Any:
        # The transaction is in flight for a while (an fsync takes longer than starting a
        # pass): passes that start meanwhile are in etcd too before it commits.
        for _ in range(10):
            await asyncio.sleep(0)
        return await renew(namespace, name, lease_id, token)

    w.store.renew = in_etcd  # type: ignore[method-assign]
    pod_writes_in_flight(w)
    finished: list[float | None] = []
    all_done = asyncio.Event()

    async def work(key: LeaseKey) -> float | None:
        finished.append(await w.reconciler.reconcile(key))
        if len(finished) == len(interleaved):
            all_done.set()
        return None

    sched: Scheduler[LeaseKey] = Scheduler(
        work,
        clock=w.clock,
        concurrency=per_pod,
        priority=w.reconciler.priority,
        group=w.reconciler.group,
    )
    for name in interleaved:
        sched.poke(LeaseKey(NS, name))  # due in one wake, Pods interleaved
    task = asyncio.create_task(sched.run())
    try:
        async with asyncio.timeout(5):
            await all_done.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert finished == [10] * len(interleaved)
    assert n.calls.count("renew") == len(interleaved)
    assert len(n.pod_patches) == 2, n.pod_patches
    for patch, pod in zip(n.pod_patches, ("a", "b"), strict=True):
        assert set(patch) == {pod_annotation_keys(x)["valid_until"] for x in names[pod]}


async def test_a_pod_write_waits_for_a_stuck_renewal_at_most_a_tenth_of_the_interval() -> None:
    """One renewal of a Pod's leases that hangs in etcd holds back the Pod's write of the
    other deadlines only for a tenth of the renew interval (0.1 s for 3 s leases)."""
    w = World(duration=3)
    w.pod("a", "2026-01-01T00:00:01Z")
    names = ["report", "job-1", "job-2"]
    w.new_leases(*names[1:])
    for name in names:
        assert await w.reconciler.reconcile(LeaseKey(NS, name)) == 1
    w.clock.advance(1)
    n = Counted(w)
    renew = w.store.renew
    never = asyncio.Event()

    async def stuck(namespace: str, name: str, lease_id: str, token: int) -> Any:
        if name == "job-2":
            await never.wait()  # the etcd call never returns
        return await renew(namespace, name, lease_id, token)

    w.store.renew = stuck  # type: ignore[method-assign]
    hung = asyncio.create_task(w.reconciler.reconcile(LeaseKey(NS, "job-2")))
    try:
        async with asyncio.timeout(5):
            results = await asyncio.gather(
                *(w.reconciler.reconcile(LeaseKey(NS, x)) for x in names[:2])
            )
        assert results == [1, 1]
        assert len(n.pod_patches) == 1 and len(n.pod_patches[0]) == 2
        assert not hung.done()
    finally:
        hung.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hung


async def test_a_pod_writes_wait_ends_at_the_smallest_bound_of_the_renewals_in_it() -> None:
    """A Pod holds two 30 s leases (their write may wait 1 s for renewals in etcd) and a 3 s
    one (a tenth of its 1 s interval: 0.1 s). One 30 s renewal hangs in etcd; the other
    opens the Pod's write and waits; the 3 s renewal joins 0.5 s after that opening, past its
    own bound: the write goes out then, not when the opener's 1 s is up (the 3 s lease's
    previous deadline would have passed meanwhile while etcd still held the lease)."""
    w = World(duration=30)
    w.pod("a", "2026-01-01T00:00:01Z")
    w.new_leases("long2")
    w.spec = {**w.spec, "leaseDurationSeconds": 3}
    w.new_leases("short")
    assert await w.reconciler.reconcile(LeaseKey(NS, "report")) == 10
    assert await w.reconciler.reconcile(LeaseKey(NS, "long2")) == 10
    assert await w.reconciler.reconcile(LeaseKey(NS, "short")) == 1
    for _ in range(9):
        w.clock.advance(1)
        assert await w.reconciler.reconcile(LeaseKey(NS, "short")) == 1
    w.clock.advance(1)  # every lease is due on the Pod's tick
    n = Counted(w)
    renew = w.store.renew
    never, release_short = asyncio.Event(), asyncio.Event()
    in_etcd = {name: asyncio.Event() for name in ("long2", "short")}
    report_committed = asyncio.Event()

    async def held(namespace: str, name: str, lease_id: str, token: int) -> Any:
        if name in in_etcd:
            in_etcd[name].set()
            await (never if name == "long2" else release_short).wait()
        result = await renew(namespace, name, lease_id, token)
        if name == "report":
            report_committed.set()
        return result

    w.store.renew = held  # type: ignore[method-assign]
    before = dict(w.kube.annotations[(NS, "a")])
    hung = asyncio.create_task(w.reconciler.reconcile(LeaseKey(NS, "long2")))
    short = asyncio.create_task(w.reconciler.reconcile(LeaseKey(NS, "short")))
    try:
        async with asyncio.timeout(5):
            await in_etcd["long2"].wait()
            await in_etcd["short"].wait()
        report = asyncio.create_task(w.reconciler.reconcile(LeaseKey(NS, "report")))
        async with asyncio.timeout(5):
            await report_committed.wait()  # it opened the Pod's write, waiting for the others
        assert n.pod_patches == []
        w.clock.advance(0.5)  # past the 3 s lease's bound from the opening, not the opener's
        release_short.set()
        try:
            async with asyncio.timeout(0.5):  # the fix writes at once; the opener's bound is 1 s
                results = await asyncio.gather(report, short)
        except TimeoutError:
            pytest.fail("the 3 s lease's deadline waited for the opener's 1 s bound")
        assert results[0] is not None and results[1] is not None
        assert len(n.pod_patches) == 1
        assert set(n.pod_patches[0]) == {
            pod_annotation_keys(x)["valid_until"] for x in ("report", "short")
        }
        after = w.kube.annotations[(NS, "a")]
        for name in ("report", "short"):
            key = pod_annotation_keys(name)["valid_until"]
            assert after[key] > before[key], name
        assert not hung.done()
    finally:
        hung.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hung


async def test_leases_of_different_pods_granted_within_one_slot_renew_at_one_instant() -> None:
    """Ticks start on the controller's slot grid (``status.tick_anchor``), so leases held by
    different Pods and granted within one slot fall due at one instant (the scheduler runs
    them in one wake, and etcd and the API server take their writes together); a grant in
    the next slot renews on the next instant. No renewal is later than its interval."""
    w = World()
    for i, pod in enumerate(("p0", "p1", "p2")):
        w.pod(pod, f"2026-01-01T00:00:0{i}Z", app=pod)
        w.new_leases(pod, app=pod)
    due: dict[str, float] = {}
    for pod, granted in (("p0", 1000.1), ("p1", 1000.45), ("p2", 1000.6)):
        w.clock.now = granted
        delay = await w.reconciler.reconcile(LeaseKey(NS, pod))
        assert delay is not None and 0 < delay <= 10
        due[pod] = granted + delay
        assert w.kube.annotations[(NS, pod)][pod_annotation_keys(pod)["state"]] == "held"
    assert due["p0"] == pytest.approx(1010.0) and due["p1"] == pytest.approx(1010.0)
    assert due["p2"] == pytest.approx(1010.5)
    n = Counted(w)
    w.clock.now = 1010.0
    for pod in ("p0", "p1"):  # renewed on the shared instant, due together again
        assert await w.reconciler.reconcile(LeaseKey(NS, pod)) == pytest.approx(10.0)
    assert n.calls == ["renew", "renew"]


async def test_a_shared_pod_write_meets_the_leadership_gate_for_every_pass_in_it() -> None:
    """The term ends while one write to the Pod is in flight: the batch that joined behind it
    meets the closed gate, so none of its passes writes (each is abandoned with NotLeader)."""
    from fencedlease.controller.leadership import NotLeader

    class Switch:
        leading = True

        def is_leader(self) -> bool:
            return self.leading

    switch = Switch()
    w = World(gate=switch)
    w.pod("a", "2026-01-01T00:00:01Z")
    names = ["report", "job-1", "job-2"]
    w.new_leases(*names[1:])
    for name in names:
        await w.reconciler.reconcile(LeaseKey(NS, name))
    w.clock.advance(10)
    n = Counted(w)
    patch = w.kube.patch_pod_annotations

    async def term_ends_in_flight(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        switch.leading = False  # sent after the gate; the term ends meanwhile
        await asyncio.sleep(0)
        return await patch(namespace, name, annotations, resource_version)

    w.kube.patch_pod_annotations = term_ends_in_flight  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(w.reconciler.reconcile(LeaseKey(NS, x)) for x in names), return_exceptions=True
    )
    assert len(n.pod_patches) == 1  # the write that passed the gate, nothing after it
    # Every pass is abandoned at its next write (the first at its status: Granted → Renewed).
    assert all(isinstance(r, NotLeader) for r in results), results
    assert n.writes()["status"] == 0


# ------------------------------------------------------------------- the grant's finalizer


async def test_the_finalizer_is_written_after_the_grants_pod_write() -> None:
    """The first grant's etcd transaction and holder Pod write go out alone (they are the
    grant's latency); the finalizer follows them, and the status follows the finalizer."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    order: list[str] = []
    acquire, patch = w.store.acquire, w.kube.patch_pod_annotations
    finalizers, status = w.kube.set_lease_finalizers, w.kube.patch_lease_status

    def recorded(name: str, call: Any) -> Any:
        async def run(*args: Any, **kwargs: Any) -> Any:
            order.append(name)
            return await call(*args, **kwargs)

        return run

    w.store.acquire = recorded("acquire", acquire)  # type: ignore[method-assign]
    w.kube.patch_pod_annotations = recorded("pod", patch)  # type: ignore[method-assign]
    w.kube.set_lease_finalizers = recorded("finalizer", finalizers)  # type: ignore[method-assign]
    w.kube.patch_lease_status = recorded("status", status)  # type: ignore[method-assign]
    await w.run()
    assert order == ["acquire", "pod", "finalizer", "status"]
    assert w.state("a") == "held" and w.status["phase"] == "Held"


async def test_a_lease_deleted_before_its_finalizer_landed_is_released_and_cleaned() -> None:
    """Deleted between its creation and the finalizer write (which follows the grant): no
    finalizer holds it, so the pass that granted it releases it and cleans its holder now."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.kube.leases_gone.add((NS, "report"))
    assert await w.run() is None
    assert await w.store.read(NS, "report") is None  # released and its record deleted
    assert w.state("a") is None  # the holder no longer reads a grant
    assert w.kube.statuses == []


async def granted_before_the_finalizer() -> tuple[World, LeaseObject]:
    """Pod "a" holds the lease; our finalizer could not land (its write conflicted)."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    lease = w.leases.get(KEY)
    assert lease is not None
    lease.resource_version = "4"
    w.kube.lease_versions[(NS, "report")] = "5"  # moved on: the finalizer write conflicts
    await w.run()
    assert w.state("a") == "held" and not w.kube.lease_finalizers
    return w, lease


async def test_a_lease_deleting_under_someone_elses_finalizer_is_released_and_cleaned() -> None:
    """Our finalizer could not land (a conflict) before the lease started deleting under
    another finalizer (the API server refuses new ones now): a grant of this term is released
    and its holder cleaned all the same."""
    w, lease = await granted_before_the_finalizer()
    lease.deleting, lease.finalizers = True, ("example.com/other",)
    assert await w.run() is None
    assert await w.store.read(NS, "report") is None
    assert w.state("a") is None


async def test_a_granted_lease_deleted_with_no_finalizer_is_released_by_its_last_pass() -> None:
    """The finalizer write conflicted and the lease was then deleted with no finalizer at all
    (the object is gone from the cache; its DELETED event pokes one last pass): the grant of
    this term is released and its holder no longer reads `held`."""
    w, _ = await granted_before_the_finalizer()
    w.leases.remove(KEY)
    assert await w.run() is None
    assert await w.store.read(NS, "report") is None
    assert w.state("a") is None
    w.leases.remove(KEY)
    assert await w.run() is None  # once released, a later pass for the gone lease is a no-op


async def test_a_holder_that_leaves_the_watch_is_marked_lost_before_the_next_grant() -> None:
    """A scoped watch sends DELETED for a holder whose label was removed: the Pod still
    exists and its downward-API files still read ``held``. The pass that hands the lease
    over annotates it ``lost`` first, although the cache no longer shows it."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    assert w.state("a") == "held"
    w.pods.remove(NS, "a")  # out of the watch's scope (not being deleted)
    assert w.pods.get(NS, "a") is None and w.pods.departed() == 1
    await w.run()  # not renewed any more; its grant stays valid until it expires
    assert w.state("a") == "held" and w.state("b") is None
    w.clock.advance(31)
    await w.run()
    assert w.status["holder"] == "b" and w.state("b") == "held"
    assert w.state("a") == "lost"
    assert w.pods.departed() == 0  # reads held for no lease any more: forgotten


async def test_a_departed_holder_that_is_gone_is_forgotten() -> None:
    """A holder deleted at once (its DELETED event without deletionTimestamp) is remembered
    as departed; its write answers 404, the read finds nothing, and it is forgotten."""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    w.pods.remove(NS, "a")
    w.kube.gone.add((NS, "a"))
    w.clock.advance(31)
    await w.run()
    assert w.status["holder"] == "b" and w.pods.departed() == 0


def test_only_holders_not_being_deleted_are_remembered_as_departed() -> None:
    keys = pod_annotation_keys("report")

    def info(name: str, state: str | None, *, deleting: bool = False) -> PodInfo:
        annotations = {keys["state"]: state} if state else {}
        return PodInfo(NS, name, f"uid-{name}", "t", {"app": "w"}, annotations, deleting=deleting)

    pods = PodCache()
    for pod in (
        info("h", "held"),
        info("l", "lost"),
        info("n", None),
        info("d", "held", deleting=True),
    ):
        pods.upsert(pod)
        pods.remove(NS, pod.name)
    assert pods.departed() == 1 and [p.name for p in pods.annotated(NS, "report")] == ["h"]
    pods.upsert(info("h", "held"))  # back in the watch's scope: the cache has it again
    assert pods.departed() == 0 and [p.name for p in pods.annotated(NS, "report")] == ["h"]
    pods.remove(NS, "h")
    pods.gone(NS, "h", "another-uid")  # a Pod of another uid is gone: not this one
    assert pods.departed() == 1
    pods.gone(NS, "h", "uid-h")
    assert pods.departed() == 0


async def test_a_holder_that_leaves_while_its_grant_is_written_is_still_told() -> None:
    """The pass chose the Pod, then the watch took it out (a relist after an API server
    restart) while the pass was writing its ``held``: the Pod read ``lost`` when it left, so
    it was not remembered then; the grant's write makes it a departed holder, and the next
    handover marks it ``lost``. (Found by the scoped-watch integration test under load.)"""
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    keys = pod_annotation_keys("report")
    w.kube.annotations[(NS, "a")] = {keys["state"]: "lost"}  # a former grant, handed over
    w.pod("a", "2026-01-01T00:00:01Z")
    patch = w.kube.patch_pod_annotations

    async def leaves_while_written(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        if name == "a" and annotations.get(keys["state"]) == "held":
            w.pods.remove(NS, "a")  # reads lost: not remembered
            assert w.pods.departed() == 0
        return await patch(namespace, name, annotations, resource_version)

    w.kube.patch_pod_annotations = leaves_while_written  # type: ignore[method-assign]
    await w.run()
    assert w.state("a") == "held" and w.pods.get(NS, "a") is None
    assert w.pods.departed() == 1
    w.clock.advance(31)
    await w.run()
    assert w.status["holder"] == "b" and w.state("b") == "held"
    assert w.state("a") == "lost" and w.pods.departed() == 0


async def test_a_pod_that_leaves_while_the_pass_marks_others_lost_is_not_granted() -> None:
    """The pass chose the oldest Pod, then wrote ``lost`` to a stale holder; meanwhile the
    chosen Pod left the watch (a relist, a DELETED event). It is not granted a lease it would
    never renew (which would keep the lease from every other Pod for a whole duration): the
    pass decides again at once and the next candidate gets it."""
    w = World()
    keys = pod_annotation_keys("report")
    w.kube.annotations[(NS, "stale")] = {keys["state"]: "held", keys["lease_id"]: "old"}
    w.pod("stale", "2026-01-01T00:00:00Z", ready=False)
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    patch = w.kube.patch_pod_annotations

    async def a_leaves_meanwhile(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        if name == "stale":
            w.pods.remove(NS, "a")
        return await patch(namespace, name, annotations, resource_version)

    w.kube.patch_pod_annotations = a_leaves_meanwhile  # type: ignore[method-assign]
    delay = await w.run()
    assert delay is not None and delay < 1
    assert w.state("stale") == "lost" and w.state("a") is None
    assert await w.store.read(NS, "report") is None  # nothing granted
    await w.run()
    assert w.status["holder"] == "b" and w.state("b") == "held"
