"""The controller's write gate without a cluster: a standby writes nothing, leadership
pokes every lease, and a pass whose deadline passes mid-way stops at its next write."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey, LeaseState
from fencedlease.controller.leases import LEASE_FINALIZER, LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.controller.runtime import Controller
from fencedlease.models import FencedLeaseStatus, pod_annotation_keys
from tests.fakes import FakeClock, FakeWall, RecordingKube

NS = "ns"
KEY = LeaseKey(NS, "report")


class Switch:
    """Leadership the test turns on and off."""

    def __init__(self) -> None:
        self.leading = False

    def is_leader(self) -> bool:
        return self.leading


def world() -> tuple[Controller, RecordingKube, AsyncMemoryStore, Switch]:
    clock = FakeClock()
    store = AsyncMemoryStore(clock=clock, wall=FakeWall(clock))
    kube = RecordingKube()
    switch = Switch()
    controller = Controller.build(store, kube, TokenProofs(b"k" * 32), switch)
    body: dict[str, Any] = {
        "metadata": {"namespace": NS, "name": "report", "uid": "u", "generation": 1},
        "spec": {"leaseDurationSeconds": 30, "holderSelector": {"matchLabels": {"app": "w"}}},
        "status": FencedLeaseStatus().to_patch(),
    }
    controller.leases.upsert(LeaseObject.from_body(body))
    controller.pods.upsert(
        PodInfo(NS, "w-1", "uid-1", "2026-01-01T00:00:00Z", {"app": "w"}, running=True, ready=True)
    )
    return controller, kube, store, switch


def nothing_written(kube: RecordingKube) -> bool:
    return not (
        kube.annotations
        or kube.statuses
        or kube.events
        or kube.lease_finalizers
        or kube.finalizers
        or kube.artifact_statuses
    )


def pass_ran(controller: Controller) -> asyncio.Event:
    """An event set when the lease scheduler's next pass has run (whatever it did)."""
    ran = asyncio.Event()
    original = controller.scheduler._work

    async def observed(key: LeaseKey) -> float | None:
        try:
            return await original(key)
        finally:
            ran.set()

    controller.scheduler._work = observed
    return ran


async def run_scheduler_until(controller: Controller, done: asyncio.Event) -> None:
    task = asyncio.create_task(controller.scheduler.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_standby_runs_no_pass_and_writes_nothing() -> None:
    controller, kube, store, _ = world()
    controller.scheduler.poke(KEY)
    ran = pass_ran(controller)
    await run_scheduler_until(controller, ran)
    assert nothing_written(kube)
    assert await store.read(NS, "report") is None  # no grant


async def test_leadership_pokes_every_lease_and_the_leader_grants() -> None:
    controller, kube, store, switch = world()
    switch.leading = True
    controller.leadership_started()
    granted = pass_ran(controller)
    await run_scheduler_until(controller, granted)
    view = await store.read(NS, "report")
    assert view is not None and view.record.holder == "w-1"
    state = pod_annotation_keys("report")["state"]
    assert kube.annotations[(NS, "w-1")][state] == "held"
    assert kube.lease_finalizers == [(NS, "report", [LEASE_FINALIZER])]


async def test_a_pass_that_loses_leadership_mid_way_writes_nothing_more() -> None:
    """The grant committed, then the deadline passed (e.g. SIGSTOP between the two): the Pod
    annotation, the status and the Event are not written from the outdated pass."""
    controller, kube, store, switch = world()
    switch.leading = True
    acquire = store.acquire

    async def acquire_then_pause(*args: Any, **kwargs: Any) -> Any:
        result = await acquire(*args, **kwargs)
        switch.leading = False  # the process was paused past its renewal deadline
        return result

    store.acquire = acquire_then_pause  # type: ignore[method-assign]
    delay = await controller.scheduler._work(KEY)
    assert delay is None
    # The finalizer goes out after the grant's Pod write (not alongside the acquire), so it
    # meets the closed gate too: nothing at all is written after the pause.
    assert not kube.lease_finalizers
    assert not kube.annotations and not kube.statuses and not kube.events


async def test_leadership_forgets_the_previous_terms_status() -> None:
    controller, _, _, _ = world()
    stale = FencedLeaseStatus(holder="old")
    controller.leases.written(KEY, stale)
    assert controller.leases.status(KEY) == stale
    controller.leadership_started()
    assert controller.leases.status(KEY) == FencedLeaseStatus()


def _lease_body(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": NS,
            "name": "report",
            "uid": "u",
            "generation": 1,
            "finalizers": [LEASE_FINALIZER],
        },
        "spec": {"leaseDurationSeconds": 30, "holderSelector": {"matchLabels": {"app": "w"}}},
        "status": status,
    }


