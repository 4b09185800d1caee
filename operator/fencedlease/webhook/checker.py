"""The fence check of one AdmissionReview: pure decisions (:mod:`.admission`) plus async I/O.

I/O is the lease's fencing policy (``lease_lookup``), the store (one etcd transaction that
checks and advances the high-water mark, or read-only queries for dry runs and writes that
will not commit), and Events posted in the background.  Nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fencedlease import metrics
from fencedlease.authority import fence as fencing
from fencedlease.authority.types import (
    FenceCode,
    FenceResult,
    FencingPolicy,
    HighWaterMark,
    StoreUnavailable,
    TokenGrant,
    Unavailable,
)
from fencedlease.events import ObjectRef, artifact_ref, lease_ref
from fencedlease.webhook import admission
from fencedlease.webhook.admission import ArtifactWrite, StoreAnswer, Verdict, WriteKind
from fencedlease.webhook.events import BackgroundEvents, EventSink

log = logging.getLogger(__name__)

_FENCE_CODES = frozenset(code.value for code in FenceCode)

PolicyValue = FencingPolicy | str
LeaseLookup = Callable[[str, str], Awaitable[PolicyValue | None] | PolicyValue | None]
"""``lease_lookup(namespace, name)`` → the FencedLease's ``spec.fencingPolicy`` (any
``AllowEqual``/``StrictlyGreater`` str enum or str), or ``None`` when the lease does not exist.
May be sync (a cache) or async (an API GET)."""


class FenceStore(Protocol):
    """The part of :class:`fencedlease.store.etcd.EtcdStore` the webhook uses."""

    async def fence(
        self,
        namespace: str,
        name: str,
        token: int,
        policy: FencingPolicy = ...,
        operation_id: str | None = ...,
        *,
        holder: str | None = ...,
        dry_run: bool = ...,
        operation: str = ...,
    ) -> FenceResult | Unavailable: ...

    async def token_grant(self, token: int) -> TokenGrant | None: ...

    async def high_water_mark(self, namespace: str, name: str) -> HighWaterMark | None: ...

    async def epoch(self) -> str: ...


def normalize_policy(value: PolicyValue) -> FencingPolicy:
    """Any spelling of the policy enum (models' or authority's) → the authority's enum.

    The store compares with ``is``, so a ``fencedlease.models.FencingPolicy`` member passed
    as is would silently be treated as AllowEqual.
    """
    return FencingPolicy(str(value.value if hasattr(value, "value") else value))


class FenceChecker:
    """Answers AdmissionReviews for FencedArtifacts (see :mod:`.admission` for the rules)."""

    def __init__(
        self,
        store: FenceStore,
        lease_lookup: LeaseLookup,
        events: EventSink | None = None,
        *,
        allow_non_pod_writers: bool = True,
        timeout: float = 4.0,
    ) -> None:
        self.store = store
        self.lease_lookup = lease_lookup
        self.events = BackgroundEvents(events)
        self.allow_non_pod_writers = allow_non_pod_writers
        self.timeout = timeout

    async def review(self, body: Any) -> dict[str, Any]:
        """AdmissionReview request → AdmissionReview response (never raises)."""
        uid = admission.review_uid(body)
        started = time.monotonic()
        parsed = admission.parse_review(body)
        operation = "other"
        if isinstance(parsed, Verdict):
            verdict = parsed
        else:
            operation = parsed.kind.value
            try:
                async with asyncio.timeout(self.timeout):
                    verdict = await self._check(parsed)
            except TimeoutError:
                verdict = Verdict.unavailable(f"fence check timed out after {self.timeout}s")
            except StoreUnavailable as error:
                verdict = Verdict.unavailable(str(error))
            except Exception as error:  # never admit unchecked
                log.exception("fence check failed")
                verdict = Verdict.unavailable(f"internal error: {error!r}")
            if verdict.code == "unavailable":
                metrics.ADMISSION_UNAVAILABLE.labels(operation).inc()
        metrics.ADMISSION_LATENCY.labels(operation).observe(time.monotonic() - started)
        if not verdict.allowed and verdict.code not in ("invalid",):
            log.info("denied %s: %s", operation, verdict.message)
        return admission.review_response(uid, verdict)

    async def _policy(self, write: ArtifactWrite) -> FencingPolicy | None:
        found = self.lease_lookup(write.namespace, write.lease)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else normalize_policy(found)

    async def _check(self, write: ArtifactWrite) -> Verdict:
        if write.kind is WriteKind.STATUS:
            policy = FencingPolicy.ALLOW_EQUAL  # unused: status writes never compare orders
        else:
            looked_up = await self._policy(write)
            if looked_up is None:
                verdict = Verdict.from_fence(
                    FenceCode.LEASE_MISMATCH,
                    f"lease_mismatch: token {write.token}: FencedLease {write.domain} does not "
                    "exist, so no token can be written for it (high-water mark not checked)",
                )
                await self._after(write, verdict, counted=False)
                return verdict
            policy = looked_up
        local = admission.order_against_stored(write, policy)
        query = admission.fence_query(write, local)
        holder_detail = admission.holder_refusal(write, self.allow_non_pod_writers)
        if holder_detail is not None:
            query = admission.FenceQuery(query.token, query.holder, query.operation_id, False)
        counted = False
        if query.advance:
            raw = await self.store.fence(
                write.namespace,
                write.lease,
                query.token,
                policy,
                query.operation_id,
                holder=query.holder,
                dry_run=False,
                operation=write.kind.value,
            )
            if isinstance(raw, Unavailable):
                return Verdict.unavailable(f"{raw.code}: {raw.reason}")
            answer = StoreAnswer(raw)
            counted = True  # the store counted its verdict in fence_results
        else:
            answer = await self._read_only(write, query, policy)
        verdict = admission.decide(write, local, answer, holder_detail=holder_detail)
        await self._after(write, verdict, counted=counted)
        return verdict

    async def _read_only(
        self, write: ArtifactWrite, query: admission.FenceQuery, policy: FencingPolicy
    ) -> StoreAnswer:
        """The store's verdict without any side effect (grant and mark read, pure evaluate)."""
        grant, hwm = await asyncio.gather(
            self.store.token_grant(query.token),
            self.store.high_water_mark(write.namespace, write.lease),
        )
        result, _ = fencing.evaluate(
            write.domain,
            grant,
            hwm,
            query.token,
            policy,
            operation_id=query.operation_id,
            holder=query.holder,
        )
        return StoreAnswer(result, hwm.token if hwm else None)

    async def _after(self, write: ArtifactWrite, verdict: Verdict, *, counted: bool) -> None:
        """Metric and Event (none for dry runs: NoneOnDryRun)."""
        if write.dry_run:
            return
        will_conflict = verdict.allowed and write.precondition_fails
        if not counted and not will_conflict and verdict.code in _FENCE_CODES:
            metrics.FENCE_RESULTS.labels(
                verdict.code, write.kind.value, await self.store.epoch()
            ).inc()
        if verdict.allowed:
            return  # accepted fences are evented by the controller once the write committed
        type_ = "Normal" if verdict.code == FenceCode.DUPLICATE.value else "Warning"
        self.events.emit(self._event_ref(write), type_, _reason(verdict.code), verdict.message)

    @staticmethod
    def _event_ref(write: ArtifactWrite) -> ObjectRef:
        if write.old is not None:
            return artifact_ref(write.namespace, write.name, write.old.uid)
        return lease_ref(write.namespace, write.lease)


def _reason(code: str) -> str:
    """Event reason (CamelCase) of a denial code: ``stale_fence`` → ``FenceStaleFence``."""
    return "Fence" + "".join(part.capitalize() for part in code.split("_"))
