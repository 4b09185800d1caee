"""Pure admission logic for fenced objects: any namespaced object of a kind a FencePolicy
declares, labelled ``fencedlease.io/lease: <lease>`` (docs/fenced-objects.md). No I/O.

:func:`parse_object_review` turns an AdmissionReview into a :class:`~.decisions.FencedWrite`
(decided exactly like a FencedArtifact write, :mod:`.decisions`), a :class:`CoverCheck`, or an
immediate :class:`~.reviews.Verdict`:

* CREATE of a labelled object, and every UPDATE whose stored *or* new object is labelled,
  must carry ``fencedlease.io/token: "<t>"``: ``t`` was issued for the lease, to the writing
  Pod (or a named writer), and ``t >= mark`` (AllowEqual) / ``t > mark`` (StrictlyGreater),
  the mark being the larger of the stored object's token and the lease's mark in etcd.
  Removing the label is such a write (its token is checked against the label's lease);
  removing the token while labelled is ``invalid``; moving the object to another lease in one
  write is ``lease_mismatch`` (remove the label under the old lease, add it under the new).
* DELETE: the *stored* object's token must be the deleter's and meet the mark, and the mark
  must already cover it (else ``unavailable``, retried): a re-create cannot slip below it.
* Housekeeping (an UPDATE of the main resource that changes nothing but server-kept metadata,
  or only removes finalizers or ownerReferences: the garbage collector)
  publishes nothing and is admitted unfenced; on an object being deleted it must wait, like a
  delete, until the mark covers the stored token (removing the last finalizer deletes it).
* The garbage collector's and the namespace controller's deletes (:data:`CLUSTER_DELETERS`)
  are not identity-fenced (they act for a deleted owner or namespace), only mark-covered; one
  of an object without a valid token (labelled before its policy) is admitted.
* The stored object is read leniently (:func:`_stored_side`): a stored label that is no valid
  lease name fences nothing, so such an object can be unlabelled or deleted.
* The name comes from ``request.name``, else the new object, else the stored one (each item
  of a collection delete).
* ``status`` (registered for every declared kind): a status write carries no token (the API
  server keeps the stored metadata), so it is decided by who writes (:class:`StatusCheck`): a
  Pod of the lease's namespace must hold the lease's current grant (else ``holder_mismatch``,
  or ``stale_fence`` when the stored token was granted to it: a superseded holder); the
  cluster's own status writers and people (not Pod-bound) and Pods of other namespaces
  (never candidates of the lease) are admitted.
* ``scale`` (registered for every declared kind in an entry without ``objectSelector``: a
  Scale carries no labels): decided like a status write, by who writes. A writer that is not
  a Pod of the object's namespace is admitted at once; for a Pod the webhook reads the parent
  object (:class:`ScaleCheck`, then :func:`scale_status_check`) to learn its lease label and
  stored token. An unlabelled parent is admitted; a parent that cannot be read is
  ``unavailable`` (fail closed).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from fencedlease.authority import fence as fencing
from fencedlease.authority.types import FenceCode, LeaseKey, TokenGrant
from fencedlease.models import (
    OBJECT_LEASE_LABEL,
    OBJECT_OPERATION_ANNOTATION,
    OBJECT_TOKEN_ANNOTATION,
)
from fencedlease.webhook.decisions import (
    FencedWrite,
    MarkWait,
    ObjectKind,
    StoredObject,
    WriteKind,
)
from fencedlease.webhook.reviews import (
    MAX_TOKEN,
    Identity,
    Verdict,
    as_dict,
    envelope,
    lease_name_ok,
    meta_of,
    parse_identity,
    review_uid,
    show,
    valid_names,
)

MAX_OPERATION_ID = 253
_DIGITS = re.compile(r"[1-9][0-9]{0,18}")

CLUSTER_DELETERS = frozenset(
    {
        "system:serviceaccount:kube-system:generic-garbage-collector",
        "system:serviceaccount:kube-system:namespace-controller",
        "system:kube-controller-manager",  # the same controllers without per-controller accounts
    }
)
"""Deleters that act for a deleted owner or namespace, never for a lease holder: their
deletes are not identity-fenced (a namespace would never finish terminating), only held until
the mark covers the object's token."""

SERVER_KEPT = ("resourceVersion", "managedFields", "generation", "finalizers", "ownerReferences")
"""Metadata a housekeeping write may change (finalizers and ownerReferences: removals only)."""


