"""Fenced publish of a ``FencedArtifact``, with explicit results (docs/fenced-publish.md).

One publish is a read-modify-write: read the artifact, then create it (absent) or replace its
spec with the ``resourceVersion`` that was read, always with an ``operationId``.  The answer is
parsed from the status code and the code at the start of the webhook's message, never from
free text alone:

========================  ================================================================
``Applied``               admitted and committed
``Duplicate``             the stored artifact already shows this ``operationId``
``StaleFence``            a newer generation reached the resource: **never retried**
``Rejected(code)``        ``unknown_token``, ``lease_mismatch``, ``holder_mismatch``,
                          ``invalid``, ``conflict`` (with ``expected_version``),
                          ``forbidden`` (RBAC), ...: not retried
``Unavailable``           the fence could not be checked (webhook/etcd down, API
                          unreachable, 5xx, 429) after ``RetryPolicy.attempts`` tries
========================  ================================================================

A 409 Conflict (someone wrote between our read and our write) is re-read and retried, within the
same attempt budget: the retry goes through the fence again, which answers ``stale_fence`` if
the other write carried a newer token.  The request plan is written once, without I/O
(:func:`plan`), and driven by :class:`Publisher` (sync) and :class:`AsyncPublisher` (asyncio).
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Optional, TypedDict, TypeVar

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

from fencedlease.client import results
from fencedlease.client.api import AsyncKubeClient, KubeClient, artifact_path
from fencedlease.client.contract import FENCE_CODES, GROUP, VERSION
from fencedlease.client.errors import RequestInfo
from fencedlease.client.grant import Grant
from fencedlease.client.plans import Reply, Request, Sleep, Step, drive, drive_async
from fencedlease.client.results import Applied, Duplicate, PublishResult, Rejected, StaleFence
from fencedlease.client.validation import InvalidInput, dns_label, dns_subdomain
from fencedlease.client.validation import token as check_token

_CODE = re.compile(r"(?:^|denied the request: |: )(" + "|".join(sorted(FENCE_CODES)) + r")\b")
TRANSIENT_STATUS = frozenset({0, 429, 500, 502, 503, 504})
"""Answers worth another try: a transport error (0), 429 and the 5xx of an unavailable
webhook or API server."""
C = TypeVar("C", KubeClient, AsyncKubeClient)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with full jitter, for transient failures only."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 3.0
    jitter: bool = True

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return random.uniform(0, ceiling) if self.jitter else ceiling


def fence_code(message: str) -> str | None:
    """The fence result code of a refusal message: the code the webhook's message starts with
    (after the API server's ``admission webhook "…" denied the request:`` prefix), or the code
    of the CRD's transition rule (``stale_fence: spec.fencingToken may not decrease``)."""
    match = _CODE.search(message)
    return match.group(1) if match else None


# ----------------------------------------------------------------------------- the plan


Plan = Generator[Step, Optional[Reply], PublishResult]


@dataclass(frozen=True)
class PublishRequest:
    """What to publish: artifact ``name`` in ``namespace`` points at ``object_ref`` under
    ``token`` of lease ``lease``."""

    namespace: str
    name: str
    lease: str
    token: int
    object_ref: str
    operation_id: str
    expected_version: str | None = None
    labels: dict[str, str] | None = None

    def spec(self) -> dict[str, Any]:
        return {
            "leaseRef": {"name": self.lease},
            "fencingToken": self.token,
            "objectRef": self.object_ref,
            "operationId": self.operation_id,
        }

    def new_object(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FencedArtifact",
            "metadata": meta,
            "spec": self.spec(),
        }


class _Retry(Exception):
    def __init__(self, message: str, status_code: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


def classify(req: PublishRequest, reply: Reply) -> PublishResult | _Retry:
    """Turn the answer to a create/replace into a result, or a reason to retry."""
    if reply.ok:
        obj = reply.body if isinstance(reply.body, dict) else {}
        mismatch = _not_the_write(req, obj)
        if mismatch is not None:
            return Rejected(
                "unexpected_reply",
                f"unexpected_reply: {reply.request} answered {reply.status_code} with "
                f"{mismatch}: not the write that was asked for, so not counted as applied",
                reply.status_code,
            )
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        message = (
            f"applied: {req.namespace}/{req.name} shows {req.object_ref} at token {req.token} "
            f"(operation {req.operation_id}, resourceVersion {version})"
        )
        return Applied(req.token, req.object_ref, req.operation_id, version, message, obj)
    info = reply.info()
    message = info.message or f"HTTP {reply.status_code}"
    missing = reply.not_installed()
    if missing is not None:
        return Rejected("not_installed", missing, reply.status_code)
    code = fence_code(message) if reply.status_code in (403, 422, 503) else None
    if code == "stale_fence":
        return StaleFence(req.token, message)
    if code == "duplicate":
        return Duplicate(req.token, req.operation_id, message)
    if code == "unavailable" or reply.status_code in TRANSIENT_STATUS:
        return _Retry(message, reply.status_code)
    if code is not None:
        return Rejected(code, message, reply.status_code)
    if reply.status_code == 409:
        if req.expected_version is not None:
            return Rejected("conflict", message, 409)
        return _Retry(message, 409)  # lost a race (or the name was taken): re-read, re-decide
    if reply.status_code == 404 and req.expected_version is None:
        return _Retry(message, 404)  # deleted between our read and our write
    reason = {
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        409: "conflict",
        422: "invalid",
        400: "invalid",
    }.get(reply.status_code, (info.reason or f"http_{reply.status_code}").lower())
    return Rejected(reason, message, reply.status_code)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _not_the_write(req: PublishRequest, obj: dict[str, Any]) -> str | None:
    """Why the object in a 2xx reply is not the artifact this publish wrote (``None`` if it
    is): a reply is only ``Applied`` when it shows the asked-for object and spec."""
    meta, spec = _mapping(obj.get("metadata")), _mapping(obj.get("spec"))
    lease_ref = _mapping(spec.get("leaseRef"))
    shown = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "leaseRef": lease_ref.get("name"),
        "fencingToken": spec.get("fencingToken"),
        "objectRef": spec.get("objectRef"),
        "operationId": spec.get("operationId"),
    }
    wanted = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FencedArtifact",
        "name": req.name,
        "namespace": req.namespace,
        "leaseRef": req.lease,
        "fencingToken": req.token,
        "objectRef": req.object_ref,
        "operationId": req.operation_id,
    }
    for key, value in wanted.items():
        got = shown[key]
        if got != value or type(got) is not type(value):
            return f"{key} {got!r:.80} (expected {value!r:.80})"
    return None


