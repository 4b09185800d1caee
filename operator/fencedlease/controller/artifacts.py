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

An artifact the webhook never checked (bypassed, or let in by an older CRD) may show a spec
that does not parse (no ``leaseRef``, a token that is not an integer) or a status someone else
wrote (an ``acceptedFence`` for a token not issued for the lease, a boolean, a string).  Like a
lease's unverified status (``controller/reports.py``), each is *unverified*: reported once
with the ``UnverifiedToken`` Event, the ``unverified_tokens_total`` metric and a warning log,
never given to the mark, and the status is rewritten (verified token) or cleared.

See ``docs/fenced-publish.md`` ("What the high-water mark follows").
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from fencedlease import metrics
from fencedlease.authority.types import MarkAdvance, StoreUnavailable
from fencedlease.controller.ports import ArtifactWrites, CommitStore
from fencedlease.events import artifact_ref
from fencedlease.models import ARTIFACT_FINALIZER, rfc3339

log = logging.getLogger(__name__)

RETRY_UNAVAILABLE = 5.0
MAX_ERROR = 512
"""Characters of a parse error kept for the Event that reports it."""

STATUS_FIELDS = ("acceptedFence", "acceptedAt", "observedGeneration")
"""The status this recorder writes (and clears); ``kopf`` is Kopf's own."""


class ArtifactStatus(BaseModel):
    """``status`` as this recorder writes it: strict, so ``true`` is no ``acceptedFence``."""

    model_config = ConfigDict(strict=True, extra="ignore")

    acceptedFence: int | None = None  # the CRD's field names
    acceptedAt: str | None = None
    observedGeneration: int | None = None


def _integer(value: Any) -> int | None:
    """``value`` if it is an integer (a bool is not one), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _clip(error: str) -> str:
    return error if len(error) <= MAX_ERROR else error[: MAX_ERROR - 1] + "…"


def parse_spec(raw: Any) -> tuple[str | None, int | None, str, str | None]:
    """``(lease, token, objectRef, error)``: ``error`` says why the spec names no lease or
    no integer token (then neither is trusted)."""
    if not isinstance(raw, Mapping):
        return None, None, "", f"spec: not an object ({type(raw).__name__})"
    ref = raw.get("leaseRef")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    lease = name if isinstance(name, str) and name else None
    token = _integer(raw.get("fencingToken"))
    object_ref = str(raw.get("objectRef", ""))
    errors = []
    if lease is None:
        errors.append("spec.leaseRef.name: missing or not a non-empty string")
    if token is None:
        errors.append(f"spec.fencingToken: {raw.get('fencingToken')!r:.64} is not an integer")
    if errors:
        return None, None, object_ref, _clip("; ".join(errors))
    return lease, token, object_ref, None


def parse_status(raw: Any) -> tuple[int | None, bool, str | None]:
    """``(acceptedFence, shown, error)``: ``shown`` when the status holds anything this
    recorder writes (so clearing it changes something); ``error`` why it does not parse."""
    if raw is None:
        return None, False, None
    if not isinstance(raw, Mapping):
        return None, True, f"status: not an object ({type(raw).__name__})"
    shown = any(raw.get(name) is not None for name in STATUS_FIELDS)
    try:
        status = ArtifactStatus.model_validate(dict(raw))
    except ValidationError as exc:
        error = "; ".join(
            f"status.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        return None, shown, _clip(error)  # none of it is trusted
    return status.acceptedFence, shown, None


class Finding(NamedTuple):
    """Something unverified an artifact shows: the metric's ``kind`` and the Event's text."""

    kind: str
    message: str


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
    spec_error: str | None = None
    """Why the spec names no lease or no integer token: reported, never recorded."""
    status_error: str | None = None
    """Why the status does not parse: reported, never trusted, rewritten or cleared."""
    status_shown: bool = False
    """The status holds a field this recorder writes (clearing it changes something)."""

    @property
    def key(self) -> ArtifactKey:
        return ArtifactKey(self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ArtifactObject:
        meta = body.get("metadata") or {}
        lease, token, object_ref, spec_error = parse_spec(body.get("spec"))
        accepted, shown, status_error = parse_status(body.get("status"))
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            generation=_integer(meta.get("generation")),
            lease=lease,
            token=token,
            object_ref=object_ref,
            accepted_fence=accepted,
            finalizers=tuple(str(f) for f in meta.get("finalizers") or ()),
            deleting=meta.get("deletionTimestamp") is not None,
            spec_error=spec_error,
            status_error=status_error,
            status_shown=shown,
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
        self._reported: dict[ArtifactKey, tuple[str, frozenset[str]]] = {}

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
        # retired: a pruned record the mark covers (its status was written when verified)
        trusted = mark is not None and (mark.verified or mark.retired)
        await self._report(art, findings(art, trusted))
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
        if mark is not None and trusted:
            if art.status_error is not None or (mark.verified and art.accepted_fence != art.token):
                await self._accept(art)
        elif art.status_shown:
            # No verified token to record: whatever the status claims is cleared.
            await self.kube.patch_artifact_status(
                art.namespace, art.name, dict.fromkeys(STATUS_FIELDS), art.resource_version
            )
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

    async def _report(self, art: ArtifactObject, found: list[Finding]) -> None:
        """Each finding once while the artifact (by uid) shows it; one that goes away and
        comes back (a status forged again after it was cleared) is reported anew."""
        uid, said = self._reported.get(art.key, ("", frozenset[str]()))
        if uid != art.uid:
            said = frozenset()
        for finding in found:
            if finding.message in said:
                continue
            metrics.UNVERIFIED_TOKENS.labels(finding.kind).inc()
            log.warning("%s/%s: UnverifiedToken: %s", art.namespace, art.name, finding.message)
            await self.kube.event(
                artifact_ref(art.namespace, art.name, art.uid),
                "Warning",
                "UnverifiedToken",
                finding.message,
            )
        if found:
            self._reported[art.key] = (art.uid, frozenset(f.message for f in found))
        else:
            self._reported.pop(art.key, None)


def findings(art: ArtifactObject, trusted: bool) -> list[Finding]:
    """What ``art`` shows that is unverified; ``trusted``: its spec token was issued for its
    lease (or is a pruned one the mark covers)."""
    found: list[Finding] = []
    if art.spec_error is not None:
        found.append(
            Finding(
                "artifact",
                f"the spec does not parse: {art.spec_error}; it was written past the fence "
                "(webhook bypassed, or an older CRD), so it does not move any high-water mark",
            )
        )
    elif not trusted:
        found.append(
            Finding(
                "artifact",
                f"spec.fencingToken {art.token} was not issued for lease {art.lease}: it was "
                "written past the fence (webhook bypassed?), so it does not move the lease's "
                "high-water mark",
            )
        )
    if art.status_error is not None:
        fix = "rewritten from the verified token" if trusted else "cleared"
        found.append(
            Finding(
                "artifact_status",
                f"the status does not parse: {art.status_error}; none of it is trusted "
                f"(written by someone else, or let in by an older CRD) and it is {fix}",
            )
        )
    elif not trusted and art.accepted_fence is not None:
        found.append(
            Finding(
                "artifact_status",
                f"status.acceptedFence {art.accepted_fence} records a token this operator "
                "never accepted (the spec's token is unverified): written by someone else, "
                "it is not trusted and is cleared",
            )
        )
    return found
