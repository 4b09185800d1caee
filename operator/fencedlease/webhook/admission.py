"""Pure admission logic of the fence webhook: AdmissionReview v1 in, verdict out, no I/O.

The server (:mod:`fencedlease.webhook.checker`) runs it in three steps:

1. :func:`parse_review` turns the AdmissionReview into an :class:`ArtifactWrite` (or an
   immediate :class:`Verdict` for requests that are malformed or not fenced writes);
2. it looks up the lease's fencing policy and asks the store (:class:`FenceQuery` says what
   to ask and whether the store may advance the high-water mark);
3. :func:`decide` combines the store's answer with the checks against the *stored* object
   (``request.oldObject``), and :func:`review_response` builds the AdmissionReview reply.

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
  the high-water mark (see :func:`status_claim`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from fencedlease.authority import fence as fencing
from fencedlease.authority.types import FenceCode, FenceResult, FencingPolicy, LeaseKey
from fencedlease.models import ARTIFACT_FINALIZER, ARTIFACTS, GROUP, VERSION

ADMISSION_API_VERSION = "admission.k8s.io/v1"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
GROUP_PREFIX = "group:"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
MAX_TOKEN = 2**63 - 1
MAX_OBJECT_REF = 1024
MAX_OPERATION_ID = 253
MAX_LEASE_NAME = 63
MAX_DEPTH = 64
"""Nesting depth accepted in a review body (a FencedArtifact is a handful of levels deep)."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

DENIAL_HTTP = {
    FenceCode.STALE_FENCE: 403,
    FenceCode.DUPLICATE: 403,
    FenceCode.UNKNOWN_TOKEN: 403,
    FenceCode.LEASE_MISMATCH: 403,
    FenceCode.HOLDER_MISMATCH: 403,
}
"""HTTP status code of each denial in ``response.status.code``.

Not 409: the API server's PATCH handler retries a 409 (up to 5 times, re-running admission:
one stale write would be counted and evented six times), and clients retry a 409 Conflict
(client-go ``RetryOnConflict``, kubectl).  A fence denial is definitive (docs/design.md,
invariant 4), so it is 403 Forbidden; the message's code says which.  409 stays what it means
in Kubernetes: the resourceVersion precondition failed, re-read and decide again."""


class WriteKind(StrEnum):
    """Kind of fenced write; also the ``operation`` label of the fence metric."""

    CREATE = "create"
    UPDATE = "update"
    STATUS = "status"


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one AdmissionReview.

    ``code`` is a :class:`FenceCode` value, or ``unchanged`` (admitted without a fence check),
    ``invalid`` (malformed request) or ``unavailable`` (the store could not decide).
    """

    allowed: bool
    code: str
    message: str
    http_status: int = 200

    @classmethod
    def allow(cls, code: str, message: str) -> Verdict:
        return cls(True, code, message, 200)

    @classmethod
    def deny(cls, code: str, message: str, http_status: int) -> Verdict:
        return cls(False, code, message, http_status)

    @classmethod
    def from_fence(cls, code: FenceCode, message: str) -> Verdict:
        if code is FenceCode.APPLIED:
            return cls.allow(code.value, message)
        return cls.deny(code.value, message, DENIAL_HTTP[code])

    @classmethod
    def unavailable(cls, reason: str) -> Verdict:
        return cls.deny("unavailable", f"unavailable: {reason}; the write was not admitted", 503)

    @classmethod
    def invalid(cls, reason: str) -> Verdict:
        return cls.deny("invalid", f"invalid: {reason}", 422)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who writes: a Pod-bound service-account token has ``pod_name``, ``pod_uid`` and the
    Pod's namespace; every identity has a username and groups."""

    username: str
    pod_name: str | None = None
    pod_namespace: str | None = None
    pod_uid: str | None = None
    groups: tuple[str, ...] = ()

    @property
    def is_pod(self) -> bool:
        return self.pod_name is not None


