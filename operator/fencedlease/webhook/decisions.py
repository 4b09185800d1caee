"""The fence decision of one write, whatever the object: pure, no I/O.

A :class:`FencedWrite` is what a review asks (lease, token, writer, the stored object it would
replace); :func:`order_against_stored`, :func:`holder_refusal` and :func:`fence_query` check it
against the stored object and say what to ask the store, and :func:`decide` combines the store's
answer (:func:`fencedlease.authority.fence.evaluate`) into a :class:`~.reviews.Verdict`.  The
FencedArtifact path (:mod:`.admission`) and the fenced-object path (:mod:`.objects`) parse their
reviews differently and decide with exactly these functions (docs/fenced-publish.md,
docs/fenced-objects.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fencedlease.authority import fence as fencing
from fencedlease.authority.types import FenceCode, FenceResult, FencingPolicy, LeaseKey
from fencedlease.webhook.reviews import AllowedWriters, Identity, Verdict, show


class WriteKind(StrEnum):
    """Kind of fenced write; also the ``operation`` label of the fence metric."""

    CREATE = "create"
    UPDATE = "update"
    STATUS = "status"
    DELETE = "delete"
    """A fenced object's DELETE: the stored object's token, checked for its deleter."""


@dataclass(frozen=True, slots=True)
class ObjectKind:
    """The kind of a fenced object (for Events on it): ``apps/v1`` ``Deployment``."""

    api_version: str
    kind: str


@dataclass(frozen=True, slots=True)
class StoredObject:
    """What ``request.oldObject`` says (the object the write would replace)."""

    uid: str
    resource_version: str
    lease: str | None
    token: int | None
    operation_id: str | None
    accepted_fence: int | None
    spec: Any
    metadata: tuple[Any, ...] = ()
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    """The stored object has a ``deletionTimestamp`` (its finalizers are all that keep it)."""


@dataclass(frozen=True, slots=True)
class FencedWrite:
    """One fenced write as the webhook sees it: a CREATE/UPDATE of a FencedArtifact (or its
    status), or a CREATE/UPDATE/DELETE of a labelled object (:mod:`.objects`)."""

    uid: str
    kind: WriteKind
    namespace: str
    name: str
    lease: str
    token: int
    operation_id: str | None
    dry_run: bool
    identity: Identity
    old: StoredObject | None
    resource_version: str
    accepted_fence: int | None = None
    finalizers: tuple[str, ...] | None = field(default=None)
    """``metadata.finalizers`` of the new object (``None``: the request had no list)."""
    deleting: bool = False
    """The artifact is being deleted: the *stored* object has a ``deletionTimestamp`` (the
    API server refuses new finalizers then). Never taken from the request's own object: a
    CREATE's ``deletionTimestamp`` is cleared and an UPDATE's is ignored after admission."""
    object_kind: ObjectKind | None = None
    """A fenced object's kind (``None``: a FencedArtifact)."""
    unconditional: bool = False
    """The resource accepts an UPDATE without ``resourceVersion`` (built-in kinds do)."""
    releases: bool = False
    """A fenced object's write that ends its fencing: a DELETE, or an UPDATE removing the
    lease label (admitted when the FencedLease no longer exists: nothing is left to fence)."""

    @property
    def domain(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.lease)

    @property
    def precondition_fails(self) -> bool:
        """The API server will refuse this write anyway (resourceVersion precondition).

        Mutating admission runs before the storage layer compares ``metadata.resourceVersion``
        with the stored object's, so a stale-version write reaches us first.  We still check
        it (and count a stale token), but must not advance the high-water mark or record its
        operation id for a write that cannot commit.  The same holds for an UPDATE without a
        resourceVersion, which custom resources refuse ("must be specified for an update").
        """
        if self.kind is WriteKind.CREATE:
            return bool(self.resource_version)
        if self.kind is WriteKind.DELETE:
            return False  # a DELETE's preconditions are in its options: counted as allowed
        if not self.resource_version:
            # Only a PUT without resourceVersion gets here (a patch is applied to the stored
            # object, version included): custom resources refuse unconditional PUTs.
            return not self.unconditional
        return self.old is not None and self.resource_version != self.old.resource_version