@dataclass(frozen=True, slots=True)
class StatusCheck:
    """A status write of a labelled object by a Pod of its lease's namespace: admitted only
    for the holder of the lease's current grant (no token travels with a status write)."""

    uid: str
    namespace: str
    name: str
    lease: str
    stored_token: int | None
    """The stored object's token (``None``: none valid): told the writer when it is its own."""
    identity: Identity
    kind: ObjectKind
    subresource: str = "status"
    """``status`` or ``scale`` (the messages name it)."""

    @property
    def domain(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.lease)


def status_verdict(
    check: StatusCheck,
    current: int | None,
    holder: TokenGrant | None,
    stored: TokenGrant | None,
) -> Verdict:
    """Decide ``check`` (pure): ``current`` is the lease's current generation (``None``: never
    granted or deleted), ``holder`` its grant record, ``stored`` the grant of the stored
    object's token (``None``: none, or not issued for this lease)."""
    ident = check.identity
    writer = f"Pod {ident.pod_name}" + (f" (uid {ident.pod_uid})" if ident.pod_uid else "")
    what = f"{check.subresource} of {check.kind.kind} {check.namespace}/{check.name}"
    if (
        current is not None
        and holder is not None
        and holder.key == check.domain
        and fencing.check_grant(holder, check.domain, ident.pod_name, ident.pod_uid) is None
    ):
        return Verdict.allow(
            FenceCode.APPLIED.value,
            f"applied: {what} written by {writer}, the holder of grant {current} of lease "
            f"{check.domain}",
        )
    if (
        stored is not None
        and check.stored_token is not None
        and stored.key == check.domain
        and fencing.check_grant(stored, check.domain, ident.pod_name, ident.pod_uid) is None
    ):
        return Verdict.from_fence(
            FenceCode.STALE_FENCE,
            f"stale_fence: {writer} may not write the {what}: its token {check.stored_token} "
            f"of lease {check.domain} was superseded by grant {_shown(current)}",
        )
    owner = f"Pod {holder.holder}" if holder is not None else "no Pod"
    return Verdict.from_fence(
        FenceCode.HOLDER_MISMATCH,
        f"holder_mismatch: {writer} may not write the {what}: the current grant "
        f"{_shown(current)} of lease {check.domain} belongs to {owner} (a "
        f"{check.subresource} write is fenced by who writes it: only the holder's Pod)",
    )


def _shown(token: int | None) -> str:
    return "none" if token is None else str(token)


def _status(facts: _Facts, stored: Any) -> StatusCheck | Verdict:
    """A write of the ``status`` subresource (module docstring)."""
    if facts.request.get("operation") != "UPDATE":
        return Verdict.allow("unchanged", "only an UPDATE writes status")
    if not isinstance(stored, dict):
        return Verdict.invalid("request.oldObject is missing")
    old = _stored_side(stored)
    if old.lease is None:
        return Verdict.allow("unchanged", "the object is not labelled: not fenced")
    identity = parse_identity(facts.request.get("userInfo"))
    admitted = _no_candidate(identity, facts.namespace, "status")
    if admitted is not None:
        return admitted
    token = old.token if isinstance(old.token, int) else None
    return StatusCheck(
        facts.uid, facts.namespace, facts.name, old.lease, token, identity, facts.kind
    )


def _no_candidate(identity: Identity, namespace: str, subresource: str) -> Verdict | None:
    """Admitted at once: a writer that cannot be a candidate of a lease of ``namespace`` (not
    a Pod: the cluster's controllers, the HPA, people; or a Pod of another namespace)."""
    if not identity.is_pod:
        return Verdict.allow(
            "unchanged",
            f"{subresource} written by {show(identity.username)}: not a Pod, so no candidate "
            "of a lease (the cluster's controllers, the HPA, people; RBAC decides)",
        )
    if identity.pod_namespace is not None and identity.pod_namespace != namespace:
        return Verdict.allow(
            "unchanged",
            f"{subresource} written by a Pod of namespace {identity.pod_namespace}: the "
            f"lease's candidates are Pods of {namespace}",
        )
    return None