@dataclass(frozen=True, slots=True)
class AllowedWriters:
    """Non-Pod identities allowed to write with a valid token (default: none).

    Entries are usernames (``system:serviceaccount:ns:name``, ``alice``) or ``group:NAME``.
    A Pod-bound service-account token is always checked against the grant's Pod instead.
    """

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowedWriters:
        users, groups = set(), set()
        for entry in entries:
            entry = entry.strip()
            if entry.startswith(GROUP_PREFIX):
                groups.add(entry[len(GROUP_PREFIX) :])
            elif entry:
                users.add(entry)
        return cls(frozenset(users), frozenset(groups))

    def admit(self, identity: Identity) -> bool:
        return identity.username in self.users or not self.groups.isdisjoint(identity.groups)


@dataclass(frozen=True, slots=True)
class StoredArtifact:
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
class ArtifactWrite:
    """One CREATE/UPDATE of a FencedArtifact (or its status), as the webhook sees it."""

    uid: str
    kind: WriteKind
    namespace: str
    name: str
    lease: str
    token: int
    operation_id: str | None
    dry_run: bool
    identity: Identity
    old: StoredArtifact | None
    resource_version: str
    accepted_fence: int | None = None
    finalizers: tuple[str, ...] | None = field(default=None)
    """``metadata.finalizers`` of the new object (``None``: the request had no list)."""
    deleting: bool = False
    """The artifact is being deleted: the *stored* object has a ``deletionTimestamp`` (the
    API server refuses new finalizers then). Never taken from the request's own object: a
    CREATE's ``deletionTimestamp`` is cleared and an UPDATE's is ignored after admission."""

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
        if not self.resource_version:
            # Only a PUT without resourceVersion gets here (a patch is applied to the stored
            # object, version included), and custom resources refuse unconditional PUTs.
            return True
        return self.old is not None and self.resource_version != self.old.resource_version


@dataclass(frozen=True, slots=True)
class FenceQuery:
    """What to ask the store for ``write`` and whether the answer may change the store.

    ``holder``/``holder_uid`` is the Pod the grant must belong to (``None``: not checked).
    The store is only ever *read* at admission (see the module docstring).
    """

    token: int
    holder: str | None
    operation_id: str | None = None
    holder_uid: str | None = None


@dataclass(frozen=True, slots=True)
class FinalizerRelease:
    """An UPDATE that takes :data:`ARTIFACT_FINALIZER` off an artifact (nothing else changes).

    Admitted only once the domain's high-water mark covers ``token`` (or ``token`` was never
    issued for the lease, so it cannot matter): otherwise deleting and re-creating the
    artifact could slip below a committed write the controller has not recorded yet.
    """

    uid: str
    namespace: str
    name: str
    lease: str
    token: int
    dry_run: bool

    @property
    def domain(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.lease)


@dataclass(frozen=True, slots=True)
class StoreAnswer:
    """The store's verdict plus the high-water mark it was compared with (read-only path)."""

    result: FenceResult
    hwm_before: int | None = None


# ----------------------------------------------------------------------------- parsing


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _first(value: Any) -> str | None:
    """The single value of a ``userInfo.extra`` entry (a list of strings)."""
    if isinstance(value, list) and value and isinstance(value[0], str) and value[0]:
        return value[0]
    if isinstance(value, str) and value:
        return value
    return None


def _identity(user_info: Any) -> Identity:
    info = _dict(user_info)
    username = info.get("username")
    username = username if isinstance(username, str) else ""
    extra = _dict(info.get("extra"))
    # Only a service-account token is bound to a Pod: the pod-name extra of any other user
    # (an authenticating proxy, impersonated user extras) does not make it that Pod.
    service_account = username.startswith(SERVICE_ACCOUNT_PREFIX)
    pod_name = _first(extra.get(POD_NAME_EXTRA)) if service_account else None
    pod_namespace: str | None = None
    if pod_name is not None:
        parts = username[len(SERVICE_ACCOUNT_PREFIX) :].split(":")
        if len(parts) == 2:
            pod_namespace = parts[0]
    groups = info.get("groups")
    return Identity(
        username=username,
        pod_name=pod_name,
        pod_namespace=pod_namespace,
        pod_uid=_first(extra.get(POD_UID_EXTRA)) if pod_name is not None else None,
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
    )


def identity_of(user_info: Any) -> Identity:
    """Who a review's ``userInfo`` is (a Pod only for a Pod-bound service-account token)."""
    return _identity(user_info)