async def _restored_after_a_handover() -> tuple[
    Controller, RecordingKube, AsyncMemoryStore, Switch, int, int
]:
    """The leader granted w-1, then w-2 (a greater token); etcd then went back to a snapshot
    taken while w-1 held (``etcdutl snapshot restore`` without ``--bump-revision``)."""
    controller, kube, store, switch = world()
    clock = store.auth.clock
    assert isinstance(clock, FakeClock)
    switch.leading = True
    await controller.scheduler._work(KEY)
    first = await store.read(NS, "report")
    assert first is not None and first.record.holder == "w-1"
    snapshot = copy.deepcopy(store.auth.kv)
    controller.pods.upsert(
        PodInfo(NS, "w-1", "uid-1", "2026-01-01T00:00:00Z", {"app": "w"}, running=True, ready=False)
    )
    controller.pods.upsert(
        PodInfo(NS, "w-2", "uid-2", "2026-01-01T00:00:01Z", {"app": "w"}, running=True, ready=True)
    )
    clock.advance(31)
    await controller.scheduler._work(KEY)
    second = await store.read(NS, "report")
    assert second is not None and second.record.holder == "w-2" and second.token > first.token
    store.auth.kv = snapshot
    return controller, kube, store, switch, first.token, second.token


async def test_a_restored_generation_is_ended_only_by_the_leader() -> None:
    """The restored-generation fix writes to etcd (a force release) and an Event: a pass that
    lost leadership after its read ends nothing and reports nothing."""
    controller, kube, store, switch, old, _ = await _restored_after_a_handover()
    events, statuses = len(kube.events), len(kube.statuses)
    read = store.read

    async def read_then_pause(*args: Any, **kwargs: Any) -> Any:
        view = await read(*args, **kwargs)
        switch.leading = False  # paused past the renewal deadline right after the read
        return view

    store.read = read_then_pause  # type: ignore[method-assign]
    assert await controller.scheduler._work(KEY) is None
    store.read = read  # type: ignore[method-assign]
    view = await store.read(NS, "report")
    assert view is not None and view.token == old  # the outdated pass ended nothing
    assert view.record.state is LeaseState.HELD
    assert len(kube.events) == events and len(kube.statuses) == statuses


async def test_the_next_leader_ends_a_generation_restored_under_the_previous_one() -> None:
    """The greater token is known to every replica from the lease's signed status (the watch),
    not only to the replica that granted it: after a failover the new leader still ends the
    restored generation instead of renewing it."""
    _, first_kube, store, switch, old, newer = await _restored_after_a_handover()
    switch.leading = False
    _, _, status = first_kube.statuses[-1]
    assert status["fencingToken"] == newer

    standby_switch = Switch()
    standby_kube = RecordingKube()
    standby = Controller.build(store, standby_kube, TokenProofs(b"k" * 32), standby_switch)
    standby.leases.upsert(LeaseObject.from_body(_lease_body(status)))  # the watch
    for name, uid, ready in (("w-1", "uid-1", True), ("w-2", "uid-2", True)):
        standby.pods.upsert(
            PodInfo(NS, name, uid, "2026-01-01T00:00:00Z", {"app": "w"}, running=True, ready=ready)
        )
    assert standby.leases.verified_token(KEY) == newer

    standby_switch.leading = True
    standby.leadership_started()
    await standby.scheduler._work(KEY)
    assert "RestoredGeneration" in standby_kube.reasons()
    view = await store.read(NS, "report")
    assert view is None or view.record.state is not LeaseState.HELD or view.token != old
    assert all(s.get("fencingToken") != old for _, _, s in standby_kube.statuses)
    state = pod_annotation_keys("report")["state"]
    assert standby_kube.annotations.get((NS, "w-1"), {}).get(state) != "held"


def pod_at(kube: RecordingKube, controller: Controller, version: str, uid: str = "uid-1") -> None:
    """Pod w-1 as the API server has it (``version``), and the controller's copy of it."""
    pod = PodInfo(
        NS,
        "w-1",
        uid,
        "2026-01-01T00:00:00Z",
        {"app": "w"},
        running=True,
        ready=True,
        resource_version=version,
    )
    kube.pod_versions[(NS, "w-1")] = version
    kube.live_pods[(NS, "w-1")] = pod
    controller.pods.upsert(pod)


