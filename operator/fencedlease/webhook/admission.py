"""FencedArtifact reviews: AdmissionReview v1 of a FencedArtifact write in, what to check out
(pure, no I/O).

:func:`parse_review` turns a review into the :class:`~.decisions.FencedWrite` to fence, a
:class:`FinalizerRelease` (the finalizer coming off) or an immediate :class:`~.reviews.Verdict`
(malformed requests, writes that publish nothing). The decisions themselves are shared with
fenced objects (:mod:`.decisions`); :mod:`.checker` runs them against the store, and the
envelope, identity and reply code is :mod:`.reviews`'.

The rules (docs/fenced-publish.md):

* spec writes (CREATE, UPDATE of ``fencedartifacts``) with token ``t`` on lease ``L``:
  ``t`` was issued for ``L`` (``unknown_token`` / ``lease_mismatch``), to the writing Pod
  (name *and* UID of its Pod-bound service-account token; other identities only when named
  in the allowed writers, else ``holder_mismatch``), and ``t >= hwm`` (AllowEqual) /
  ``t > hwm`` (StrictlyGreater) where ``hwm`` is the max of the stored object's token and the
  domain's etcd high-water mark.  Under AllowEqual a same-token write whose ``operationId``
  the stored object already shows is a ``duplicate``.
* admission has no side effect on fencing state: the high-water mark is advanced by the
  controller from *committed* artifact states (a retried, later-rejected, dry-run or forged
  review changes nothing).  The only mutation is adding :data:`ARTIFACT_FINALIZER`, and an
  UPDATE that removes it is admitted only once the mark covers the stored token.
* an UPDATE that leaves ``spec`` unchanged (labels, annotations, finalizers) publishes nothing
  and is admitted without a fence check (it does not carry a new token).
* status writes (``fencedartifacts/status``) may only set ``status.acceptedFence`` to the
  stored ``spec.fencingToken``, which must be a token issued for the lease; they never advance
  the high-water mark (:func:`.decisions.status_claim`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fencedlease.models import ARTIFACT_FINALIZER, ARTIFACTS, GROUP, VERSION
from fencedlease.webhook.decisions import FencedWrite, MarkWait, StoredObject, WriteKind
from fencedlease.webhook.reviews import (
    MAX_TOKEN,
    Identity,
    Verdict,
    as_dict,
    as_int,
    envelope,
    finalizers_of,
    lease_name_ok,
    meta_of,
    parse_identity,
    review_uid,
    show,
    valid_names,
)

MAX_OBJECT_REF = 1024
MAX_OPERATION_ID = 253

__all__ = [
    "MAX_OBJECT_REF",
    "MAX_OPERATION_ID",
    "FinalizerRelease",
    "finalizer_patch",
    "finalizer_verdict",
    "parse_review",
]


@dataclass(frozen=True, slots=True)
class FinalizerRelease(MarkWait):
    """An UPDATE that takes :data:`ARTIFACT_FINALIZER` off an artifact (nothing else changes).

    Admitted only once the domain's high-water mark covers ``token`` (:class:`MarkWait`):
    otherwise deleting and re-creating the artifact could slip below a committed write the
    controller has not recorded yet.
    """


def _metadata(obj: dict[str, Any]) -> tuple[Any, ...]:
    """The user-settable metadata a spec-preserving update may change."""
    meta = meta_of(obj)
    return tuple(
        meta.get(key) or None
        for key in ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")
    )


def _stored(obj: Any) -> StoredObject | None:
    if not isinstance(obj, dict):
        return None
    meta = meta_of(obj)
    spec = as_dict(obj.get("spec"))
    status = as_dict(obj.get("status"))
    lease_ref = as_dict(spec.get("leaseRef"))
    lease = lease_ref.get("name")
    token = as_int(spec.get("fencingToken"))
    op = spec.get("operationId")
    return StoredObject(
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        # Only what a write could have stored (the schema and this webhook's own checks): a
        # forged oldObject's lease or token never reaches the store as a key.
        lease=lease if isinstance(lease, str) and lease_name_ok(lease) else None,
        token=token if token is not None and 1 <= token <= MAX_TOKEN else None,
        operation_id=op if isinstance(op, str) and op else None,
        accepted_fence=as_int(status.get("acceptedFence")),
        spec=obj.get("spec"),
        metadata=_metadata(obj),
        finalizers=finalizers_of(meta) or (),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def _spec_fields(spec: Any) -> tuple[str, int, str | None] | str:
    """``(lease, token, operation_id)`` or a user-facing error (mirrors the CRD schema, which
    the API server only applies *after* mutating admission)."""
    if not isinstance(spec, dict):
        return "spec is required"
    lease_ref = spec.get("leaseRef")
    lease = lease_ref.get("name") if isinstance(lease_ref, dict) else None
    if not isinstance(lease, str) or not lease:
        return "spec.leaseRef.name is required"
    if not lease_name_ok(lease):
        return f"spec.leaseRef.name {show(lease)} is not a valid FencedLease name (DNS label)"
    token = as_int(spec.get("fencingToken"))
    if token is None:
        return "spec.fencingToken must be an integer"
    if not 1 <= token <= MAX_TOKEN:
        return f"spec.fencingToken {token} must be between 1 and {MAX_TOKEN}"
    object_ref = spec.get("objectRef")
    if not isinstance(object_ref, str) or not object_ref:
        return "spec.objectRef is required"
    if len(object_ref) > MAX_OBJECT_REF:
        return f"spec.objectRef is longer than {MAX_OBJECT_REF} characters"
    op = spec.get("operationId")
    if op is not None and (not isinstance(op, str) or len(op) > MAX_OPERATION_ID):
        return f"spec.operationId must be a string of at most {MAX_OPERATION_ID} characters"
    return lease, token, (op or None)


@dataclass(frozen=True, slots=True)
class _Request:
    """What every artifact write shares, read from a review's envelope."""

    uid: str
    kind: WriteKind
    namespace: str
    name: str
    obj: dict[str, Any]
    old: StoredObject | None
    identity: Identity
    dry_run: bool
    resource_version: str