@dataclass(frozen=True, slots=True)
class MarkWait:
    """A write that publishes nothing but may pass only once the lease's high-water mark
    covers ``token`` (or ``token`` was never issued for the lease, so it cannot matter): an
    artifact's finalizer removal (:class:`~.admission.FinalizerRelease`), a fenced object's
    cluster delete or housekeeping (:class:`~.objects.CoverCheck`)."""

    uid: str
    namespace: str
    name: str
    lease: str
    token: int
    dry_run: bool

    @property
    def domain(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.lease)

    def covered(self, grant_ok: bool, mark: int | None) -> bool:
        """Does the mark cover ``token`` (``grant_ok``: the token was issued for the lease)?"""
        return not grant_ok or (mark is not None and mark >= self.token)


@dataclass(frozen=True, slots=True)
class FenceQuery:
    """What to ask the store for ``write`` and whether the answer may change the store.

    ``holder``/``holder_uid`` is the Pod the grant must belong to (``None``: not checked).
    The store is only ever *read* at admission (see the module docstring).
    """

    token: int
    holder: str | None
    holder_uid: str | None = None


@dataclass(frozen=True, slots=True)
class StoreAnswer:
    """The store's verdict plus the high-water mark it was compared with (read-only path)."""

    result: FenceResult
    hwm_before: int | None = None
    superseded: bool = False
    """The write's token belongs to a superseded generation (a newer grant exists, or the
    lease was deleted): ``stale_fence`` whatever the stored object shows (docs/tokens.md,
    superseded generations are checked before duplicates)."""


def holder_refusal(write: FencedWrite, writers: AllowedWriters) -> str | None:
    """Why the writer's identity may not write (the detail of a ``holder_mismatch``).

    A Pod-bound token is checked against the grant (name and UID) by the store; any other
    identity must be named in ``writers`` (a stolen token is useless from elsewhere).
    """
    if write.kind is WriteKind.STATUS:
        return None  # the operator records acceptance; RBAC restricts who writes status
    ident = write.identity
    if ident.is_pod:
        if ident.pod_namespace is not None and ident.pod_namespace != write.namespace:
            return (
                f"writer Pod {ident.pod_namespace}/{ident.pod_name} is not in the "
                f"namespace {write.namespace}"
            )
        return None
    if not writers.admit(ident):
        return (
            f"{show(ident.username) if ident.username else 'this identity'} is not a "
            "Pod-bound service-account token and is not among the allowed writers "
            "(FENCEDLEASE_ALLOWED_WRITERS; chart value allowedWriters)"
        )
    return None


def order_against_stored(write: FencedWrite, policy: FencingPolicy) -> tuple[FenceCode, str] | None:
    """The stored object is part of the high-water mark: compare with it (pure, no store).

    Returns the refusal (code and detail) or ``None``.  This is what makes check-and-write
    atomic: the API server calls admission again with the new stored object when its write
    lost a race, and refuses a resourceVersion-stale write itself.
    """
    old = write.old
    if write.kind is WriteKind.STATUS:
        return status_claim(write)
    if old is None or old.token is None or write.kind is WriteKind.DELETE:
        return None  # a DELETE writes no new token: its stored one meets the mark in decide()
    if old.lease is not None and old.lease != write.lease:
        return (
            FenceCode.LEASE_MISMATCH,
            f"spec.leaseRef.name is immutable (stored {old.lease!r}, got {write.lease!r})",
        )
    noun = "artifact" if write.object_kind is None else write.object_kind.kind
    detail = f"the stored {noun} carries token {old.token}"
    if write.token < old.token:
        return FenceCode.STALE_FENCE, detail
    if write.token == old.token:
        if write.operation_id is not None and write.operation_id == old.operation_id:
            # Under either policy: the stored object shows this very operation applied.
            return FenceCode.DUPLICATE, f"the stored {noun} already shows {write.operation_id}"
        if policy is FencingPolicy.STRICTLY_GREATER:
            return FenceCode.STALE_FENCE, detail + " (StrictlyGreater: one write per grant)"
    return None


def status_claim(write: FencedWrite) -> tuple[FenceCode, str] | None:
    """Status rule: ``status.acceptedFence`` may only be set to the stored spec token.

    The spec cannot change on the status subresource, so the token that was fenced when the
    spec was written is the only one that can have been accepted.  We do *not* compare it with
    the domain's current high-water mark: under StrictlyGreater the mark equals that token
    right after the write, and another artifact of the same lease may have advanced it since
    (recording that the older write was accepted is still true).  The grant is re-checked by
    the caller (``unknown_token`` / ``lease_mismatch``); the mark is never advanced.
    """
    assert write.old is not None and write.old.token is not None
    stored = write.old.token
    claimed = write.accepted_fence
    if claimed is None or claimed == stored:
        return None
    if claimed < stored:
        return (
            FenceCode.STALE_FENCE,
            f"status.acceptedFence {claimed} is below the stored spec.fencingToken {stored}",
        )
    return (
        FenceCode.UNKNOWN_TOKEN,
        f"status.acceptedFence {claimed} was never written to this artifact "
        f"(stored spec.fencingToken {stored})",
    )