_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True, slots=True)
class ParentRef:
    """The object whose ``scale`` subresource is written (what the webhook reads)."""

    group: str
    version: str
    resource: str
    namespace: str
    name: str

    @property
    def path(self) -> str:
        """Its API path (every part validated by :func:`_scale`)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{self.namespace}/{self.resource}/{self.name}"

    def __str__(self) -> str:
        kind = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ScaleCheck:
    """A scale write by a Pod of the object's namespace: decided like a status write
    (:func:`status_verdict`) once the parent object is read (:func:`scale_status_check`)."""

    uid: str
    parent: ParentRef
    identity: Identity


def scale_status_check(check: ScaleCheck, parent: Any) -> StatusCheck | Verdict:
    """What the parent object (read by the webhook: its metadata is enough) says about the
    scale write ``check`` (pure): unlabelled, admitted; labelled, a :class:`StatusCheck` on
    its lease with its stored token."""
    side = _stored_side(parent)
    ref = check.parent
    if side.lease is None:
        return Verdict.allow("unchanged", f"{ref} is not labelled: its scale is not fenced")
    token = side.token if isinstance(side.token, int) else None
    shown = f"{ref.resource}.{ref.group}" if ref.group else ref.resource
    kind = ObjectKind(f"{ref.group}/{ref.version}" if ref.group else ref.version, shown)
    return StatusCheck(
        check.uid, ref.namespace, ref.name, side.lease, token, check.identity, kind, "scale"
    )


def _scale(facts: _Facts) -> ScaleCheck | Verdict:
    """A write of the ``scale`` subresource (module docstring): no labels travel with it."""
    if facts.request.get("operation") != "UPDATE":
        return Verdict.allow("unchanged", "only an UPDATE writes scale")
    identity = parse_identity(facts.request.get("userInfo"))
    admitted = _no_candidate(identity, facts.namespace, "scale")
    if admitted is not None:
        return admitted
    resource = as_dict(facts.request.get("resource"))
    group, version, plural = (resource.get(k) for k in ("group", "version", "resource"))
    if not (
        isinstance(group, str)
        and (group == "" or _GROUP.fullmatch(group))
        and isinstance(version, str)
        and _RESOURCE.fullmatch(version)
        and isinstance(plural, str)
        and _RESOURCE.fullmatch(plural)
    ):
        return Verdict.invalid(
            "request.resource must name the scaled object's group, version and resource"
        )
    ref = ParentRef(group, version, plural, facts.namespace, facts.name)
    return ScaleCheck(facts.uid, ref, identity)


@dataclass(frozen=True, slots=True)
class CoverCheck(MarkWait):
    """A write that publishes nothing but must wait until the lease's mark covers ``token``
    (a cluster deleter's DELETE; housekeeping that may complete a deletion)."""

    what: str


def cover_verdict(check: CoverCheck, grant_ok: bool, mark: int | None) -> Verdict:
    """May ``check`` pass? Yes once the mark covers its token (or the token was never issued
    for the lease: it cannot matter); else ``unavailable`` (the caller retries)."""
    if check.covered(grant_ok, mark):
        return Verdict.allow("unchanged", f"{check.what}: the high-water mark covers the token")
    shown = "none" if mark is None else str(mark)
    return Verdict.unavailable(
        f"{check.what}: token {check.token} is not yet in the high-water mark of lease "
        f"{check.domain} (now {shown}); the fencedlease controller records committed writes, "
        "retry shortly"
    )


def parse_token(annotations: dict[str, Any]) -> int | str | None:
    """The ``fencedlease.io/token`` annotation: the token, ``None`` (absent) or an error."""
    raw = annotations.get(OBJECT_TOKEN_ANNOTATION)
    if raw is None:
        return None
    if not isinstance(raw, str) or not _DIGITS.fullmatch(raw) or int(raw) > MAX_TOKEN:
        return (
            f"annotation {OBJECT_TOKEN_ANNOTATION} must be a decimal integer between 1 and "
            f"{MAX_TOKEN}, got {show(str(raw))}"
        )
    return int(raw)


@dataclass(frozen=True, slots=True)
class _Side:
    """What one object (new or stored) says about its fencing."""

    lease: str | None
    token: int | str | None
    operation_id: str | None
    annotations: dict[str, Any]


def _side(obj: Any) -> _Side | str:
    if not isinstance(obj, dict):
        return _Side(None, None, None, {})
    meta = meta_of(obj)
    labels = as_dict(meta.get("labels"))
    annotations = as_dict(meta.get("annotations"))
    lease = labels.get(OBJECT_LEASE_LABEL)
    if lease is not None and (not isinstance(lease, str) or not lease_name_ok(lease)):
        return f"label {OBJECT_LEASE_LABEL} {show(str(lease))} is not a valid FencedLease name"
    op = annotations.get(OBJECT_OPERATION_ANNOTATION)
    if op is not None and (not isinstance(op, str) or not op or len(op) > MAX_OPERATION_ID):
        return (
            f"annotation {OBJECT_OPERATION_ANNOTATION} must be a string of 1 to "
            f"{MAX_OPERATION_ID} characters"
        )
    return _Side(lease, parse_token(annotations), op, annotations)


def _stored_side(obj: Any) -> _Side:
    """What the *stored* object says, read as leniently as it can be trusted: a label that
    is no valid FencedLease name names no lease (no lease of that name can exist, so nothing
    is fenced by it: removing it or deleting the object is not stuck), and a malformed
    operation id shows no operation. Its token is kept as the error it is (no valid token)."""
    if not isinstance(obj, dict):
        return _Side(None, None, None, {})
    labels = as_dict(meta_of(obj).get("labels"))
    annotations = as_dict(meta_of(obj).get("annotations"))
    lease = labels.get(OBJECT_LEASE_LABEL)
    if not isinstance(lease, str) or not lease_name_ok(lease):
        lease = None
    op = annotations.get(OBJECT_OPERATION_ANNOTATION)
    if not isinstance(op, str) or not op or len(op) > MAX_OPERATION_ID:
        op = None
    return _Side(lease, parse_token(annotations), op, annotations)


def _name_of(obj: Any) -> str | None:
    """``metadata.name`` of ``obj`` (a DELETE, also each item of a collection delete, has no
    ``request.object``; its name is in ``request.name`` or the stored object)."""
    name = meta_of(obj).get("name") if isinstance(obj, dict) else None
    return name if isinstance(name, str) else None


def housekeeping(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """``new`` differs from ``old`` only in server-kept metadata, finalizers and
    ownerReferences only by removals (pure). ``status`` is content here: on the main
    resource of a kind without a status subresource it is data the writer publishes, and a
    kind with one drops the change anyway (its status writes arrive as ``status``)."""
    new_meta, old_meta = meta_of(new), meta_of(old)
    for key in ("finalizers", "ownerReferences"):
        kept, had = new_meta.get(key) or [], old_meta.get(key) or []
        if not isinstance(kept, list) or not isinstance(had, list):
            return False
        if any(item not in had for item in kept):
            return False
    return _content(new) == _content(old)


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items() if k != "metadata"}
    meta = {k: v for k, v in meta_of(obj).items() if k not in SERVER_KEPT}
    for key in ("labels", "annotations"):
        meta[key] = meta.get(key) or {}
    out["metadata"] = meta
    return copy.deepcopy(out)


def _object_kind(request: dict[str, Any]) -> ObjectKind:
    kind = as_dict(request.get("kind"))
    group, version = kind.get("group") or "", kind.get("version") or ""
    api_version = f"{group}/{version}" if group else str(version)
    return ObjectKind(api_version, str(kind.get("kind") or "object"))


def parse_object_review(
    body: Any,
) -> FencedWrite | CoverCheck | StatusCheck | ScaleCheck | Verdict:
    """Turn an AdmissionReview of a labelled object into what to check (module docstring)."""
    request = envelope(body)
    if isinstance(request, Verdict):
        return request
    operation = request.get("operation")
    sub = request.get("subResource") or ""
    if sub and sub not in ("status", "scale"):
        return Verdict.allow("unchanged", f"subresource {show(str(sub))} is not fenced")
    if operation not in ("CREATE", "UPDATE", "DELETE"):
        return Verdict.allow("unchanged", f"{show(str(operation))} is not a fenced write")
    obj, stored = request.get("object"), request.get("oldObject")
    if operation != "DELETE" and not isinstance(obj, dict):
        return Verdict.invalid("request.object is missing")
    if operation != "CREATE" and not isinstance(stored, dict):
        return Verdict.invalid("request.oldObject is missing")
    kind = _object_kind(request)
    namespace = request.get("namespace") or ""
    name = request.get("name") or _name_of(obj) or _name_of(stored) or ""
    if not isinstance(namespace, str) or not isinstance(name, str):
        return Verdict.invalid("request.namespace and request.name must be strings")
    bad = valid_names(namespace, name, str(operation), what=kind.kind)
    if bad is not None:
        return Verdict.invalid(bad)
    facts = _Facts(
        uid=review_uid(body),
        namespace=namespace,
        name=name,
        kind=kind,
        dry_run=bool(request.get("dryRun")),
        request=request,
    )
    if sub == "scale":
        return _scale(facts)  # a Scale has no labels: the parent object is read
    if sub:
        return _status(facts, stored)  # its new metadata is dropped: only who writes counts
    new_side, old_side = _side(obj), _stored_side(stored)
    if isinstance(new_side, str):
        return Verdict.invalid(new_side)
    if operation == "DELETE":
        return _delete(facts, old_side, stored)
    if operation == "UPDATE" and isinstance(stored, dict) and old_side.lease is not None:
        assert isinstance(obj, dict)
        if housekeeping(obj, stored):
            return _housekeeping(facts, old_side, stored)
    return _write(facts, str(operation), new_side, old_side, obj, stored)


@dataclass(frozen=True, slots=True)
class _Facts:
    uid: str
    namespace: str
    name: str
    kind: ObjectKind
    dry_run: bool
    request: dict[str, Any]


def _stored(side: _Side, stored: Any) -> StoredObject:
    meta = meta_of(stored if isinstance(stored, dict) else {})
    token = side.token if isinstance(side.token, int) and side.lease is not None else None
    return StoredObject(
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        lease=side.lease,
        token=token,
        operation_id=side.operation_id if side.lease is not None else None,
        accepted_fence=None,
        spec=None,
        deleting=meta.get("deletionTimestamp") is not None,
    )


def _delete(facts: _Facts, old: _Side, stored: Any) -> FencedWrite | CoverCheck | Verdict:
    if old.lease is None:
        return Verdict.allow("unchanged", "the object is not labelled: not fenced")
    identity = parse_identity(facts.request.get("userInfo"))
    if identity.username in CLUSTER_DELETERS:
        if not isinstance(old.token, int):
            return Verdict.allow(
                "unchanged",
                f"delete by {identity.username} of an object without a valid token: no "
                "token of it can be in the mark",
            )
        return _cover(facts, old.lease, old.token, f"delete by {identity.username}")
    if not isinstance(old.token, int):
        return Verdict.invalid(
            f"{facts.kind.kind} {facts.namespace}/{facts.name} is labelled "
            f"{OBJECT_LEASE_LABEL}={old.lease} but carries no valid {OBJECT_TOKEN_ANNOTATION}: "
            "write your token to it first (a fenced write), then delete it"
        )
    return FencedWrite(
        uid=facts.uid,
        kind=WriteKind.DELETE,
        namespace=facts.namespace,
        name=facts.name,
        lease=old.lease,
        token=old.token,
        operation_id=None,
        dry_run=facts.dry_run,
        identity=identity,
        old=_stored(old, stored),
        resource_version="",
        object_kind=facts.kind,
        unconditional=True,
        releases=True,
    )


def _housekeeping(facts: _Facts, old: _Side, stored: dict[str, Any]) -> CoverCheck | Verdict:
    deleting = meta_of(stored).get("deletionTimestamp") is not None
    if not deleting or old.lease is None or not isinstance(old.token, int):
        return Verdict.allow(
            "unchanged", "server-kept metadata and removals only: nothing is published"
        )
    return _cover(facts, old.lease, old.token, "finalizer removal from an object being deleted")


def _cover(facts: _Facts, lease: str, token: int, reason: str) -> CoverCheck:
    """Allowed once ``lease``'s mark covers the stored ``token``."""
    return CoverCheck(facts.uid, facts.namespace, facts.name, lease, token, facts.dry_run, reason)


def _write(
    facts: _Facts, operation: str, new: _Side, old: _Side, obj: Any, stored: Any
) -> FencedWrite | Verdict:
    if new.lease is None and old.lease is None:
        return Verdict.allow("unchanged", "the object is not labelled: not fenced")
    if new.lease is not None and old.lease is not None and new.lease != old.lease:
        return Verdict.from_fence(
            FenceCode.LEASE_MISMATCH,
            f"lease_mismatch: label {OBJECT_LEASE_LABEL} cannot change from {old.lease!r} to "
            f"{new.lease!r} in one write: remove it with a token of {old.lease!r}, then add it "
            f"with a token of {new.lease!r}",
        )
    lease = new.lease or old.lease
    assert lease is not None
    if isinstance(new.token, str):
        return Verdict.invalid(new.token)
    if new.token is None:
        return Verdict.invalid(
            f"a write of {facts.kind.kind} {facts.namespace}/{facts.name or '(generated)'} "
            f"labelled {OBJECT_LEASE_LABEL}={lease} must carry the writer's fencing token in "
            f"annotation {OBJECT_TOKEN_ANNOTATION} (removing the label is a fenced write too)"
        )
    meta = meta_of(obj)
    return FencedWrite(
        uid=facts.uid,
        kind=WriteKind.CREATE if operation == "CREATE" else WriteKind.UPDATE,
        namespace=facts.namespace,
        name=facts.name,
        lease=lease,
        token=new.token,
        operation_id=new.operation_id,
        dry_run=facts.dry_run,
        identity=parse_identity(facts.request.get("userInfo")),
        old=_stored(old, stored) if operation == "UPDATE" else None,
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=meta_of(stored if isinstance(stored, dict) else {}).get("deletionTimestamp")
        is not None,
        object_kind=facts.kind,
        unconditional=True,
        releases=new.lease is None,
    )
