"""The controller part of the process: caches, the two schedulers and Kopf, built from the
adapters the composition root (:mod:`fencedlease.app`) hands in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from fencedlease import metrics
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactKey, ArtifactRecorder
from fencedlease.controller.handlers import kopf_settings, registry
from fencedlease.controller.leases import LeaseCache
from fencedlease.controller.pods import PodCache
from fencedlease.controller.ports import ArtifactWrites, CommitStore, LeaseStore, LeaseWrites
from fencedlease.controller.reconciler import LeaseReconciler
from fencedlease.controller.scheduler import Scheduler

log = logging.getLogger(__name__)


class ControllerStore(LeaseStore, CommitStore, Protocol):
    """The grant authority as the whole controller uses it."""


class ControllerWrites(LeaseWrites, ArtifactWrites, Protocol):
    """The Kubernetes writes of the whole controller."""


@dataclass
class Controller:
    """Everything the Kopf handlers need (handed to them as ``memo.controller``)."""

    pods: PodCache
    leases: LeaseCache
    reconciler: LeaseReconciler
    scheduler: Scheduler[LeaseKey]
    artifacts: ArtifactRecorder
    artifact_scheduler: Scheduler[ArtifactKey]
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @classmethod
    def build(
        cls, store: ControllerStore, kube: ControllerWrites, proofs: TokenProofs
    ) -> Controller:
        pods, leases = PodCache(), LeaseCache(proofs)
        reconciler = LeaseReconciler(store, kube, pods, leases)
        artifacts = ArtifactRecorder(store, kube)
        return cls(
            pods=pods,
            leases=leases,
            reconciler=reconciler,
            scheduler=Scheduler(reconciler.reconcile, concurrency=32, priority=reconciler.priority),
            artifacts=artifacts,
            artifact_scheduler=Scheduler(artifacts.reconcile, concurrency=16),
        )

    async def run(
        self, *, namespace: str | None, stop: asyncio.Event, kopf_ready: asyncio.Event
    ) -> None:
        """Run the schedulers and Kopf until ``stop`` is set."""
        self._tasks = [
            asyncio.create_task(self.scheduler.run(), name="scheduler"),
            asyncio.create_task(self.artifact_scheduler.run(), name="artifact-scheduler"),
            asyncio.create_task(self._phase_gauge(), name="phase-gauge"),
        ]
        try:
            await kopf.operator(
                registry=registry,
                settings=kopf_settings(),
                standalone=True,
                clusterwide=namespace is None,
                namespaces=[namespace] if namespace else (),
                memo=kopf.Memo(controller=self),
                stop_flag=stop,
                ready_flag=kopf_ready,
            )
        finally:
            for task in self._tasks:
                task.cancel()
            for task in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _phase_gauge(self, every: float = 5.0) -> None:
        while True:
            for phase, count in self.leases.phases().items():
                metrics.LEASES_BY_PHASE.labels(phase).set(count)
            await asyncio.sleep(every)