def _not_the_artifact(req: PublishRequest, obj: dict[str, Any]) -> str | None:
    """Why a 2xx read is not the FencedArtifact ``req`` names (``None`` if it is)."""
    meta = _mapping(obj.get("metadata"))
    if obj.get("kind") != "FencedArtifact" or obj.get("apiVersion") != f"{GROUP}/{VERSION}":
        return f"a {obj.get('kind')!r:.40} ({obj.get('apiVersion')!r:.40})"
    if meta.get("name") != req.name or meta.get("namespace") != req.namespace:
        return f"object {meta.get('namespace')!r:.80}/{meta.get('name')!r:.80}"
    return None


def plan(req: PublishRequest, retry: RetryPolicy) -> Plan:
    """The publish as a sequence of :class:`Request` / :class:`Sleep` steps (no I/O).

    The driver sends each step's answer back (``None`` after a :class:`Sleep`, a :class:`Reply`
    with status 0 for a transport error)."""
    path = artifact_path(req.namespace, req.name)
    last: _Retry | None = None
    for attempt in range(1, max(1, retry.attempts) + 1):
        if attempt > 1:
            yield Sleep(retry.delay(attempt - 1))
        current = yield Request("GET", path)
        assert current is not None
        if current.status_code == 404:
            answer = yield Request("POST", artifact_path(req.namespace), req.new_object())
        elif current.ok and isinstance(current.body, dict):
            other = _not_the_artifact(req, current.body)
            if other is not None:
                return Rejected(
                    "unexpected_reply",
                    f"unexpected_reply: {current.request} returned {other}, not FencedArtifact "
                    f"{req.namespace}/{req.name}: nothing written",
                    current.status_code,
                )
            obj = copy.deepcopy(current.body)
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = req.expected_version or meta.get("resourceVersion")
            obj["spec"] = req.spec()
            obj.pop("status", None)
            answer = yield Request("PUT", path, obj)
        elif current.ok:  # 2xx without an object: not an answer we can build on
            last = _Retry(f"unexpected answer to {current.request}: {current.body!r:.200}", 0)
            continue
        else:
            answer = current  # the read itself failed
        assert answer is not None
        outcome = classify(req, answer)
        if not isinstance(outcome, _Retry):
            return outcome
        last = outcome
    assert last is not None
    return results.Unavailable(
        f"gave up after {retry.attempts} attempts: {last.message}", retry.attempts, last.status_code
    )


