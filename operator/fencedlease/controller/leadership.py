"""The controller's write gate: only the elected replica writes (``docs/operations.md``,
"Controller failover").

Every write the controller makes — a grant, renewal or release in etcd, a Pod annotation, a
lease status or finalizer, an artifact status or finalizer, an Event — goes through
:class:`GatedStore` or :class:`GatedWrites`, which ask :class:`Leadership` right before the
call. A standby keeps its caches warm from the watches and writes nothing; a replica whose
renewal deadline passed (by its own monotonic clock, e.g. after SIGSTOP) gets
:class:`NotLeader` from its next write and abandons the pass.
"""

from __future__ import annotations

from typing import Any, Protocol

from fencedlease.authority.types import (
    AcquireResult,
    ExpireResult,
    LeaseView,
    MarkAdvance,
    ReleaseResult,
    RenewResult,
)
from fencedlease.controller.ports import (
    ArtifactWrites,
    ClaimWrites,
    CommitStore,
    LeaseStore,
    LeaseWrites,
    ReleaseWrites,
)
from fencedlease.events import ObjectRef


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


class AlwaysLeader:
    """Leader election disabled (one replica by contract, e.g. ``local up``)."""

    def is_leader(self) -> bool:
        return True


class NotLeader(Exception):
    """This replica may not write now; the pass that tried is abandoned."""


class ControllerStore(LeaseStore, CommitStore, Protocol):
    """The grant authority as the whole controller uses it."""


class ControllerWrites(LeaseWrites, ArtifactWrites, ReleaseWrites, ClaimWrites, Protocol):
    """The Kubernetes writes of the whole controller."""


class GatedStore:
    """The store, every write behind the gate (reads pass: they keep nothing)."""

    def __init__(self, store: ControllerStore, leadership: Leadership) -> None:
        self._store = store
        self._leadership = leadership

    def _gate(self) -> None:
        if not self._leadership.is_leader():
            raise NotLeader

    async def read(self, namespace: str, name: str) -> LeaseView | None:
        return await self._store.read(namespace, name)

    async def acquire(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration_seconds: float,
        *,
        token_floor: int = 0,
        holder_uid: str | None = None,
    ) -> AcquireResult:
        self._gate()
        return await self._store.acquire(
            namespace,
            name,
            holder,
            duration_seconds,
            token_floor=token_floor,
            holder_uid=holder_uid,
        )

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        self._gate()
        return await self._store.renew(namespace, name, lease_id, token)

    async def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        self._gate()
        return await self._store.release(namespace, name, lease_id, token)

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        self._gate()
        return await self._store.force_release(namespace, name, lease_id)

    async def expire(self, namespace: str, name: str, lease_id: str | None = None) -> ExpireResult:
        self._gate()
        return await self._store.expire(namespace, name, lease_id)

    async def delete(self, namespace: str, name: str) -> None:
        self._gate()
        await self._store.delete(namespace, name)

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        self._gate()
        return await self._store.record_commit(namespace, name, token)


class GatedWrites:
    """The Kubernetes writes, each behind the gate."""

    def __init__(self, kube: ControllerWrites, leadership: Leadership) -> None:
        self._kube = kube
        self._leadership = leadership

    def _gate(self) -> None:
        if not self._leadership.is_leader():
            raise NotLeader

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self._gate()
        await self._kube.event(ref, type_, reason, message)

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._kube.read_pod(namespace, name)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._kube.get_lease(namespace, name)

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: dict[str, str | None],
        resource_version: str,
    ) -> str | None:
        self._gate()
        return await self._kube.patch_pod_annotations(
            namespace, name, annotations, resource_version
        )

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        self._gate()
        return await self._kube.create_lease(namespace, body)

    async def delete_lease(self, namespace: str, name: str) -> None:
        self._gate()
        await self._kube.delete_lease(namespace, name)

    async def patch_claim_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self._gate()
        return await self._kube.patch_claim_status(namespace, name, status)

    async def patch_release_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self._gate()
        return await self._kube.patch_release_status(namespace, name, status)

    async def patch_lease_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str | None:
        self._gate()
        return await self._kube.patch_lease_status(namespace, name, status, resource_version)

    async def patch_lease_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> str | None:
        self._gate()
        return await self._kube.patch_lease_annotations(namespace, name, annotations)

    async def set_lease_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> str | None:
        self._gate()
        return await self._kube.set_lease_finalizers(namespace, name, resource_version, finalizers)

    async def set_artifact_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> bool:
        self._gate()
        return await self._kube.set_artifact_finalizers(
            namespace, name, resource_version, finalizers
        )

    async def patch_artifact_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> bool:
        self._gate()
        return await self._kube.patch_artifact_status(namespace, name, status, resource_version)
