"""The controller part of the process: caches, the two schedulers and our watches that feed
them, built from the adapters the composition root (:mod:`fencedlease.app`) hands in; Kopf
(``fencedlease.kopfapp``) feeds it the FencedLease events.

Every replica watches (its caches stay warm); the schedulers run passes only while
:class:`~.leadership.Leadership` says this replica leads, and every write of a pass goes
through the gate of :mod:`.leadership`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from fencedlease import metrics
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactKey, ArtifactRecorder
from fencedlease.controller.claims import ClaimRequests, Claims
from fencedlease.controller.deletions import Deletions
from fencedlease.controller.endings import Endings
from fencedlease.controller.grants import Memories, RenewalTicks
from fencedlease.controller.handlers import (
    artifacts_listed,
    claims_listed,
    on_artifact,
    on_claim_event,
    on_pod,
    on_release_event,
    pods_listed,
    releases_listed,
)
from fencedlease.controller.leadership import (
    AlwaysLeader,
    ControllerStore,
    ControllerWrites,
    Leadership,
    NotLeader,
    gated_store,
    gated_writes,
)
from fencedlease.controller.leases import LeaseCache
from fencedlease.controller.pods import PodCache
from fencedlease.controller.podwrites import PodWrites
from fencedlease.controller.ports import ClaimWrites, LeaseStore, LeaseWrites, ReleaseWrites
from fencedlease.controller.reconciler import LeaseReconciler
from fencedlease.controller.releases import HolderReleases, ReleaseRequests
from fencedlease.controller.reports import LeaseEvents
from fencedlease.controller.scheduler import Scheduler
from fencedlease.controller.steps import WAKE_SLACK
from fencedlease.health import SchedulerProgress, WatchActivity
from fencedlease.models import ARTIFACTS, CLAIMS, GROUP, RELEASES, VERSION
from fencedlease.watching import CLIENT_TIMEOUT, Api, ListWatch, Watched

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)

LEASE_WORKERS = 64
"""Lease passes run at once. Renewals mostly wait on etcd and one Pod write, and the renewals of
the leases one Pod holds run back to back (the scheduler's groups): the more of them run at
once, the more of one Pod's renewals share its write (docs/operations.md, "What a renewal
writes")."""

__all__ = ["Controller", "ControllerStore", "ControllerWrites"]


class Parked(Generic[K]):
    """Keys whose pass met a closed gate, to run again once this replica leads.

    The gate is a deadline (:meth:`Leadership.is_leader`): when the process is starved past
    its renewal deadline and the election's next renewal still lands in time, leadership
    lapses for a moment without ever being seen to stop or start, and nothing else would
    poke the passes dropped in that moment (a lease never granted, a renewal never
    rescheduled). ``exists``: whether a key is still watched (a standby parks every key it
    is poked for; keys of objects deleted meanwhile are dropped, not kept)."""

    def __init__(self, exists: Callable[[K], bool]) -> None:
        self._keys: set[K] = set()
        self._exists = exists
        self._limit = 64

    def add(self, key: K) -> None:
        self._keys.add(key)
        if len(self._keys) > self._limit:  # some may be deleted meanwhile: drop those
            self._keys = {k for k in self._keys if self._exists(k)}
            self._limit = max(64, 2 * len(self._keys))  # amortized: at most 2x what exists

    def take(self) -> set[K]:
        keys, self._keys = self._keys, set()
        return keys

    def __len__(self) -> int:
        return len(self._keys)


def gated(
    leadership: Leadership,
    work: Callable[[K], Awaitable[float | None]],
    parked: Parked[K] | None = None,
) -> Callable[[K], Awaitable[float | None]]:
    """A scheduler's work that runs only while this replica leads.

    A pass that meets the closed gate is dropped and its key ``parked``: the key is poked
    again when leadership starts, or, after a lapse that never ended the term, by
    :meth:`Controller.unpark`; a pass that meets the gate in one of its writes (the deadline
    passed meanwhile) is abandoned, and parked too."""

    async def run(key: K) -> float | None:
        if not leadership.is_leader():
            if parked is not None:
                parked.add(key)
            return None
        try:
            return await work(key)
        except NotLeader:
            log.info("%s: pass abandoned, this replica no longer leads", key)
            if parked is not None:
                parked.add(key)
            return None

    return run


@dataclass
class Controller:
    """The controller part: its caches, schedulers and watches."""

    pods: PodCache
    leases: LeaseCache
    release_requests: ReleaseRequests
    """The FencedReleases the watch keeps, which the reconciler's passes act on."""
    claim_requests: ClaimRequests
    """The FencedClaims the watch keeps, which the reconciler's passes act on."""
    reconciler: LeaseReconciler
    scheduler: Scheduler[LeaseKey]
    artifacts: ArtifactRecorder
    artifact_scheduler: Scheduler[ArtifactKey]
    leadership: Leadership = field(default_factory=AlwaysLeader)
    watches: WatchActivity = field(default_factory=lambda: WatchActivity(CLIENT_TIMEOUT))
    """The watch loops' last signs of life (liveness)."""
    parked_leases: Parked[LeaseKey] | None = None
    parked_artifacts: Parked[ArtifactKey] | None = None
    """Keys whose pass met the closed gate (:class:`Parked`), run again by :meth:`unpark`."""
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        store: ControllerStore,
        kube: ControllerWrites,
        proofs: TokenProofs,
        leadership: Leadership | None = None,
        pod_selector: str | None = None,
    ) -> Controller:
        leadership = leadership or AlwaysLeader()
        store, kube = gated_store(store, leadership), gated_writes(kube, leadership)
        pods, leases = PodCache(), LeaseCache(proofs)
        release_requests, claim_requests = ReleaseRequests(), ClaimRequests()
        reconciler = lease_reconciler(
            store,
            kube,
            pods,
            leases,
            release_requests=release_requests,
            claim_requests=claim_requests,
            release_writes=kube,
            claim_writes=kube,
            pod_scope=pod_selector,
        )
        artifacts = ArtifactRecorder(store, kube)
        parked_leases: Parked[LeaseKey] = Parked(lambda k: leases.get(k) is not None)
        parked_artifacts: Parked[ArtifactKey] = Parked(lambda k: artifacts.get(k) is not None)
        return cls(
            pods=pods,
            leases=leases,
            release_requests=release_requests,
            claim_requests=claim_requests,
            reconciler=reconciler,
            scheduler=Scheduler(
                gated(leadership, reconciler.reconcile, parked_leases),
                concurrency=LEASE_WORKERS,
                priority=reconciler.priority,
                group=reconciler.group,
                kind="leases",
                slack=WAKE_SLACK,
            ),
            artifacts=artifacts,
            artifact_scheduler=Scheduler(
                gated(leadership, artifacts.reconcile, parked_artifacts),
                concurrency=16,
                kind="artifacts",
            ),
            leadership=leadership,
            parked_leases=parked_leases,
            parked_artifacts=parked_artifacts,
        )

    def leadership_started(self) -> None:
        """This replica leads now: forget the previous term's writes, look at everything."""
        self.reconciler.leadership_started()
        for parked in (self.parked_leases, self.parked_artifacts):
            if parked is not None:
                parked.take()  # every key is poked below
        for key in self.leases.all_keys():
            self.scheduler.poke(key)
        for artifact in self.artifacts.all_keys():
            self.artifact_scheduler.poke(artifact)

    def unpark(self) -> None:
        """While this replica leads, run again every pass that met the closed gate."""
        if not self.leadership.is_leader():
            return
        if self.parked_leases is not None:
            for key in self.parked_leases.take():
                self.scheduler.poke(key)
        if self.parked_artifacts is not None:
            for artifact in self.parked_artifacts.take():
                self.artifact_scheduler.poke(artifact)

    async def _unpark_loop(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            self.unpark()

    def progress(self) -> list[SchedulerProgress]:
        """Both schedulers' progress (liveness: :func:`fencedlease.health.scheduler_stuck`)."""
        return [
            self.scheduler.progress("leases"),
            self.artifact_scheduler.progress("artifacts"),
        ]

    def list_watches(
        self,
        api: Api,
        namespace: str | None,
        pod_selector: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> list[ListWatch]:
        """Our watches that feed the caches (the FencedLeases come from Kopf): Pods (only
        those ``pod_selector`` matches, filtered by the API server: Pods without it are never
        sent, cached or handled; one that stops matching arrives as ``DELETED``, one that
        starts as ``ADDED``), FencedArtifacts, FencedReleases and FencedClaims, in
        ``namespace`` or all. Each needs every deletion seen, which Kopf's public API cannot
        report (docs/design.md, "What is Kopf's and what is ours")."""

        def activity(plural: str) -> Callable[[], None]:
            return lambda: self.watches.saw(plural, clock())

        kinds = [
            (Watched("", "v1", "pods", namespace, pod_selector), on_pod, pods_listed),
            (Watched(GROUP, VERSION, ARTIFACTS, namespace), on_artifact, artifacts_listed),
            (Watched(GROUP, VERSION, RELEASES, namespace), on_release_event, releases_listed),
            (Watched(GROUP, VERSION, CLAIMS, namespace), on_claim_event, claims_listed),
        ]
        return [
            ListWatch(
                api,
                what,
                functools.partial(sink, self),
                on_listed=functools.partial(listed, self),
                on_activity=activity(what.plural),
            )
            for what, sink, listed in kinds
        ]

    async def start(
        self,
        api: Api,
        *,
        namespace: str | None,
        listed: asyncio.Event,
        pod_selector: str | None = None,
    ) -> None:
        """Start the schedulers and our watches (:meth:`list_watches`); ``listed`` is set
        once each of them handed over its first complete list. The FencedLease events come
        from Kopf (``handlers.on_lease``, called by ``fencedlease.kopfapp``). :meth:`stop` ends
        them.

        ``pod_selector``: a label selector every candidate Pod carries; only those Pods are
        listed and watched (server side), and the Pod cache holds nothing else."""
        if pod_selector:
            log.info("Pod watch scoped to Pods with labels %r", pod_selector)
        watches = self.list_watches(api, namespace, pod_selector)
        self._tasks = [
            asyncio.create_task(self.scheduler.run(), name="scheduler"),
            asyncio.create_task(self.artifact_scheduler.run(), name="artifact-scheduler"),
            asyncio.create_task(self._phase_gauge(), name="phase-gauge"),
            asyncio.create_task(self._unpark_loop(), name="unpark"),
            *(asyncio.create_task(w.run(), name=f"watch-{w.what.plural}") for w in watches),
        ]

        async def all_listed() -> None:
            for watch in watches:
                await watch.synced.wait()
            listed.set()

        self._tasks.append(asyncio.create_task(all_listed(), name="listed"))

    async def stop(self) -> None:
        """End what :meth:`start` started: its watches and passes."""
        log.info("controller stopping: its watches and passes end")
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _phase_gauge(self, every: float = 5.0) -> None:
        while True:
            for phase, count in self.leases.phases().items():
                metrics.LEASES_BY_PHASE.labels(phase).set(count)
            await asyncio.sleep(every)


def lease_reconciler(
    store: LeaseStore,
    kube: LeaseWrites,
    pods: PodCache,
    leases: LeaseCache,
    *,
    release_requests: ReleaseRequests | None = None,
    claim_requests: ClaimRequests | None = None,
    release_writes: ReleaseWrites | None = None,
    claim_writes: ClaimWrites | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    pod_scope: str | None = None,
) -> LeaseReconciler:
    """A :class:`LeaseReconciler` and its collaborators, each built once from the ports it is
    handed: the one place they are put together (:meth:`Controller.build` and the
    tests' worlds call it). ``release_requests``/``claim_requests``: the registries the watch
    handlers keep (new ones when not given)."""
    memory = Memories()
    events = LeaseEvents(kube, memory)
    writes = PodWrites(kube, pods, clock=clock)
    return LeaseReconciler(
        store,
        kube,
        pods,
        leases,
        memory=memory,
        ticks=RenewalTicks(pods),
        writes=writes,
        events=events,
        endings=Endings(store, kube, events),
        releases=HolderReleases(
            store, release_writes, events, release_requests or ReleaseRequests(), wall=wall
        ),
        claims=Claims(store, claim_writes, leases, claim_requests or ClaimRequests(), clock),
        deletions=Deletions(store, kube, leases, memory, writes),
        clock=clock,
        wall=wall,
        pod_scope=pod_scope,
    )