async def test_a_pod_annotation_sent_after_the_term_ended_is_refused() -> None:
    """The replica passed its gate, was paused before the request went out, and its successor
    annotated the Pod meanwhile: the resumed request carries the version it read before the
    gate, the API server refuses it, and the re-read's attempt meets the gate, closed."""
    controller, kube, _, switch = world()
    pod_at(kube, controller, "5")
    switch.leading = True
    patch = kube.patch_pod_annotations
    state = pod_annotation_keys("report")["state"]

    async def paused_after_the_gate(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        if switch.leading:
            switch.leading = False  # SIGSTOP here; the successor acts before SIGCONT
            kube.annotations[(NS, "w-1")] = {state: "lost"}
            kube.pod_versions[(NS, "w-1")] = "6"
        return await patch(namespace, name, annotations, resource_version)

    kube.patch_pod_annotations = paused_after_the_gate  # type: ignore[method-assign]
    assert await controller.scheduler._work(KEY) is None  # abandoned: NotLeader
    assert kube.annotations[(NS, "w-1")] == {state: "lost"}  # the successor's, untouched
    assert kube.pod_versions[(NS, "w-1")] == "6"
    assert kube.pod_reads == 1 and not kube.statuses


async def test_a_pod_version_moved_by_the_kubelet_costs_one_read() -> None:
    controller, kube, _, switch = world()
    pod_at(kube, controller, "5")
    kube.pod_versions[(NS, "w-1")] = "9"  # a status update the watch has not delivered
    switch.leading = True
    await controller.scheduler._work(KEY)
    assert kube.annotations[(NS, "w-1")][pod_annotation_keys("report")["state"]] == "held"
    assert kube.pod_reads == 1 and kube.pod_versions[(NS, "w-1")] == "10"


async def test_a_pod_recreated_under_the_same_name_is_not_annotated() -> None:
    controller, kube, _, switch = world()
    pod_at(kube, controller, "5")
    kube.live_pods[(NS, "w-1")] = PodInfo(NS, "w-1", "uid-2", "2026-01-01T00:01:00Z")
    kube.pod_versions[(NS, "w-1")] = "12"  # the new Pod's version
    switch.leading = True
    await controller.scheduler._work(KEY)
    assert (NS, "w-1") not in kube.annotations or not kube.annotations[(NS, "w-1")]
    assert kube.pod_reads == 1


async def test_one_pod_holding_many_leases_is_annotated_by_every_pass_without_rereads() -> None:
    """A Pod may hold many leases: concurrent passes take turns on it, each from the version
    the one before it wrote (with the Pod's version read at each pass's start they would
    refuse each other and give up)."""
    controller, kube, _, switch = world()
    keys = [KEY] + [LeaseKey(NS, f"job-{i}") for i in range(9)]
    for key in keys[1:]:
        body: dict[str, Any] = {
            "metadata": {"namespace": NS, "name": key.name, "uid": key.name, "generation": 1},
            "spec": {"leaseDurationSeconds": 30, "holderSelector": {"matchLabels": {"app": "w"}}},
            "status": FencedLeaseStatus().to_patch(),
        }
        controller.leases.upsert(LeaseObject.from_body(body))
    pod_at(kube, controller, "5")
    switch.leading = True
    patch = kube.patch_pod_annotations

    async def interleaved(
        namespace: str, name: str, annotations: dict[str, str | None], resource_version: str
    ) -> str | None:
        await asyncio.sleep(0)  # let the other passes run up to their own Pod write
        return await patch(namespace, name, annotations, resource_version)

    kube.patch_pod_annotations = interleaved  # type: ignore[method-assign]
    await asyncio.gather(*(controller.scheduler._work(key) for key in keys))
    written = kube.annotations[(NS, "w-1")]
    for key in keys:
        assert written[pod_annotation_keys(key.name)["state"]] == "held", key
    assert kube.pod_reads == 0
    assert kube.pod_versions[(NS, "w-1")] == str(5 + len(keys))


async def test_every_write_of_every_port_is_gated_and_only_the_reads_pass() -> None:
    """One generic gate (controller/leadership.py): every method of the controller's ports
    but the named reads raises NotLeader on a standby, so a write added to a port is gated
    without a line in the gate; on the leader each call reaches the adapter unchanged."""
    from fencedlease.controller.leadership import (
        KUBE_READS,
        STORE_READS,
        ControllerStore,
        ControllerWrites,
        NotLeader,
        gated_store,
        gated_writes,
    )

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

        def __getattr__(self, name: str) -> Any:
            async def call(*args: Any, **kwargs: Any) -> str:
                self.calls.append((name, args, kwargs))
                return name

            return call

    def methods(port: type) -> set[str]:
        return {
            name
            for klass in port.__mro__
            for name, value in vars(klass).items()
            if callable(value) and not name.startswith("_")
        }

    switch = Switch()
    for port, gate, reads in (
        (ControllerStore, gated_store, STORE_READS),
        (ControllerWrites, gated_writes, KUBE_READS),
    ):
        names = methods(port)
        assert reads < names and len(names - reads) >= 5, names
        adapter = Recorder()
        gated = gate(adapter, switch)
        switch.leading = False
        for name in sorted(names):
            call = getattr(gated, name)
            if name in reads:
                assert await call("ns", "n") == name
            else:
                try:
                    await call("ns", "n")
                except NotLeader:
                    continue
                raise AssertionError(f"{port.__name__}.{name} wrote on a standby")
        assert {c[0] for c in adapter.calls} == reads
        switch.leading = True
        for write in sorted(names - reads):
            assert await getattr(gated, write)("ns", "n", flag=1) == write
            assert adapter.calls[-1] == (write, ("ns", "n"), {"flag": 1})