def parse_review(body: Any) -> FencedWrite | FinalizerRelease | Verdict:
    """Turn an AdmissionReview v1 into the write to fence, or an immediate verdict."""
    request = _parse_request(body)
    if isinstance(request, Verdict):
        return request
    if request.kind is WriteKind.STATUS:
        return _status_write(request)
    return _spec_write(request)


def _parse_request(body: Any) -> _Request | Verdict:
    """The envelope: an AdmissionReview v1 of a FencedArtifact create, update or status write
    with valid names; anything else is ``invalid`` (or, not a fenced operation, allowed)."""
    request = envelope(body)
    if isinstance(request, Verdict):
        return request
    resource = as_dict(request.get("resource"))
    if (resource.get("group"), resource.get("resource")) != (GROUP, ARTIFACTS):
        return Verdict.invalid(
            f"this webhook fences {ARTIFACTS}.{GROUP} only, got "
            f"{show(str(resource.get('resource')))}.{show(str(resource.get('group')))}"
        )
    if resource.get("version") not in (VERSION, None):
        return Verdict.invalid(f"unsupported version {show(str(resource.get('version')))}")
    operation = request.get("operation")
    sub = request.get("subResource") or ""
    if sub not in ("", "status"):
        return Verdict.invalid(f"subresource {show(str(sub))} is not fenced by this webhook")
    if operation not in ("CREATE", "UPDATE"):
        # DELETE and CONNECT are not registered; admit defensively-registered ones unchanged.
        return Verdict.allow("unchanged", f"{operation} is not a fenced write")
    obj = request.get("object")
    if not isinstance(obj, dict):
        return Verdict.invalid("request.object is missing")
    namespace = request.get("namespace") or meta_of(obj).get("namespace") or ""
    name = request.get("name") or meta_of(obj).get("name") or ""
    if not isinstance(namespace, str) or not isinstance(name, str):
        return Verdict.invalid("request.namespace and request.name must be strings")
    bad_name = valid_names(namespace, name, operation)
    if bad_name is not None:
        return Verdict.invalid(bad_name)
    kind = WriteKind.CREATE if operation == "CREATE" else WriteKind.UPDATE
    return _Request(
        uid=review_uid(body),
        kind=WriteKind.STATUS if sub == "status" else kind,
        namespace=namespace,
        name=name,
        obj=obj,
        old=_stored(request.get("oldObject")) if operation == "UPDATE" else None,
        identity=parse_identity(request.get("userInfo")),
        dry_run=bool(request.get("dryRun")),
        resource_version=str(meta_of(obj).get("resourceVersion") or ""),
    )


