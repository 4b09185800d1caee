"""Test doubles shared by the unit and integration tests (one place each)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from fencedlease.controller.pods import PodInfo
from fencedlease.events import ObjectRef
from tests.client_fakes import run_plan as run_plan  # re-exported


@dataclass
class FakeClock:
    """A monotonic clock the test moves: leases expire by advancing it, never by sleeping."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeWall:
    """A wall clock that follows a :class:`FakeClock` (for timestamps handed to Pods)."""

    clock: FakeClock
    epoch: dt.datetime = dt.datetime(2026, 7, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=self.clock.now)


@dataclass
class RecordingKube:
    """The controller's Kubernetes writes, recorded (satisfies ``controller.ports``).

    ``annotations[(namespace, pod)]`` holds each Pod's merged annotations; ``statuses`` and
    ``events`` every write in order.  ``gone`` names Pods whose patches answer 404.
    """

    annotations: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    lease_annotations: list[tuple[str, str, dict[str, str | None]]] = field(default_factory=list)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)
    finalizers: list[tuple[str, str, list[str]]] = field(default_factory=list)
    lease_finalizers: list[tuple[str, str, list[str]]] = field(default_factory=list)
    artifact_statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    release_statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    claim_statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    created_leases: list[dict[str, Any]] = field(default_factory=list)
    deleted_leases: list[tuple[str, str]] = field(default_factory=list)
    gone: set[tuple[str, str]] = field(default_factory=set)
    # (namespace, lease) → its resourceVersion, for tests of the precondition: a write at
    # another version answers None (409), a write at this one bumps it. Untracked: accepted.
    lease_versions: dict[tuple[str, str], str] = field(default_factory=dict)

    # (namespace, pod) → its resourceVersion, likewise; ``live_pods`` what ``read_pod``
    # answers (with the current annotations and version), absent: gone.
    pod_versions: dict[tuple[str, str], str] = field(default_factory=dict)
    live_pods: dict[tuple[str, str], PodInfo] = field(default_factory=dict)
    pod_reads: int = 0
    # FencedLeases deleted from the API server: their writes answer None, reads None.
    leases_gone: set[tuple[str, str]] = field(default_factory=set)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.pod_reads += 1
        found = self.live_pods.get((namespace, name))
        if found is None or (namespace, name) in self.gone:
            return None
        return {
            "metadata": {
                "namespace": found.namespace,
                "name": found.name,
                "uid": found.uid,
                "creationTimestamp": found.created,
                "labels": dict(found.labels),
                "annotations": dict(self.annotations.get((namespace, name), {})),
                "resourceVersion": self.pod_versions.get((namespace, name), ""),
            },
            "status": {
                "phase": "Running" if found.running else "Pending",
                "conditions": [{"type": "Ready", "status": str(found.ready)}],
            },
        }

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if (namespace, name) in self.leases_gone:
            return None
        version = self.lease_versions.get((namespace, name), "")
        return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": version}}

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: dict[str, str | None],
        resource_version: str,
    ) -> str | None:
        if (namespace, name) in self.gone:
            return None
        version = self.pod_versions.get((namespace, name))
        if resource_version and version is not None and version != resource_version:
            return None  # 409: the Pod changed since ``resource_version``
        written = "1"
        if version is not None:
            written = self.pod_versions[(namespace, name)] = str(int(version) + 1)
        current = self.annotations.setdefault((namespace, name), {})
        for key, value in annotations.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        return written

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self.created_leases.append(body)
        meta = {**body["metadata"], "uid": f"uid-{len(self.created_leases)}", "generation": 1}
        return {**body, "metadata": meta}

    async def delete_lease(self, namespace: str, name: str) -> None:
        self.deleted_leases.append((namespace, name))

    async def patch_claim_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self.claim_statuses.append((namespace, name, status))
        return True

    async def patch_release_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self.release_statuses.append((namespace, name, status))
        return True

    async def patch_lease_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str | None:
        # As the adapter: an empty version is no precondition.
        if resource_version and not self._at(namespace, name, resource_version):
            return None
        self.statuses.append((namespace, name, status))
        return self._bump(namespace, name)

    async def patch_lease_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> str | None:
        self.lease_annotations.append((namespace, name, annotations))
        return self._bump(namespace, name)

    async def set_lease_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> str | None:
        if (namespace, name) in self.leases_gone or not self._at(namespace, name, resource_version):
            return None
        self.lease_finalizers.append((namespace, name, finalizers))
        return self._bump(namespace, name)

    def _at(self, namespace: str, name: str, resource_version: str) -> bool:
        """The API server's precondition, for leases whose version a test tracks."""
        current = self.lease_versions.get((namespace, name))
        return current is None or current == resource_version

    def _bump(self, namespace: str, name: str) -> str:
        current = self.lease_versions.get((namespace, name))
        if current is None:
            return "1"
        self.lease_versions[(namespace, name)] = str(int(current) + 1)
        return self.lease_versions[(namespace, name)]

    async def set_artifact_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> bool:
        self.finalizers.append((namespace, name, finalizers))
        return True

    async def patch_artifact_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> bool:
        self.artifact_statuses.append((namespace, name, status))
        return True

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((ref.name, type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events]
