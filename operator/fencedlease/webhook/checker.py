"""The fence check of one AdmissionReview: pure decisions (:mod:`.admission`) plus async I/O.

I/O is the lease's fencing policy (``lease_lookup``), one read-only etcd transaction (the
token's grant, the domain's high-water mark and its current generation), and Events posted in
the background.
Nothing here blocks the event loop, and nothing here changes fencing state.

Counting: ``fencedlease_fence_checks_total`` counts every call; ``fence_results_total`` and
the denial Events count each *write* once, with the outcome its client saw, although the API
server may call the webhook several times for one write (:mod:`.outcomes`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fencedlease import metrics
from fencedlease.authority import fence as fencing
from fencedlease.authority.types import (
    FenceCode,
    FenceRead,
    FencingPolicy,
    StoreUnavailable,
)
from fencedlease.events import EventSink, ObjectRef, artifact_ref, lease_ref
from fencedlease.webhook import admission, decisions, objects
from fencedlease.webhook.decisions import FencedWrite, StoreAnswer, WriteKind
from fencedlease.webhook.events import BackgroundEvents
from fencedlease.webhook.outcomes import Ruling, WriteId, WriteOutcomes, content_digest
from fencedlease.webhook.parents import ParentReader, ParentUnreadable
from fencedlease.webhook.reviews import AllowedWriters, Verdict, review_response, review_uid

log = logging.getLogger(__name__)

_FENCE_CODES = frozenset(code.value for code in FenceCode)

PolicyValue = FencingPolicy | str
Parse = Callable[
    [Any],
    FencedWrite
    | admission.FinalizerRelease
    | objects.CoverCheck
    | objects.StatusCheck
    | objects.ScaleCheck
    | Verdict,
]
"""A review's parser: :func:`.admission.parse_review` (FencedArtifacts, the default) or
:func:`.objects.parse_object_review` (fenced objects)."""
LeaseLookup = Callable[[str, str], Awaitable[PolicyValue | None] | PolicyValue | None]
"""``lease_lookup(namespace, name)`` → the FencedLease's ``spec.fencingPolicy`` (any
``AllowEqual``/``StrictlyGreater`` str enum or str), or ``None`` when the lease does not exist
or is being deleted (a lease being deleted fences no new write). May be sync (a cache) or
async (an API GET)."""


class FenceStore(Protocol):
    """The part of :class:`fencedlease.store.etcd.EtcdStore` the webhook uses (reads only)."""

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead: ...

    async def epoch(self) -> str: ...


def check_budget(timeout_seconds: float) -> float:
    """Seconds the fence check may take when the API server waits ``timeout_seconds``.

    The rest is left for TLS, HTTP and JSON on both sides, so a slow etcd is answered with
    ``unavailable`` and its reason instead of the API server's bare timeout: 1 s → 0.5 s,
    3 s → 2.4 s, 5 s → 4 s, 30 s → 24 s.
    """
    if timeout_seconds <= 0:
        raise ValueError(f"timeout_seconds must be positive, not {timeout_seconds}")
    return max(timeout_seconds - max(0.5, 0.2 * timeout_seconds), 0.1)


class FenceChecker:
    """Answers AdmissionReviews of fenced writes: FencedArtifacts (``parse``: the default,
    :func:`.admission.parse_review`, the rules are there) or fenced objects
    (:func:`.objects.parse_object_review`).

    Admission never changes fencing state: the store is only read (one etcd transaction for
    the token's grant and the domain's mark).  The mark follows committed writes, recorded by
    the controller (``docs/fenced-publish.md``).
    """

    def __init__(
        self,
        store: FenceStore,
        lease_lookup: LeaseLookup,
        events: EventSink | None = None,
        *,
        writers: AllowedWriters | None = None,
        timeout: float = check_budget(5),
        clock: Callable[[], float] = time.monotonic,
        outcome_window: float = 5.0,
        parse: Parse = admission.parse_review,
        parents: ParentReader | None = None,
    ) -> None:
        self.parse = parse
        self.parents = parents
        """Reads the object a scale write scales (``None``: such a write is ``unavailable``)."""
        self.store = store
        self.lease_lookup = lease_lookup
        self.events = BackgroundEvents(events)
        self.writers = writers or AllowedWriters()
        self.timeout = timeout
        self.outcomes: WriteOutcomes[_Outcome] = WriteOutcomes(clock, window=outcome_window)
        """Each write's outcome once (``fence_results_total``, denial Events)."""
        self._settler: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Count admissions that became final in the background (see :mod:`.outcomes`)."""
        if self._settler is None:
            self._settler = asyncio.create_task(self._settle_loop(), name="fence-outcomes")

    @property
    def running(self) -> bool:
        """Started and its background counting has not died (readiness)."""
        return self._settler is not None and not self._settler.done()

    async def stop(self, within: float = 5.0) -> None:
        """Count every pending admission, then give the queued Events ``within`` seconds;
        Events still unsent then are cancelled (counted as dropped, cause ``shutdown``).
        Returns within about ``3 * within`` seconds whatever the store or the API server do."""
        settler, self._settler = self._settler, None
        if settler is not None:
            settler.cancel()
            await asyncio.wait({settler}, timeout=within)
        await self.settle()
        await self.events.close(within)

    async def settle(self) -> None:
        """Count every pending admission now (shutdown; tests once their clients finished)."""
        await self._count(self.outcomes.flush())

    async def settle_due(self) -> None:
        """Count the admissions whose write has been quiet for the outcome window."""
        await self._count(self.outcomes.due())

    async def _settle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.outcomes.window / 4)
            try:
                await self.settle_due()
            except Exception:  # keep counting later writes
                log.exception("counting settled fence outcomes failed")

    async def review(self, body: Any) -> dict[str, Any]:
        """AdmissionReview request → AdmissionReview response (never raises: a bug answers
        ``unavailable``, never admits unchecked, never makes the server answer 500)."""
        try:
            return await self._review(body)
        except Exception as error:
            log.exception("answering an AdmissionReview failed")
            verdict = Verdict.unavailable(f"internal error: {type(error).__name__}")
            return review_response(review_uid(body), verdict)

    async def _review(self, body: Any) -> dict[str, Any]:
        uid = review_uid(body)
        started = time.monotonic()
        parsed = self.parse(body)
        operation = "other"
        patch: list[dict[str, Any]] | None = None
        if isinstance(parsed, Verdict):
            verdict = parsed
        else:
            if isinstance(parsed, FencedWrite):
                operation = parsed.kind.value
            try:
                async with asyncio.timeout(self.timeout):
                    if isinstance(parsed, FencedWrite):
                        verdict = await self._check(parsed)
                    elif isinstance(parsed, objects.StatusCheck):
                        verdict = await self._status(parsed)
                    elif isinstance(parsed, objects.ScaleCheck):
                        verdict = await self._scale(parsed)
                    else:
                        verdict = await self._release(parsed)
            except TimeoutError:
                verdict = Verdict.unavailable(f"fence check timed out after {self.timeout}s")
            except (StoreUnavailable, ParentUnreadable) as error:
                verdict = Verdict.unavailable(str(error))
            except Exception as error:  # never admit unchecked
                log.exception("fence check failed")
                verdict = Verdict.unavailable(f"internal error: {type(error).__name__}")
            if verdict.code == "unavailable":
                metrics.ADMISSION_UNAVAILABLE.labels(operation).inc()
            elif isinstance(parsed, FencedWrite):
                # Counting never changes the verdict: it runs after the check, within what
                # is left of the budget (the epoch label falls back to "unknown").
                left = max(0.0, self.timeout - (time.monotonic() - started))
                try:
                    await self._after(parsed, verdict, body, within=left)
                except Exception:  # the verdict stands; only its counting failed
                    log.exception("counting a fence outcome failed")
                if verdict.allowed and parsed.object_kind is None:
                    patch = admission.finalizer_patch(parsed)
        if verdict.code == "invalid":
            metrics.ADMISSION_INVALID.labels("review").inc()
        metrics.ADMISSION_LATENCY.labels(operation).observe(time.monotonic() - started)
        if not verdict.allowed and verdict.code not in ("invalid",):
            log.info("denied %s: %s", operation, verdict.message)
        return review_response(uid, verdict, patch)

    async def _policy(self, write: FencedWrite) -> FencingPolicy | None:
        return await self._policy_of(write.namespace, write.lease)

    async def _policy_of(self, namespace: str, lease: str) -> FencingPolicy | None:
        found = self.lease_lookup(namespace, lease)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else FencingPolicy(str(found))

    async def _release(self, release: admission.FinalizerRelease | objects.CoverCheck) -> Verdict:
        read = await self.store.grant_and_mark(release.namespace, release.lease, release.token)
        grant_ok = fencing.check_grant(read.grant, release.domain) is None
        mark = read.mark.token if read.mark else None
        if isinstance(release, objects.CoverCheck):
            return objects.cover_verdict(release, grant_ok, mark)
        return admission.finalizer_verdict(release, grant_ok, mark)

    async def _status(self, check: objects.StatusCheck) -> Verdict:
        """A fenced object's status write: is its Pod the holder of the lease's current
        grant? (:func:`.objects.status_verdict`; one read, two when the stored token is not
        the current generation's)."""
        if await self._policy_of(check.namespace, check.lease) is None:
            return Verdict.allow(
                "unchanged", f"FencedLease {check.domain} does not exist: nothing is left to fence"
            )
        stored = check.stored_token
        read = await self.store.grant_and_mark(check.namespace, check.lease, stored or 0)
        current = read.generation.token
        holder = read.grant if current is not None and current == stored else None
        if current is not None and holder is None:
            found = await self.store.grant_and_mark(check.namespace, check.lease, current)
            holder = found.grant
        return objects.status_verdict(check, current, holder, read.grant)

    async def _scale(self, check: objects.ScaleCheck) -> Verdict:
        """A scale write by a Pod of the object's namespace: read the parent object (a Scale
        has no labels), then decide it like a status write (:meth:`_status`). A failed read
        raises :class:`ParentUnreadable`: ``unavailable``."""
        if self.parents is None:
            raise ParentUnreadable(
                f"the scale write of {check.parent} is not decided: this webhook reads no "
                "parent objects"
            )
        parent = await self.parents(check.parent)
        found = objects.scale_status_check(check, parent)
        if isinstance(found, Verdict):
            return found
        return await self._status(found)

    async def _check(self, write: FencedWrite) -> Verdict:
        if write.kind is WriteKind.STATUS:
            policy = FencingPolicy.ALLOW_EQUAL  # unused: status writes never compare orders
        else:
            looked_up = await self._policy(write)
            if looked_up is None and write.releases:
                return Verdict.allow(
                    "unchanged",
                    f"FencedLease {write.domain} does not exist: nothing is left to fence",
                )
            if looked_up is None:
                verdict = Verdict.from_fence(
                    FenceCode.LEASE_MISMATCH,
                    f"lease_mismatch: token {write.token}: FencedLease {write.domain} does not "
                    "exist or is being deleted, so no token can be written for it "
                    "(high-water mark not checked)",
                )
                return verdict
            policy = looked_up
        if write.kind is WriteKind.DELETE:
            policy = FencingPolicy.ALLOW_EQUAL  # the stored token itself meets the mark
        local = decisions.order_against_stored(write, policy)
        query = decisions.fence_query(write, local)
        holder_detail = decisions.holder_refusal(write, self.writers)
        read = await self.store.grant_and_mark(write.namespace, write.lease, query.token)
        if not await self._stored_token_issued(write, read):
            # Written past the fence (or before the policy): it fences no one (the
            # controller events it UnverifiedToken); the stored object is not compared.
            old = replace(write.old, token=None, operation_id=None) if write.old else None
            write = replace(write, old=old)
            local = decisions.order_against_stored(write, policy)
        result, _ = fencing.evaluate(
            write.domain,
            read.grant,
            read.mark,
            query.token,
            policy,
            holder=query.holder,
            holder_uid=query.holder_uid,
            # A spec write publishes: a superseded generation's token is stale at once
            # (docs/tokens.md).  A status write only records what the stored spec carries.
            generation=read.generation if write.kind is not WriteKind.STATUS else None,
        )
        generation = read.generation.token
        answer = StoreAnswer(
            result,
            read.mark.token if read.mark else None,
            superseded=write.kind is not WriteKind.STATUS
            and (generation is None or query.token < generation),
        )
        return decisions.decide(write, local, answer, holder_detail=holder_detail)

    async def _stored_token_issued(self, write: FencedWrite, read: FenceRead) -> bool:
        """May the stored object's token order this write? Only a token issued for the
        write's lease may (a stored value gets the check a request's gets); one the mark
        already covers cannot refuse anything the mark does not. A second read only when the
        stored token is above both the write's token and the mark (rare: a race, or a
        token written past the fence)."""
        old = write.old
        if old is None or old.token is None or write.kind in (WriteKind.STATUS, WriteKind.DELETE):
            return True
        mark = read.mark.token if read.mark else None
        if mark is not None and old.token <= mark:
            return True
        if old.token == write.token:
            return fencing.check_grant(read.grant, write.domain) is None
        if old.token < write.token:
            return True  # it cannot refuse this write
        stored = await self.store.grant_and_mark(write.namespace, write.lease, old.token)
        return fencing.check_grant(stored.grant, write.domain) is None

    async def _after(
        self, write: FencedWrite, verdict: Verdict, body: Any, *, within: float
    ) -> None:
        """Metrics and Event of one fence decision (none for dry runs: NoneOnDryRun), waiting
        at most ``within`` seconds for the store's epoch."""
        if write.dry_run or verdict.code not in _FENCE_CODES:
            return
        operation = write.kind.value
        metrics.FENCE_CHECKS.labels(verdict.code, operation).inc()
        if not verdict.allowed:
            call = Ruling.DENIED
        elif write.precondition_fails:
            call = Ruling.VOID  # the API server answers 409 Conflict: no fence result
        else:
            call = Ruling.ALLOWED
        outcome = _Outcome(verdict, operation, self._event_ref(write))
        await self._count(self.outcomes.observe(write_id(write, body), call, outcome), within)

    async def _count(self, outcomes: list[_Outcome], within: float | None = None) -> None:
        """Count final outcomes; post an Event for each denial (accepted fences are evented
        by the controller once the write committed). The epoch label is waited for at most
        ``within`` seconds (default: the check's timeout), then ``unknown``."""
        if not outcomes:
            return
        try:
            async with asyncio.timeout(self.timeout if within is None else within):
                epoch = await self.store.epoch()
        except (TimeoutError, StoreUnavailable):
            epoch = "unknown"  # count the outcomes anyway
        for outcome in outcomes:
            verdict = outcome.verdict
            metrics.FENCE_RESULTS.labels(verdict.code, outcome.operation, epoch).inc()
            if not verdict.allowed:
                type_ = "Normal" if verdict.code == FenceCode.DUPLICATE.value else "Warning"
                self.events.emit(outcome.ref, type_, _reason(verdict.code), verdict.message)

    @staticmethod
    def _event_ref(write: FencedWrite) -> ObjectRef:
        if write.object_kind is not None:
            kind = write.object_kind
            uid = write.old.uid if write.old is not None else ""
            if write.old is None:
                return lease_ref(write.namespace, write.lease)
            return ObjectRef(kind.kind, kind.api_version, write.namespace, write.name, uid)
        if write.old is not None:
            return artifact_ref(write.namespace, write.name, write.old.uid)
        return lease_ref(write.namespace, write.lease)


@dataclass(frozen=True, slots=True)
class _Outcome:
    verdict: Verdict
    operation: str
    ref: ObjectRef


def write_id(write: FencedWrite, body: Any) -> WriteId:
    """The identity of ``write`` across the API server's re-runs of its admission: the
    artifact, kind, writer, token, operation id and what the new object sets."""
    request = body.get("request") if isinstance(body, dict) else None
    new = (request or {}).get("object") if isinstance(request, dict) else None
    part = "status" if write.kind is WriteKind.STATUS else "spec"
    content = new.get(part) if isinstance(new, dict) else None
    if write.object_kind is not None and isinstance(new, dict):
        content = {k: v for k, v in new.items() if k != "metadata"}
    return WriteId(
        write.namespace,
        write.name,
        write.kind.value,
        write.identity.username,
        write.token,
        write.operation_id,
        content_digest(content),
    )


def _reason(code: str) -> str:
    """Event reason (CamelCase) of a denial code: ``stale_fence`` → ``FenceStaleFence``."""
    return "Fence" + "".join(part.capitalize() for part in code.split("_"))