def _status_write(r: _Request) -> FencedWrite | Verdict:
    """A status write: fenced when it changes ``acceptedFence`` (the stored spec's token)."""
    old, rv = r.old, r.resource_version
    # The API server keeps the stored spec on a status write (whatever the body says).
    if old is None or old.lease is None or old.token is None:
        return Verdict.allow("unchanged", "status of an artifact without a valid spec")
    status = as_dict(r.obj.get("status"))
    accepted = as_int(status.get("acceptedFence"))
    if "acceptedFence" in status and accepted is None and status["acceptedFence"] is not None:
        return Verdict.invalid("status.acceptedFence must be an integer")
    if accepted is None or accepted == old.accepted_fence:
        return Verdict.allow("unchanged", "status.acceptedFence is not changed")
    if rv and rv != old.resource_version:
        # Mutating admission runs before the storage precondition: this write is
        # refused with 409 Conflict anyway, which is the truthful answer.
        return Verdict.allow("unchanged", "stale resourceVersion: the write cannot commit")
    return FencedWrite(
        uid=r.uid,
        kind=r.kind,
        namespace=r.namespace,
        name=r.name,
        lease=old.lease,
        token=old.token,
        operation_id=None,
        dry_run=r.dry_run,
        identity=r.identity,
        old=old,
        resource_version=rv,
        accepted_fence=accepted,
    )


def _spec_write(r: _Request) -> FencedWrite | FinalizerRelease | Verdict:
    """A create or an update: fenced when it publishes (the spec changes, or a retry of its
    operation); dropping the finalizer is a :class:`FinalizerRelease`."""
    old, obj = r.old, r.obj
    finalizers = finalizers_of(meta_of(obj))
    deleting = old is not None and old.deleting
    if r.kind is WriteKind.UPDATE and old is not None and obj.get("spec") == old.spec:
        # Labels, annotations, finalizers...: nothing is published.  A write that changes
        # nothing at all and names an operation is a retry of it: checked (→ duplicate).
        retry = old.operation_id is not None and _metadata(obj) == old.metadata
        if (
            ARTIFACT_FINALIZER in old.finalizers
            and ARTIFACT_FINALIZER not in (finalizers or ())
            and old.lease is not None
            and old.token is not None
        ):
            return FinalizerRelease(r.uid, r.namespace, r.name, old.lease, old.token, r.dry_run)
        if not retry:
            return Verdict.allow("unchanged", "spec is unchanged: nothing is published")
    if (
        deleting
        and old is not None
        and ARTIFACT_FINALIZER in old.finalizers
        and ARTIFACT_FINALIZER not in (finalizers or ())
    ):
        # The finalizer cannot be added back to an object being deleted: this write would
        # commit its token and delete the artifact in one step, before the controller
        # records the token in the high-water mark.
        return Verdict.invalid(
            f"a write that changes the spec of an artifact being deleted must keep the "
            f"finalizer {ARTIFACT_FINALIZER}; the fencedlease controller removes it once the "
            "high-water mark covers the artifact's token"
        )
    fields = _spec_fields(obj.get("spec"))
    if isinstance(fields, str):
        return Verdict.invalid(fields)
    lease, token, operation_id = fields
    return FencedWrite(
        uid=r.uid,
        kind=r.kind,
        namespace=r.namespace,
        name=r.name,
        lease=lease,
        token=token,
        operation_id=operation_id,
        dry_run=r.dry_run,
        identity=r.identity,
        old=old,
        resource_version=r.resource_version,
        finalizers=finalizers,
        deleting=deleting,
    )


# ----------------------------------------------------------------------------- response


def finalizer_patch(write: FencedWrite) -> list[dict[str, Any]] | None:
    """The JSONPatch that adds :data:`ARTIFACT_FINALIZER` to an admitted spec write, if
    missing (never on an object being deleted: the API server refuses new finalizers then)."""
    if write.kind is WriteKind.STATUS or write.deleting:
        return None
    if write.finalizers is None:
        return [{"op": "add", "path": "/metadata/finalizers", "value": [ARTIFACT_FINALIZER]}]
    if ARTIFACT_FINALIZER in write.finalizers:
        return None
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": ARTIFACT_FINALIZER}]


def finalizer_verdict(release: FinalizerRelease, grant_ok: bool, mark: int | None) -> Verdict:
    """May :data:`ARTIFACT_FINALIZER` come off (see :class:`FinalizerRelease`)?"""
    if release.covered(grant_ok, mark):
        return Verdict.allow("unchanged", "the high-water mark covers the artifact's token")
    return Verdict.invalid(
        f"finalizer {ARTIFACT_FINALIZER} stays until the high-water mark of lease "
        f"{release.domain} covers token {release.token} (now {_shown(mark)}); the "
        "fencedlease controller records committed writes and removes it"
    )


def _shown(mark: int | None) -> str:
    return "none" if mark is None else str(mark)
