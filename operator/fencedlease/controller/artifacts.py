"""Record committed FencedArtifact writes: the only way a fencing domain's high-water mark moves.

The admission webhook decides on a write *before* the API server commits it, and the API
server may still refuse it (schema, CEL, a lost resourceVersion race that it retries through
admission again) — and anyone who can reach the webhook's port can send it a made-up review.
So admission never changes fencing state.  This recorder watches what was really stored and,
for each artifact:

1. advances the domain's mark in etcd to the artifact's token (only a token issued for that
   lease moves it; anything else is reported as ``UnverifiedToken``);
2. keeps :data:`~fencedlease.models.ARTIFACT_FINALIZER` on the artifact while it lives and
   removes it once the mark covers the token, so delete-and-recreate cannot slip below it;
3. records ``status.acceptedFence`` and posts ``FenceAccepted``.

See ``docs/fenced-publish.md`` ("What the high-water mark follows").
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from fencedlease import metrics
from fencedlease.authority.types import MarkAdvance, StoreUnavailable
from fencedlease.controller.ports import ArtifactWrites, CommitStore
from fencedlease.events import artifact_ref
from fencedlease.models import ARTIFACT_FINALIZER, rfc3339

log = logging.getLogger(__name__)

RETRY_UNAVAILABLE = 5.0


class ArtifactKey(NamedTuple):
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class ArtifactObject:
    """The controller's copy of one FencedArtifact (from the watch)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int | None
    lease: str | None
    token: int | None
    object_ref: str
    accepted_fence: int | None
    finalizers: tuple[str, ...]
    deleting: bool

    @property
    def key(self) -> ArtifactKey:
        return ArtifactKey(self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ArtifactObject:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        lease = (spec.get("leaseRef") or {}).get("name")
        token = spec.get("fencingToken")
        accepted = status.get("acceptedFence")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            generation=meta.get("generation"),
            lease=lease if isinstance(lease, str) and lease else None,
            token=token if isinstance(token, int) and not isinstance(token, bool) else None,
            object_ref=str(spec.get("objectRef", "")),
            accepted_fence=accepted if isinstance(accepted, int) else None,
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
            deleting=meta.get("deletionTimestamp") is not None,
        )


class ArtifactRecorder:
    """One pass per artifact key (driven by a :class:`~.scheduler.Scheduler`)."""

    def __init__(
        self,
        store: CommitStore,
        kube: ArtifactWrites,
        *,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.store = store
        self.kube = kube
        self.wall = wall
        self._artifacts: dict[ArtifactKey, ArtifactObject] = {}
        self._reported: dict[ArtifactKey, tuple[str, int]] = {}

    # ---------------------------------------------------------------------- the cache

    def upsert(self, artifact: ArtifactObject) -> None:
        self._artifacts[artifact.key] = artifact

    def remove(self, key: ArtifactKey) -> None:
        self._artifacts.pop(key, None)
        self._reported.pop(key, None)

    def all_keys(self) -> list[ArtifactKey]:
        return list(self._artifacts)

    def get(self, key: ArtifactKey) -> ArtifactObject | None:
        return self._artifacts.get(key)

    # ------------------------------------------------------------------------ the pass

    async def reconcile(self, key: ArtifactKey) -> float | None:
        """Record the stored state of artifact ``key``; returns a retry delay or ``None``."""
        art = self._artifacts.get(key)
        if art is None:
            return None
        mark: MarkAdvance | None = None
        if art.lease is not None and art.token is not None:
            try:
                mark = await self.store.record_commit(art.namespace, art.lease, art.token)
            except StoreUnavailable as error:
                log.warning("%s/%s: cannot record its token yet: %s", *key, error)
                return RETRY_UNAVAILABLE
            if not mark.verified and not mark.retired:  # retired: a pruned record
                await self._report_unverified(art)
        if art.deleting:
            if ARTIFACT_FINALIZER in art.finalizers:
                rest = [f for f in art.finalizers if f != ARTIFACT_FINALIZER]
                await self.kube.set_artifact_finalizers(
                    art.namespace, art.name, art.resource_version, rest
                )
            return None
        if ARTIFACT_FINALIZER not in art.finalizers:
            # An artifact written before this finalizer existed (the webhook adds it to
            # every admitted write): a later patch would conflict, the next event retries.
            await self.kube.set_artifact_finalizers(
                art.namespace,
                art.name,
                art.resource_version,
                [*art.finalizers, ARTIFACT_FINALIZER],
            )
            return None
        if mark is not None and mark.verified and art.accepted_fence != art.token:
            await self._accept(art)
        return None

    async def _accept(self, art: ArtifactObject) -> None:
        recorded = await self.kube.patch_artifact_status(
            art.namespace,
            art.name,
            {
                "acceptedFence": art.token,
                "acceptedAt": rfc3339(self.wall()),
                "observedGeneration": art.generation,
            },
            art.resource_version,
        )
        if recorded:  # the committed write passed the fence: say so on the artifact
            await self.kube.event(
                artifact_ref(art.namespace, art.name, art.uid),
                "Normal",
                "FenceAccepted",
                f"accepted fencing token {art.token} of lease {art.lease}: "
                f"{art.object_ref} is visible",
            )

    async def _report_unverified(self, art: ArtifactObject) -> None:
        """Once per (uid, token): the token was not issued for the artifact's lease."""
        assert art.token is not None
        if self._reported.get(art.key) == (art.uid, art.token):
            return
        self._reported[art.key] = (art.uid, art.token)
        metrics.UNVERIFIED_TOKENS.labels("artifact").inc()
        await self.kube.event(
            artifact_ref(art.namespace, art.name, art.uid),
            "Warning",
            "UnverifiedToken",
            f"spec.fencingToken {art.token} was not issued for lease {art.lease}: it was "
            "written past the fence (webhook bypassed?), so it does not move the lease's "
            "high-water mark",
        )