def fence_query(write: FencedWrite, local: tuple[FenceCode, str] | None) -> FenceQuery:
    """What to ask the store (see :class:`FenceQuery`).

    A status write asks about the stored spec token (its grant must be real), read-only.

    Operation ids are *not* sent to the store: its list of applied operation ids would be
    written at admission, before the API server commits, and the API server re-runs admission
    after losing an optimistic-concurrency race, so a write that never committed would come
    back as ``duplicate`` (and a client would take a lost write for applied).  Duplicates are
    decided against the stored object instead (:func:`order_against_stored`), which only shows
    committed writes; reordered same-token writes are refused by the resourceVersion
    precondition.
    """
    if write.kind is WriteKind.STATUS:
        return FenceQuery(token=write.token, holder=None)
    return FenceQuery(
        token=write.token,
        holder=write.identity.pod_name,
        holder_uid=write.identity.pod_uid,
    )


_GRANT_CODES = (FenceCode.UNKNOWN_TOKEN, FenceCode.LEASE_MISMATCH, FenceCode.HOLDER_MISMATCH)


def decide(
    write: FencedWrite,
    local: tuple[FenceCode, str] | None,
    answer: StoreAnswer,
    *,
    holder_detail: str | None = None,
) -> Verdict:
    """Combine the store's answer, the stored-object check and the identity check.

    Order (docs/fenced-publish.md): the token must have been issued for the lease, to the
    writing Pod; then ordering against ``max(stored token, etcd mark)``; then duplicates.
    """
    result = answer.result
    if result.code in _GRANT_CODES:
        if write.kind is WriteKind.DELETE and write.object_kind is not None:
            return Verdict.from_fence(
                result.code,
                f"{result.message}; it is the token stored on {write.object_kind.kind} "
                f"{write.namespace}/{write.name}: write your own token to it first (a fenced "
                "write), then delete it with that resourceVersion as precondition",
            )
        return Verdict.from_fence(result.code, result.message)
    if holder_detail is not None:
        return Verdict.from_fence(
            FenceCode.HOLDER_MISMATCH,
            f"holder_mismatch: token {write.token} of lease {write.domain} may not be written "
            f"by this identity: {holder_detail} "
            f"(high-water mark {_mark(result.high_water_mark)})",
        )
    if write.kind is WriteKind.STATUS:
        if local is None:
            return Verdict.allow(
                FenceCode.APPLIED.value,
                f"applied: status.acceptedFence {write.accepted_fence} is the stored token of "
                f"lease {write.domain} (the high-water mark is not advanced by status writes)",
            )
        code, detail = local
        return Verdict.from_fence(code, f"{code.value}: {detail} (lease {write.domain})")
    superseded = answer.superseded and result.code is FenceCode.STALE_FENCE
    if local is not None and local[0] is FenceCode.DUPLICATE and superseded:
        # A zombie replaying its last write must not be told to carry on ("duplicate").
        return Verdict.from_fence(result.code, result.message)
    if local is not None:
        code, detail = local
        stored = write.old.token if write.old and write.old.token is not None else None
        before = answer.hwm_before if result.code is FenceCode.APPLIED else result.high_water_mark
        marks = [m for m in (stored, before) if m is not None]
        mark = max(marks) if marks else None
        if code is FenceCode.LEASE_MISMATCH:
            text = f"lease_mismatch: token {write.token}: {detail} (high-water mark {_mark(mark)})"
        else:
            text = fencing.message(
                code, write.token, mark, write.domain, operation_id=write.operation_id
            )
            text = f"{text}; {detail}"
        return Verdict.from_fence(code, text)
    if write.kind is WriteKind.DELETE and result.code is FenceCode.APPLIED:
        mark = answer.hwm_before
        if mark is None or mark < write.token:
            # Deleting an object whose last token is not in the mark yet would let a
            # re-create slip below it: wait (a few ms) for the controller to record it.
            return Verdict.unavailable(
                f"token {write.token} of the stored object is not yet in the high-water mark "
                f"of lease {write.domain} (now {_mark(mark)}): the fencedlease controller "
                "records committed writes; retry the delete"
            )
    return Verdict.from_fence(result.code, result.message)


def _mark(value: int | None) -> str:
    return "none" if value is None else str(value)