def _finalizers(meta: dict[str, Any]) -> tuple[str, ...] | None:
    found = meta.get("finalizers")
    if not isinstance(found, list):
        return None
    return tuple(f for f in found if isinstance(f, str))


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _metadata(obj: dict[str, Any]) -> tuple[Any, ...]:
    """The user-settable metadata a spec-preserving update may change."""
    meta = _meta(obj)
    return tuple(
        meta.get(key) or None
        for key in ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")
    )


def _stored(obj: Any) -> StoredArtifact | None:
    if not isinstance(obj, dict):
        return None
    meta = _meta(obj)
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    lease_ref = _dict(spec.get("leaseRef"))
    lease = lease_ref.get("name")
    token = _int(spec.get("fencingToken"))
    op = spec.get("operationId")
    return StoredArtifact(
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        # Only what a write could have stored (the schema and this webhook's own checks): a
        # forged oldObject's lease or token never reaches the store as a key.
        lease=lease if isinstance(lease, str) and _lease_name(lease) else None,
        token=token if token is not None and 1 <= token <= MAX_TOKEN else None,
        operation_id=op if isinstance(op, str) and op else None,
        accepted_fence=_int(status.get("acceptedFence")),
        spec=obj.get("spec"),
        metadata=_metadata(obj),
        finalizers=_finalizers(meta) or (),
        deleting=meta.get("deletionTimestamp") is not None,
    )


def _lease_name(lease: str) -> bool:
    return len(lease) <= MAX_LEASE_NAME and _DNS_LABEL.fullmatch(lease) is not None


def _spec_fields(spec: Any) -> tuple[str, int, str | None] | str:
    """``(lease, token, operation_id)`` or a user-facing error (mirrors the CRD schema, which
    the API server only applies *after* mutating admission)."""
    if not isinstance(spec, dict):
        return "spec is required"
    lease_ref = spec.get("leaseRef")
    lease = lease_ref.get("name") if isinstance(lease_ref, dict) else None
    if not isinstance(lease, str) or not lease:
        return "spec.leaseRef.name is required"
    if not _lease_name(lease):
        return f"spec.leaseRef.name {_show(lease)} is not a valid FencedLease name (DNS label)"
    token = _int(spec.get("fencingToken"))
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


def _show(value: str, limit: int = 80) -> str:
    """A user value safe to echo in a message: ASCII only, bounded."""
    return ascii(value[:limit])