def _request(
    *,
    name: str,
    object_ref: str,
    namespace: str | None = None,
    default: str = "default",
    lease: str | None = None,
    token: int | None = None,
    grant: Grant | None = None,
    operation_id: str | None = None,
    expected_version: str | None = None,
    labels: dict[str, str] | None = None,
) -> PublishRequest:
    if grant is not None:
        lease = lease or grant.lease
        token = grant.token if token is None else token
    if lease is None or token is None:
        raise InvalidInput("publish needs a lease and a token (or a grant that names its lease)")
    if operation_id is not None and (not isinstance(operation_id, str) or not operation_id):
        raise InvalidInput(f"operation_id must be a non-empty string, got {operation_id!r:.40}")
    return PublishRequest(
        namespace=dns_label(namespace or default),
        name=dns_subdomain(name, "FencedArtifact name"),
        lease=dns_subdomain(lease, "FencedLease name"),
        token=check_token(token),
        object_ref=object_ref,
        operation_id=operation_id or f"{token}-{uuid.uuid4().hex[:12]}",
        expected_version=expected_version,
        labels=labels,
    )


class PublishOptions(TypedDict, total=False):
    """The keywords of :meth:`Publisher.publish` after ``object_ref``."""

    grant: Grant | None
    lease: str | None
    token: int | None
    operation_id: str | None
    namespace: str | None
    expected_version: str | None
    labels: dict[str, str] | None


class _Publishing(Generic[C]):
    """What the two publishers share; they differ only in their client and its awaits."""

    new_client: Callable[[], C]

    def __init__(
        self, client: C | None = None, *, retry: RetryPolicy | None = None, sleep: Any = None
    ) -> None:
        self.client: C = client or self.new_client()
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self.calls: list[RequestInfo] = []
        """Every request sent, in order (for logs and tests)."""

    def _plan(self, name: str, object_ref: str, options: PublishOptions) -> Plan:
        req = _request(name=name, object_ref=object_ref, default=self.client.namespace, **options)
        return plan(req, self.retry)


class Publisher(_Publishing[KubeClient]):
    """Publishes FencedArtifacts (synchronous).

    >>> with KubeClient() as kube:                                          # doctest: +SKIP
    ...     result = Publisher(kube).publish("report-july", object_ref=key, grant=grant)
    """

    new_client = KubeClient

    def publish(
        self, name: str, *, object_ref: str, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """Point artifact ``name`` at ``object_ref`` under ``grant`` (or ``lease``+``token``).

        ``operation_id`` identifies this publish (default: a new random id; pass your own to
        make a retry across processes a ``Duplicate``).  ``expected_version``: the artifact's
        ``resourceVersion`` this publish was prepared against; a mismatch is
        ``Rejected("conflict")`` instead of a re-read.  Also ``namespace`` (default: the
        client's) and ``labels`` (of a new artifact).
        """
        steps = self._plan(name, object_ref, options)
        return drive(steps, self.client, self._sleep or time.sleep, self.calls)


class AsyncPublisher(_Publishing[AsyncKubeClient]):
    """Publishes FencedArtifacts (asyncio); same semantics as :class:`Publisher`."""

    new_client = AsyncKubeClient

    async def publish(
        self, name: str, *, object_ref: str, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """See :meth:`Publisher.publish`."""
        steps = self._plan(name, object_ref, options)
        return await drive_async(steps, self.client, self._sleep or asyncio.sleep, self.calls)
