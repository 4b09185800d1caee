"""What the controller needs from its adapters, as Protocols (dependencies point inwards).

:class:`~fencedlease.store.etcd.EtcdStore` and :class:`~fencedlease.kube.KubeApi` satisfy
them in production; :class:`~fencedlease.authority.memory.AsyncMemoryStore` and a recording
fake satisfy them in the reconciler's unit tests.
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
from fencedlease.events import ObjectRef


class LeaseStore(Protocol):
    """The grant authority, as the lease reconciler uses it.  Every call raises
    :class:`~fencedlease.authority.types.StoreUnavailable` when it cannot decide; results
    carry decisions only."""

    async def read(self, namespace: str, name: str) -> LeaseView | None: ...

    async def acquire(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration_seconds: float,
        *,
        token_floor: int = ...,
        holder_uid: str | None = ...,
    ) -> AcquireResult: ...

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult: ...

    async def release(
        self, namespace: str, name: str, lease_id: str, token: int
    ) -> ReleaseResult: ...

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult: ...

    async def expire(
        self, namespace: str, name: str, lease_id: str | None = ...
    ) -> ExpireResult: ...

    async def delete(self, namespace: str, name: str) -> None: ...


class CommitStore(Protocol):
    """The grant authority, as the artifact recorder uses it."""

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance: ...


class EventWrites(Protocol):
    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


class PodAnnotationWrites(Protocol):
    """The Pod writes of the lease reconciler (:class:`~.podwrites.PodWrites`)."""

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod's body as the API server has it now (a read: never gated); ``None`` if
        gone."""

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: dict[str, str | None],
        resource_version: str,
    ) -> str | None:
        """Merge-patch annotations iff the Pod is still at ``resource_version`` (empty: no
        precondition): the Pod's new resourceVersion, ``None`` when it changed or is gone."""


class LeaseWrites(PodAnnotationWrites, EventWrites, Protocol):
    """The Kubernetes writes of the lease reconciler."""

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The FencedLease's body as the API server has it now (a read: never gated);
        ``None`` if gone."""

    async def patch_lease_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str | None:
        """Iff the lease is still at ``resource_version``: its new resourceVersion, else
        ``None`` (changed or gone)."""

    async def patch_lease_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> str | None:
        """The lease's new resourceVersion, ``None`` when it is gone."""

    async def set_lease_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> str | None:
        """Iff the lease is still at ``resource_version``: its new resourceVersion."""


class ReleaseWrites(Protocol):
    """Kubernetes writes of the holder releases (:mod:`.releases`)."""

    async def patch_release_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> bool: ...


class ClaimWrites(Protocol):
    """Kubernetes writes of the claims (:mod:`.claims`): items' leases and claim statuses."""

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None: ...

    async def delete_lease(self, namespace: str, name: str) -> None: ...

    async def patch_claim_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> bool: ...


class ArtifactWrites(EventWrites, Protocol):
    """The Kubernetes writes of the artifact recorder."""

    async def set_artifact_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> bool: ...

    async def patch_artifact_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> bool: ...