def too_deep(body: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``body`` nests lists/objects deeper than ``limit`` (iterative: no recursion).

    Level by level: ``level`` holds the values at one depth, and the next level is gathered
    with ``list.extend`` (C speed) instead of a tuple pushed per value; a review of about 5 KB
    (object, oldObject, managedFields) takes 15 µs instead of 48 µs."""
    level = [body]
    for _ in range(limit):
        below: list[Any] = []
        for value in level:
            if isinstance(value, dict):
                below.extend(value.values())
            elif isinstance(value, list):
                below.extend(value)
        if not below:
            return False
        level = below
    return any(isinstance(value, (dict, list)) for value in level)  # a container at limit + 1


def review_uid(body: Any) -> str:
    """The request uid (echoed in every response), or ``""`` if the body has none."""
    if isinstance(body, dict) and isinstance(body.get("request"), dict):
        uid = body["request"].get("uid")
        if isinstance(uid, str) and len(uid) <= 128 and uid.isascii():
            return uid
    return ""


def _valid_names(namespace: str, name: str, operation: str) -> str | None:
    """Names are DNS labels/subdomains; a CREATE may have none yet (``generateName``)."""
    if not _DNS_LABEL.fullmatch(namespace):
        return f"namespace {_show(namespace)} is not a valid namespace name"
    if not name and operation == "CREATE":
        return None
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        return f"name {_show(name)} is not a valid FencedArtifact name"
    return None


def parse_review(body: Any) -> ArtifactWrite | FinalizerRelease | Verdict:
    """Turn an AdmissionReview v1 into the write to fence, or an immediate verdict."""
    if not isinstance(body, dict) or body.get("kind") != "AdmissionReview":
        return Verdict.invalid("expected an AdmissionReview")
    if body.get("apiVersion") != ADMISSION_API_VERSION:
        return Verdict.invalid(
            f"AdmissionReview {_show(str(body.get('apiVersion')))} is not served: this "
            f"webhook is registered for {ADMISSION_API_VERSION} only"
        )
    request = body.get("request")
    if not isinstance(request, dict) or not review_uid(body):
        return Verdict.invalid("AdmissionReview without a valid request.uid")
    resource = _dict(request.get("resource"))
    if (resource.get("group"), resource.get("resource")) != (GROUP, ARTIFACTS):
        return Verdict.invalid(
            f"this webhook fences {ARTIFACTS}.{GROUP} only, got "
            f"{_show(str(resource.get('resource')))}.{_show(str(resource.get('group')))}"
        )
    if resource.get("version") not in (VERSION, None):
        return Verdict.invalid(f"unsupported version {_show(str(resource.get('version')))}")
    operation = request.get("operation")
    sub = request.get("subResource") or ""
    if sub not in ("", "status"):
        return Verdict.invalid(f"subresource {_show(str(sub))} is not fenced by this webhook")
    if operation not in ("CREATE", "UPDATE"):
        # DELETE and CONNECT are not registered; admit defensively-registered ones unchanged.
        return Verdict.allow("unchanged", f"{operation} is not a fenced write")
    obj = request.get("object")
    if not isinstance(obj, dict):
        return Verdict.invalid("request.object is missing")
    old = _stored(request.get("oldObject")) if operation == "UPDATE" else None
    namespace = request.get("namespace") or _meta(obj).get("namespace") or ""
    name = request.get("name") or _meta(obj).get("name") or ""
    if not isinstance(namespace, str) or not isinstance(name, str):
        return Verdict.invalid("request.namespace and request.name must be strings")
    bad_name = _valid_names(namespace, name, operation)
    if bad_name is not None:
        return Verdict.invalid(bad_name)
    kind = WriteKind.CREATE if operation == "CREATE" else WriteKind.UPDATE
    if sub == "status":
        kind = WriteKind.STATUS
    identity = _identity(request.get("userInfo"))
    dry_run = bool(request.get("dryRun"))
    rv = str(_meta(obj).get("resourceVersion") or "")
    uid = review_uid(body)
    finalizers = _finalizers(_meta(obj))
    deleting = old is not None and old.deleting

    if kind is WriteKind.STATUS:
        # The API server keeps the stored spec on a status write (whatever the body says).
        if old is None or old.lease is None or old.token is None:
            return Verdict.allow("unchanged", "status of an artifact without a valid spec")
        status = _dict(obj.get("status"))
        accepted = _int(status.get("acceptedFence"))
        if "acceptedFence" in status and accepted is None and status["acceptedFence"] is not None:
            return Verdict.invalid("status.acceptedFence must be an integer")
        if accepted is None or accepted == old.accepted_fence:
            return Verdict.allow("unchanged", "status.acceptedFence is not changed")
        if rv and rv != old.resource_version:
            # Mutating admission runs before the storage precondition: this write is
            # refused with 409 Conflict anyway, which is the truthful answer.
            return Verdict.allow("unchanged", "stale resourceVersion: the write cannot commit")
        return ArtifactWrite(
            uid=uid,
            kind=kind,
            namespace=namespace,
            name=name,
            lease=old.lease,
            token=old.token,
            operation_id=None,
            dry_run=dry_run,
            identity=identity,
            old=old,
            resource_version=rv,
            accepted_fence=accepted,
        )

    if kind is WriteKind.UPDATE and old is not None and obj.get("spec") == old.spec:
        # Labels, annotations, finalizers...: nothing is published.  A write that changes
        # nothing at all and names an operation is a retry of it: checked (→ duplicate).
        retry = old.operation_id is not None and _metadata(obj) == old.metadata
        if (
            ARTIFACT_FINALIZER in old.finalizers
            and ARTIFACT_FINALIZER not in (finalizers or ())
            and old.lease is not None
            and old.token is not None
        ):
            return FinalizerRelease(uid, namespace, name, old.lease, old.token, dry_run)
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
    return ArtifactWrite(
        uid=uid,
        kind=kind,
        namespace=namespace,
        name=name,
        lease=lease,
        token=token,
        operation_id=operation_id,
        dry_run=dry_run,
        identity=identity,
        old=old,
        resource_version=rv,
        finalizers=finalizers,
        deleting=deleting,
    )


# ----------------------------------------------------------------------------- deciding


def holder_refusal(write: ArtifactWrite, writers: AllowedWriters) -> str | None:
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
                f"writer Pod {ident.pod_namespace}/{ident.pod_name} is not in the artifact's "
                f"namespace {write.namespace}"
            )
        return None
    if not writers.admit(ident):
        return (
            f"{_show(ident.username) if ident.username else 'this identity'} is not a "
            "Pod-bound service-account token and is not among the allowed writers "
            "(FENCEDLEASE_ALLOWED_WRITERS; chart value allowedWriters)"
        )
    return None


def order_against_stored(
    write: ArtifactWrite, policy: FencingPolicy
) -> tuple[FenceCode, str] | None:
    """The stored object is part of the high-water mark: compare with it (pure, no store).

    Returns the refusal (code and detail) or ``None``.  This is what makes check-and-write
    atomic: the API server calls admission again with the new stored object when its write
    lost a race, and refuses a resourceVersion-stale write itself.
    """
    old = write.old
    if write.kind is WriteKind.STATUS:
        return status_claim(write)
    if old is None or old.token is None:
        return None
    if old.lease is not None and old.lease != write.lease:
        return (
            FenceCode.LEASE_MISMATCH,
            f"spec.leaseRef.name is immutable (stored {old.lease!r}, got {write.lease!r})",
        )
    detail = f"the stored artifact carries token {old.token}"
    if write.token < old.token:
        return FenceCode.STALE_FENCE, detail
    if write.token == old.token:
        if write.operation_id is not None and write.operation_id == old.operation_id:
            # Under either policy: the stored object shows this very operation applied.
            return FenceCode.DUPLICATE, f"the stored artifact already shows {write.operation_id}"
        if policy is FencingPolicy.STRICTLY_GREATER:
            return FenceCode.STALE_FENCE, detail + " (StrictlyGreater: one write per grant)"
    return None


def status_claim(write: ArtifactWrite) -> tuple[FenceCode, str] | None:
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


def fence_query(write: ArtifactWrite, local: tuple[FenceCode, str] | None) -> FenceQuery:
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
        return FenceQuery(token=write.token, holder=None, operation_id=None)
    return FenceQuery(
        token=write.token,
        holder=write.identity.pod_name,
        operation_id=None,
        holder_uid=write.identity.pod_uid,
    )


_GRANT_CODES = (FenceCode.UNKNOWN_TOKEN, FenceCode.LEASE_MISMATCH, FenceCode.HOLDER_MISMATCH)


def decide(
    write: ArtifactWrite,
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
    return Verdict.from_fence(result.code, result.message)


def _mark(value: int | None) -> str:
    return "none" if value is None else str(value)


# ----------------------------------------------------------------------------- response


def finalizer_patch(write: ArtifactWrite) -> list[dict[str, Any]] | None:
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
    if not grant_ok or (mark is not None and mark >= release.token):
        return Verdict.allow("unchanged", "the high-water mark covers the artifact's token")
    return Verdict.invalid(
        f"finalizer {ARTIFACT_FINALIZER} stays until the high-water mark of lease "
        f"{release.domain} covers token {release.token} (now {_mark(mark)}); the fencedlease "
        "controller records committed writes and removes it"
    )


def review_response(
    uid: str, verdict: Verdict, patch: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The AdmissionReview v1 reply.  The only patch ever sent adds our finalizer."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if verdict.allowed:
        if verdict.code == FenceCode.APPLIED.value:
            response["auditAnnotations"] = {"fence": verdict.message[:512]}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    else:
        response["status"] = {
            "code": verdict.http_status,
            "message": verdict.message,
            "reason": _reason(verdict.http_status),
        }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _reason(http_status: int) -> str:
    return {
        409: "Conflict",
        403: "Forbidden",
        422: "Invalid",
        503: "ServiceUnavailable",
    }.get(http_status, "BadRequest")
