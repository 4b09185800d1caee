"""Reconcile one FencedLease: grant, renew, expire, hand over, annotate Pods, project status.

The decisions are the grant authority's (``fencedlease.authority``), the pure holder choice
(:func:`~.pods.choose_holder`) and the pure status projection (:mod:`.status`); this module
only sequences store calls and Kubernetes writes, through the Protocols of :mod:`.ports`.
Each run returns when it wants to run again (renewal or expiry due), so one scheduler drives
every lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace

from fencedlease import metrics
from fencedlease.authority.types import (
    Acquired,
    Busy,
    LeaseKey,
    LeaseRecord,
    LeaseState,
    LeaseView,
    NotHeld,
    Released,
    Renewed,
    StoreUnavailable,
    Unavailable,
)
from fencedlease.controller import status as project
from fencedlease.controller.leases import LEASE_FINALIZER, LeaseCache, LeaseObject, Unverified
from fencedlease.controller.pods import PodCache, PodInfo, choose_holder
from fencedlease.controller.ports import LeaseStore, LeaseWrites
from fencedlease.events import ObjectRef, lease_ref
from fencedlease.models import (
    ANNOTATION_FORCE_RELEASE,
    FencedLeaseSpec,
    FencedLeaseStatus,
    pod_annotation_keys,
    rfc3339,
)

log = logging.getLogger(__name__)

RENEW_FRACTION = project.RENEW_FRACTION  # renew when a third of the lease duration has passed
POD_WRITE_ATTEMPTS = 3
"""Conditional Pod annotation attempts per write (each after a fresh read)."""
WAKE_SLACK = 0.005
"""The leases scheduler runs every key due within this of its wake in that wake: the renewals
of one slot (:func:`~.status.tick_anchor`) fall due microseconds to milliseconds apart, each
delay computed from its own pass's clock reading, and run together."""
DUE_SLACK = 2 * WAKE_SLACK
"""A renewal this close to its due time counts as due (the scheduler's float arithmetic and
its :data:`WAKE_SLACK`): it renews without a read, not a pass early."""
RETRY_UNAVAILABLE = 5.0  # seconds between attempts while etcd or the restore guard says no
RECHOOSE = 0.05  # seconds until a pass whose chosen holder left meanwhile decides again
GATHER_FRACTION = 0.1
"""A Pod's deadline write waits for the renewals of its other leases still in etcd at most
this fraction of the renew interval (and at most :data:`GATHER_LIMIT`), so one stuck etcd
call does not hold back the deadlines of the Pod's other leases. Of a write that carries
renewals of different intervals the shortest counts, from the write's opening."""
GATHER_LIMIT = 1.0


@dataclass(frozen=True, slots=True)
class LiveGrant:
    """A grant this replica made or renewed in its current leadership term: what a renewal
    pass decides on instead of reading etcd (``docs/operations.md``, "What a renewal
    writes"). The renew transaction compares on the version the store cached with it, so a
    stale copy costs a refused compare, never a wrong write."""

    lease_id: str
    token: int
    holder: str
    holder_uid: str | None
    duration: float
    valid_until: dt.datetime
    proof: str


@dataclass
class _DeadlineBatch:
    """Renewed deadlines of leases held by one Pod, waiting for one write to it; closed (no
    more joins) once that write holds the Pod's turn."""

    uid: str
    annotations: dict[str, str | None]
    done: asyncio.Future[bool]
    opened: float
    """When the batch opened (the reconciler's clock): every bound on its wait runs from it."""
    until: float
    """The latest end of its wait (the reconciler's clock): the opening plus the smallest
    ``wait`` of the renewals in it, so none is held back past its own bound."""
    joined: int = 0
    gathered: asyncio.Future[None] | None = None
    """Set while the write waits for renewals of the same Pod still in etcd."""
    timer: asyncio.Timeout | None = None
    """That wait's timeout, while it runs: a joiner with a smaller bound moves it earlier."""


class LeaseReconciler:
    def __init__(
        self,
        store: LeaseStore,
        kube: LeaseWrites,
        pods: PodCache,
        leases: LeaseCache,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        pod_scope: str | None = None,
    ) -> None:
        self.store = store
        self.kube = kube
        self.pods = pods
        self.leases = leases
        self.pod_scope = pod_scope
        """The label selector the Pod watch is scoped to (``None``: every Pod), for messages."""
        self.clock = clock
        self.wall = wall
        self._last_renewal: dict[LeaseKey, float] = {}
        self._live: dict[LeaseKey, LiveGrant] = {}
        # When a renewal was last recorded in the status this term (monotonic).
        self._recorded: dict[LeaseKey, float] = {}
        # When each live grant's next renewal is due (monotonic), on its holder Pod's ticks.
        self._due: dict[LeaseKey, float] = {}
        self._ticks: dict[tuple[str, str, float], float] = {}
        self._batches: dict[tuple[str, str], _DeadlineBatch] = {}
        # Read-free renewals in their etcd call, by holder Pod: a deadline write to that Pod
        # waits for them (:meth:`_patch_pod_shared`).
        self._in_etcd: dict[tuple[str, str], int] = {}
        self._reported_spec_error: dict[LeaseKey, int] = {}
        self._reported_unverified: dict[LeaseKey, Unverified] = {}
        # One lock per Pod being written (gone once no write holds it).
        self._pod_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    # ----------------------------------------------------------------------- entry points

    async def reconcile(self, key: LeaseKey) -> float | None:
        """One pass over lease ``key``; returns seconds until the next pass is due."""
        lease = self.leases.get(key)
        if lease is None:
            if key in self._live:
                # Deleted with no finalizer of ours (it had not landed, and the write that
                # would have added it conflicted): nothing holds the object, so release the
                # grant and clean its holder now, or its Pod would read `held` until the
                # deadline passed.
                await self.finalize(key.namespace, key.name)
            # What was said about the gone lease (one report per generation or token).
            self._reported_spec_error.pop(key, None)
            self._reported_unverified.pop(key, None)
            return None
        if lease.deleting:
            if LEASE_FINALIZER in lease.finalizers:
                await self.finalize(key.namespace, key.name)
                rest = [f for f in lease.finalizers if f != LEASE_FINALIZER]
                await self.kube.set_lease_finalizers(
                    key.namespace, key.name, lease.resource_version, rest
                )
            elif key in self._live:
                # Granted before our finalizer could land (held by someone else's): the API
                # server refuses new finalizers now, so release and clean up at once.
                await self.finalize(key.namespace, key.name)
            return None
        current = self.leases.status(key) or lease.status
        status = current
        if isinstance(lease.spec, str):
            await self._ensure_finalizer(lease)
            await self._report_invalid(lease, current, lease.spec)
            return None
        try:
            delay, status = await self._pass(lease, lease.spec, status)
        except StoreUnavailable as exc:
            status = await self._unavailable(lease, status, Unavailable(exc.code, exc.reason))
            delay = RETRY_UNAVAILABLE
        # The next pass is due ``delay`` from now (a renewal: on its holder's ticks): the
        # writes below (finalizer, Event, status) must not push it back, and the scheduler
        # counts the delay from when this returns, so their time comes off it.
        decided = self.clock()
        if not await self._ensure_finalizer(lease):
            return None  # deleted meanwhile: released and cleaned up, nothing to write
        status = project.reconciled(status, lease.generation, self.wall())
        await self._report_unverified(lease)
        if (
            await self._write_status(lease, current, status)
            and status.renew_time != current.renew_time
        ):
            self._recorded[key] = self.clock()
        if delay is None:
            return None
        return max(0.0, delay - (self.clock() - decided))

    async def _ensure_finalizer(self, lease: LeaseObject) -> bool:
        """Deleting the lease must release it and clean the Pods: hold it until we have.

        Written after the pass, so a first grant's etcd transaction and Pod write do not
        share the API server and etcd with it (grant latency); and before the status write,
        which is conditional on the version it makes. A conflict means a newer version is on
        its way (its event pokes us again). A lease deleted before the finalizer landed has
        none to hold it: if this term granted it, release it and clean its Pods now
        (``False``: gone)."""
        if LEASE_FINALIZER in lease.finalizers:
            return True
        added = [*lease.finalizers, LEASE_FINALIZER]
        version = await self.kube.set_lease_finalizers(
            lease.namespace, lease.name, lease.resource_version, added
        )
        if version is not None:
            lease.finalizers = tuple(added)
            lease.resource_version = version
            return True
        if (
            lease.key in self._live
            and await self.kube.get_lease(lease.namespace, lease.name) is None
        ):
            await self.finalize(lease.namespace, lease.name)
            return False
        return True

    async def _pass(
        self, lease: LeaseObject, spec: FencedLeaseSpec, status: FencedLeaseStatus
    ) -> tuple[float | None, FencedLeaseStatus]:
        """Renew this term's live grant without a read, grant a lease that never had one
        without a read, else decide on a read of etcd."""
        key = lease.key
        renewed = await self._renew_live(lease, spec, status)
        if renewed is not None:
            return renewed
        if self._never_granted(lease, status):
            first = await self._reconcile(lease, spec, None, status, confirmed=False)
            if first is not None:
                return first
        view = await self.store.read(key.namespace, key.name)
        status = project.with_condition(
            status, "EtcdAvailable", "True", "Connected", "", self.wall()
        )
        decided = await self._reconcile(lease, spec, view, status)
        assert decided is not None
        return decided

    def _never_granted(self, lease: LeaseObject, status: FencedLeaseStatus) -> bool:
        """Nothing says this lease was ever granted: no status grant, nothing of ours, no
        force release, no signed token. Its grant can go out without a read: the acquire
        compares on what the store knows (nothing: the key must not exist), and any answer
        but a grant is decided again on a read."""
        key = lease.key
        state = pod_annotation_keys(key.name)["state"]
        return (
            status.lease_id is None
            and status.fencing_token is None
            and key not in self._live
            and not lease.annotations.get(ANNOTATION_FORCE_RELEASE)
            and self.leases.verified_token(key) == 0
            and self.leases.unverified(key) is None
            and not any(state in p.annotations for p in self.pods.annotated(*key))
        )

    async def finalize(self, namespace: str, name: str) -> None:
        """The FencedLease is being deleted: release it, drop the record, clean Pod annotations.

        The token grants and the high-water mark stay in etcd: a re-created lease of the same
        name keeps rejecting old tokens.
        """
        key = LeaseKey(namespace, name)
        view = await self.store.read(namespace, name)
        if view is not None and view.record.state is LeaseState.HELD:
            await self.store.release(namespace, name, view.record.lease_id, view.token)
        await self.store.delete(namespace, name)
        keys = pod_annotation_keys(name)
        for pod in self.pods.annotated(namespace, name):
            await self._patch_pod(pod, dict.fromkeys(keys.values()))
        self._forget_grant(key)

    def leadership_started(self) -> None:
        """A new term: what this process wrote or renewed in an earlier term may be stale."""
        self._last_renewal.clear()
        self._live.clear()
        self._recorded.clear()
        self._due.clear()
        self._ticks.clear()
        self.leases.forget_written()

    def _forget_grant(self, key: LeaseKey) -> None:
        self._last_renewal.pop(key, None)
        self._live.pop(key, None)
        self._recorded.pop(key, None)
        self._due.pop(key, None)

    def priority(self, key: LeaseKey) -> int:
        """Scheduler priority: renewing a live grant (0) before granting or expiring (1)."""
        return 0 if key in self._last_renewal else 1

    def group(self, key: LeaseKey) -> str:
        """Scheduler group: the holder Pod of a live grant (``""`` for any other lease), so
        the renewals of the leases one Pod holds, due on its ticks together, run back to back
        and share its one deadline write (:meth:`_patch_pod_shared`) rather than spread
        among other Pods' renewals over several writes."""
        live = self._live.get(key)
        return "" if live is None else f"{key.namespace}/{live.holder}"

    # ------------------------------------------------------------------------ the pass

    async def _reconcile(
        self,
        lease: LeaseObject,
        spec: FencedLeaseSpec,
        view: LeaseView | None,
        status: FencedLeaseStatus,
        *,
        confirmed: bool = True,
    ) -> tuple[float | None, FencedLeaseStatus] | None:
        """Decide on ``view``. ``confirmed=False``: ``view`` was not read (a lease never
        granted); only a grant is made from it, anything else returns ``None`` (read first)."""
        key = lease.key
        excluded: str | None = None
        forced = lease.annotations.get(ANNOTATION_FORCE_RELEASE)
        if forced:
            view, excluded = await self._force_release(lease, view, forced)

        if view is not None and view.record.state is LeaseState.HELD:
            view = await self._end_restored_generation(lease, view)

        candidates = self.pods.candidates(key.namespace, spec.holder_selector)
        if view is not None and view.record.state is LeaseState.HELD and not view.expired:
            return await self._keep(lease, view, status, candidates)

        expired = view is not None and view.record.state is LeaseState.HELD
        if expired:  # held, but this replica saw its duration pass without renewal
            assert view is not None
            await self._event(
                lease_ref(key.namespace, key.name, lease.uid),
                "Warning",
                "Expired",
                f"lease {view.record.lease_id} (token {view.token}) of Pod {view.record.holder} "
                f"expired without renewal",
            )
        self._forget_grant(key)  # no live grant of ours to renew any more
        choice = choose_holder([p for p in candidates if p.name != excluded], None)
        if choice is None:
            choice = choose_holder(candidates, None)
        if choice is None and not confirmed:
            return None
        loss = "force_released" if excluded else "expired" if expired else "handed_over"
        await self._mark_lost(key, keep=None, reason=loss)
        if choice is not None and self._candidate(key, spec, choice.name, choice.uid) is None:
            # The writes above let Pod events in: the chosen Pod left (a relist, a DELETED or
            # NotReady event), and that event poked this lease. A grant now would go to a Pod
            # that is no longer renewed, and hold the lease from the others for a duration.
            return RECHOOSE, status
        if choice is None:
            if view is not None and view.record.state is LeaseState.HELD:
                ended = await self.store.expire(key.namespace, key.name, view.record.lease_id)
                if isinstance(ended, Unavailable):
                    return RETRY_UNAVAILABLE, await self._unavailable(lease, status, ended)
            proof = self._proof(key, view.record.lease_id, view.token) if view else None
            return None, project.idle(status, view, proof, self.wall(), self.pod_scope)

        result = await self.store.acquire(
            key.namespace,
            key.name,
            choice.name,
            spec.lease_duration_seconds,
            token_floor=self.leases.max_token,
            holder_uid=choice.uid,
        )
        match result:
            case Acquired():
                status = project.with_condition(
                    status, "EtcdAvailable", "True", "Connected", "", self.wall()
                )
                self._last_renewal[key] = self.clock()
                self.leases.see_token(result.token)
                await self._annotate_holder(
                    key, choice, result.token, result.lease_id, result.valid_until
                )
                proof = self._proof(key, result.lease_id, result.token)
                self._live[key] = LiveGrant(
                    result.lease_id,
                    result.token,
                    choice.name,
                    choice.uid or None,
                    result.duration,
                    result.valid_until,
                    proof,
                )
                status = project.granted(status, result, proof, self.wall())
                await self._event(
                    lease_ref(key.namespace, key.name, lease.uid),
                    "Normal",
                    "Granted",
                    f"granted to Pod {result.holder} with fencing token {result.token} "
                    f"(lease {result.lease_id}, valid until {rfc3339(result.valid_until)})",
                )
                return self._schedule(key, choice, result.duration), status
            case Busy():
                if not confirmed:
                    return None  # a record we did not know of: decide on a read
                # Another replica granted first (etcd's compare decided): follow its record.
                return max(0.1, result.remaining_seconds), status
            case Unavailable():
                return RETRY_UNAVAILABLE, await self._unavailable(lease, status, result)
        raise AssertionError(result)  # pragma: no cover

    def _candidate(
        self, key: LeaseKey, spec: FencedLeaseSpec, name: str, uid: str | None
    ) -> PodInfo | None:
        """Pod ``name`` as the cache has it now, if it is still an eligible candidate of the
        lease (and the Pod of ``uid``, when given); else ``None``."""
        pod = self.pods.get(key.namespace, name)
        if (
            pod is None
            or not pod.eligible
            or (uid is not None and pod.uid != uid)
            or not spec.holder_selector.matches(pod.labels)
        ):
            return None
        return pod

    async def _keep(
        self,
        lease: LeaseObject,
        view: LeaseView,
        status: FencedLeaseStatus,
        candidates: list[PodInfo],
    ) -> tuple[float | None, FencedLeaseStatus]:
        """A live generation exists: renew it while its holder is healthy, else let it lapse."""
        key = lease.key
        record = view.record
        # The grant belongs to the Pod it was made for: a Pod re-created under the same name
        # (a StatefulSet does exactly this) is a new candidate, not the holder.
        holder = next(
            (
                p
                for p in candidates
                if p.name == record.holder
                and (record.holder_uid is None or p.uid == record.holder_uid)
            ),
            None,
        )
        await self._mark_lost(key, keep=(record.holder, record.lease_id))
        proof = self._proof(key, record.lease_id, view.token)
        status = project.held(status, record, view.token, proof, self.wall())
        if holder is None or not holder.eligible:
            why = (
                "gone (or replaced by another Pod of the same name)"
                if holder is None
                else "not Ready, terminating or not Running"
            )
            status = project.not_renewing(
                status, record.holder, why, view.remaining_seconds, self.wall()
            )
            return view.remaining_seconds + 0.05, status
        now = self.clock()
        last = self._last_renewal.get(key)
        # The generation renews on the duration etcd granted it with (its holder's deadline
        # runs on it); a changed spec.leaseDurationSeconds takes effect at the next grant.
        interval = project.renew_interval(record.duration_seconds)
        if last is not None and now - last < interval:
            await self._annotate_if_missing(key, holder, view, status)
            return last + interval - now, status
        result = await self.store.renew(key.namespace, key.name, record.lease_id, view.token)
        match result:
            case Renewed():
                live = LiveGrant(
                    result.lease_id,
                    result.token,
                    holder.name,
                    record.holder_uid,
                    result.duration,
                    result.valid_until,
                    proof,
                )
                return await self._renewal_published(key, live, holder, status, result)
            case NotHeld():
                return 0.05, status  # changed under us: re-read and decide again
            case Unavailable():
                return RETRY_UNAVAILABLE, await self._unavailable(lease, status, result)
        raise AssertionError(result)  # pragma: no cover

    async def _renew_live(
        self, lease: LeaseObject, spec: FencedLeaseSpec, status: FencedLeaseStatus
    ) -> tuple[float | None, FencedLeaseStatus] | None:
        """The steady-state renewal: one etcd transaction and one Pod write, no read.

        Taken only when this replica granted or renewed the generation in its current term
        (:class:`LiveGrant`), its renewal is due, its holder Pod (same UID) is still an
        eligible candidate, nothing asks for a force release and no signed status shows a
        newer token. The store decides on its cached version and its compare checks it.
        ``None``: decide on a read instead (:meth:`_reconcile`), as for every pass that
        would write nothing to etcd, and for a renewal the store refused (``NotHeld``, which
        the store itself confirmed with a read)."""
        key = lease.key
        live = self._live.get(key)
        last = self._last_renewal.get(key)
        if live is None or last is None or lease.annotations.get(ANNOTATION_FORCE_RELEASE):
            return None
        due = self._due.get(key, last + project.renew_interval(live.duration))
        if self.clock() < due - DUE_SLACK:
            return None
        if live.token < self.leases.verified_token(key):
            return None
        holder = self._candidate(key, spec, live.holder, live.holder_uid)
        if holder is None:
            return None
        await self._mark_lost(key, keep=(live.holder, live.lease_id))
        pod = (holder.namespace, holder.name)
        self._in_etcd[pod] = self._in_etcd.get(pod, 0) + 1
        try:
            result = await self.store.renew(key.namespace, key.name, live.lease_id, live.token)
        finally:
            # Nothing below awaits before this renewal joins (or opens) its Pod's write.
            self._left_etcd(pod)
        match result:
            case Renewed():
                status = project.with_condition(
                    status, "EtcdAvailable", "True", "Connected", "", self.wall()
                )
                record = LeaseRecord(result.lease_id, result.holder, result.duration, result.token)
                status = project.held(status, record, result.token, live.proof, self.wall())
                return await self._renewal_published(key, live, holder, status, result)
            case NotHeld():
                self._forget_grant(key)
                return None
            case Unavailable():
                return RETRY_UNAVAILABLE, await self._unavailable(lease, status, result)
        raise AssertionError(result)  # pragma: no cover

    async def _renewal_published(
        self,
        key: LeaseKey,
        live: LiveGrant,
        holder: PodInfo,
        status: FencedLeaseStatus,
        result: Renewed,
    ) -> tuple[float | None, FencedLeaseStatus]:
        """A renewal committed: publish the holder's new deadline (one Pod write) and say
        whether the status records it (:func:`~.status.record_renewal`)."""
        now = self.clock()
        self._last_renewal[key] = now
        self._live[key] = live = replace(live, valid_until=result.valid_until)
        await self._publish_deadline(key, holder, live)
        record = project.record_renewal(self._recorded.get(key), now)
        status = project.renewed(status, result, self.wall(), record=record)
        return self._schedule(key, holder, live.duration), status

    def _schedule(self, key: LeaseKey, holder: PodInfo, duration: float) -> float:
        """The delay to this grant's next renewal, on its holder Pod's ticks
        (:func:`~.status.next_renewal`). ``duration`` is the live grant's, as etcd holds it
        (the holder's deadline runs on it), not the spec's: a changed
        ``leaseDurationSeconds`` applies from the next grant."""
        interval = project.renew_interval(duration)
        now = self.clock()
        tick = (holder.namespace, holder.name, interval)
        anchor = self._ticks.get(tick)
        if anchor is None:
            self._prune_ticks()
            anchor = self._ticks[tick] = project.tick_anchor(now)
        delay = project.next_renewal(now, anchor, interval)
        self._due[key] = now + delay
        return delay

    def _prune_ticks(self) -> None:
        """Drop the ticks of Pods gone from the cache (deleted, or out of the watch's scope)
        once the ticks outnumber the cached Pods twice: where holder Pods come and go (a job
        per Pod), one tick per Pod name ever used would grow without bound."""
        if len(self._ticks) > 2 * len(self.pods) + 64:
            self._ticks = {
                tick: anchor
                for tick, anchor in self._ticks.items()
                if self.pods.get(tick[0], tick[1]) is not None
            }

    async def _publish_deadline(self, key: LeaseKey, pod: PodInfo, live: LiveGrant) -> None:
        """The renewal's one API write: the holder Pod's ``valid-until`` alone when the Pod
        already shows this grant (token, lease id, ``held``), else all four annotations."""
        keys = pod_annotation_keys(key.name)
        shown = self.pods.get(pod.namespace, pod.name) or pod
        if (
            shown.annotations.get(keys["lease_id"]) == live.lease_id
            and shown.annotations.get(keys["token"]) == str(live.token)
            and shown.annotations.get(keys["state"]) == "held"
        ):
            await self._patch_pod_shared(
                pod,
                {keys["valid_until"]: rfc3339(live.valid_until)},
                wait=min(GATHER_LIMIT, project.renew_interval(live.duration) * GATHER_FRACTION),
            )
        else:
            await self._annotate_holder(key, pod, live.token, live.lease_id, live.valid_until)

    async def _end_restored_generation(
        self, lease: LeaseObject, view: LeaseView
    ) -> LeaseView | None:
        """A held generation in etcd older than one this lease already granted (its signed
        status showed a greater token) is what an etcd restored from an older snapshot holds:
        that generation ended long ago.  It is never renewed nor shown as Held again (its
        holder would be told to work under a token the resource already passed); it is ended
        in etcd, and the next grant goes through the restore guard like any other."""
        key = lease.key
        newest = self.leases.verified_token(key)
        if view.token >= newest:
            return view
        ended = await self.store.force_release(key.namespace, key.name, view.record.lease_id)
        if isinstance(ended, Unavailable):
            raise StoreUnavailable(ended.code, ended.reason)
        if isinstance(ended, Released):  # else our read predates a newer grant: nothing ended
            await self._event(
                lease_ref(key.namespace, key.name, lease.uid),
                "Warning",
                "RestoredGeneration",
                f"etcd holds lease {view.record.lease_id} (token {view.token}) of Pod "
                f"{view.record.holder}, older than token {newest} this lease already granted: "
                "etcd was restored from an older snapshot; that generation is ended, not renewed",
            )
        return await self.store.read(key.namespace, key.name)

    async def _force_release(
        self, lease: LeaseObject, view: LeaseView | None, lease_id: str
    ) -> tuple[LeaseView | None, str | None]:
        key = lease.key
        ref = lease_ref(key.namespace, key.name, lease.uid)
        result = await self.store.force_release(key.namespace, key.name, lease_id)
        excluded = None
        match result:
            case Released():
                metrics.FORCE_RELEASES.labels("released").inc()
                holder = view.record.holder if view is not None else "?"
                excluded = holder  # counted as a holder loss when its Pod is marked lost
                await self._event(
                    ref,
                    "Warning",
                    "ForceReleased",
                    f"lease {lease_id} of Pod {holder} force-released by an administrator; "
                    "the old holder is not stopped, only fenced by the newer token",
                )
                view = await self.store.read(key.namespace, key.name)
            case NotHeld():
                metrics.FORCE_RELEASES.labels("ignored").inc()
                await self._event(
                    ref,
                    "Warning",
                    "ForceReleaseIgnored",
                    f"force release of lease {lease_id} ignored: {result.reason}",
                )
            case Unavailable():
                raise StoreUnavailable(result.code, result.reason)
        version = await self.kube.patch_lease_annotations(
            key.namespace, key.name, {ANNOTATION_FORCE_RELEASE: None}
        )
        lease.annotations.pop(ANNOTATION_FORCE_RELEASE, None)
        if version is not None:
            lease.resource_version = version  # our own change: the status write follows it
        return view, excluded

    # ------------------------------------------------------------------------ helpers

    def _proof(self, key: LeaseKey, lease_id: str, token: int) -> str:
        return self.leases.proofs.sign(key.namespace, key.name, lease_id, token)

    async def _event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Log it and post it as a Kubernetes Event on the lease."""
        level = logging.INFO if type_ == "Normal" else logging.WARNING
        log.log(level, "%s/%s: %s: %s", ref.namespace, ref.name, reason, message)
        await self.kube.event(ref, type_, reason, message)

    async def _annotate_holder(
        self, key: LeaseKey, pod: PodInfo, token: int, lease_id: str, valid_until: dt.datetime
    ) -> None:
        await self._annotate(key, pod, token, lease_id, rfc3339(valid_until))

    async def _annotate(
        self, key: LeaseKey, pod: PodInfo, token: int, lease_id: str, valid_until: str
    ) -> None:
        keys = pod_annotation_keys(key.name)
        await self._patch_pod(
            pod,
            {
                keys["token"]: str(token),
                keys["lease_id"]: lease_id,
                keys["valid_until"]: valid_until,
                keys["state"]: "held",
            },
        )

    def _left_etcd(self, pod: tuple[str, str]) -> None:
        """A read-free renewal of a lease held by ``pod`` is out of its etcd call: once none
        is left in one, the Pod's waiting deadline write goes out."""
        left = self._in_etcd[pod] - 1
        if left:
            self._in_etcd[pod] = left
            return
        del self._in_etcd[pod]
        batch = self._batches.get(pod)
        if batch is not None and batch.gathered is not None and not batch.gathered.done():
            batch.gathered.set_result(None)

    async def _patch_pod_shared(
        self, pod: PodInfo, annotations: dict[str, str | None], *, wait: float = 0.0
    ) -> bool:
        """Renewed deadlines of leases held by one Pod share one write: a renewal that finds
        a write to its Pod not yet sent joins it and gets its result; otherwise it opens one.
        The opened write first waits while read-free renewals of leases held by that Pod are
        in their etcd call (they come due on the Pod's ticks together): they join it as they
        commit, so a Pod holding many leases is written once per tick rather than once per
        wave of etcd replies. The wait ends when the last of them commits or fails, or after
        ``wait`` seconds (a tenth of the renew interval, :data:`GATHER_FRACTION`) from its
        opening, the smallest ``wait`` of the renewals in it: one that joins with a smaller
        bound than the opener's shortens the wait to it (or ends it, once that much passed),
        so no renewal's deadline waits longer than its own bound. Until then the holder keeps
        reading its previous deadline, which is earlier. The write is
        :meth:`_patch_pod`'s (conditional, gated, UID-bound); a batch closes when the write
        gets the Pod's turn, so nothing joins after it is sent."""
        key = (pod.namespace, pod.name)
        batch = self._batches.get(key)
        if batch is not None and batch.uid == pod.uid:
            batch.annotations.update(annotations)
            batch.joined += 1
            self._bound_gather(batch, wait)
            return await asyncio.shield(batch.done)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        opened = self.clock()
        batch = self._batches[key] = _DeadlineBatch(
            pod.uid, dict(annotations), done, opened, opened + max(wait, 0.0)
        )

        def close() -> None:
            if self._batches.get(key) is batch:
                del self._batches[key]

        try:
            if wait > 0 and self._in_etcd.get(key):
                batch.gathered = loop.create_future()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait) as timer:
                        batch.timer = timer
                        try:
                            await batch.gathered
                        finally:
                            batch.timer = None
            ok = await self._patch_pod(pod, batch.annotations, on_turn=close)
        except BaseException as exc:
            close()
            if batch.joined:
                if isinstance(exc, Exception):
                    done.set_exception(exc)  # NotLeader, an API error: every pass sees it
                else:  # the opener was cancelled: the joiners' deadlines were not written
                    done.set_result(False)
            raise
        close()
        done.set_result(ok)
        return ok

    def _bound_gather(self, batch: _DeadlineBatch, wait: float) -> None:
        """A renewal joined ``batch`` with its own bound ``wait``: the batch's wait ends no
        later than that long after the batch opened (at once, if that time has passed)."""
        until = batch.opened + max(wait, 0.0)
        if until >= batch.until:
            return
        batch.until = until
        timer, gathered = batch.timer, batch.gathered
        if timer is None or gathered is None:
            return  # not waiting: nothing to shorten
        # Not while the wait is ending anyway (timed out, or the Pod's last renewal left
        # etcd): an expiring timeout cannot be moved.
        if not timer.expired() and not gathered.done():
            left = max(0.0, until - self.clock())
            timer.reschedule(asyncio.get_running_loop().time() + left)

    async def _patch_pod(
        self,
        pod: PodInfo,
        annotations: dict[str, str | None],
        on_turn: Callable[[], None] | None = None,
    ) -> bool:
        """Annotate ``pod``, each attempt conditional on a version read *before* the
        leadership gate that attempt passes (``docs/operations.md``, "Controller failover").

        A replica paused between its gate and the request sends a version its successor has
        since moved (the successor annotates every Pod whose state it changes): the API
        server refuses it, the re-read's attempt meets the gate again, and a replica whose
        term ended writes nothing. A version moved by the kubelet costs one re-read. A Pod
        re-created under the same name (another uid) is not annotated. This process's writes
        to one Pod (one Pod may hold many leases) take turns, each from the version the one
        before it made (kept in the Pod cache). ``False``: not written (gone, replaced, or
        still changing after :data:`POD_WRITE_ATTEMPTS`)."""
        key = (pod.namespace, pod.name)
        lock = self._pod_locks.get(key)
        if lock is None:
            lock = self._pod_locks[key] = asyncio.Lock()
        async with lock:
            if on_turn is not None:
                on_turn()
            current: PodInfo | None = self.pods.get(pod.namespace, pod.name) or pod
            for _ in range(POD_WRITE_ATTEMPTS):
                if current is None or (pod.uid and current.uid != pod.uid):
                    return False
                version = await self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, annotations, current.resource_version
                )
                if version is not None:
                    merged = {**current.annotations, **annotations}
                    written = {k: v for k, v in merged.items() if v is not None}
                    self.pods.refresh(
                        replace(current, annotations=written, resource_version=version)
                    )
                    return True
                body = await self.kube.read_pod(pod.namespace, pod.name)
                current = None if body is None else PodInfo.from_body(body)
                if current is None or (pod.uid and current.uid != pod.uid):
                    self.pods.gone(pod.namespace, pod.name, pod.uid)
        log.warning(
            "%s/%s: not annotated: the Pod changed under %d attempts",
            pod.namespace,
            pod.name,
            POD_WRITE_ATTEMPTS,
        )
        return False

    async def _annotate_if_missing(
        self, key: LeaseKey, pod: PodInfo, view: LeaseView, status: FencedLeaseStatus
    ) -> None:
        """After a restart or a lost patch, make sure the holder reads its current grant."""
        keys = pod_annotation_keys(key.name)
        if (
            pod.annotations.get(keys["lease_id"]) == view.record.lease_id
            and pod.annotations.get(keys["state"]) == "held"
        ):
            return
        live = self._live.get(key)
        if live is not None and live.lease_id == view.record.lease_id:
            until = rfc3339(live.valid_until)
        else:  # granted or renewed in an earlier term: no deadline we can vouch for yet
            until = rfc3339(self.wall())
        await self._annotate(key, pod, view.token, view.record.lease_id, until)

    async def _mark_lost(
        self, key: LeaseKey, keep: tuple[str, str] | None, reason: str = "handed_over"
    ) -> None:
        """Every Pod that reads ``held`` for this lease but is not the live holder → ``lost``.

        The token and lease id stay: a former holder may still read what it had.
        """
        keys = pod_annotation_keys(key.name)
        for pod in self.pods.annotated(key.namespace, key.name):
            if pod.annotations.get(keys["state"]) != "held":
                continue
            if keep is not None and (pod.name, pod.annotations.get(keys["lease_id"])) == keep:
                continue
            if await self._patch_pod(pod, {keys["state"]: "lost"}):
                metrics.HOLDER_LOSSES.labels(reason).inc()

    async def _report_unverified(self, lease: LeaseObject) -> None:
        """A status token without the authority's proof, or a status that does not parse:
        say so once per forgery, never trust it (this pass writes the status from etcd)."""
        found = self.leases.unverified(lease.key)
        if found is None:
            self._reported_unverified.pop(lease.key, None)
            return
        if self._reported_unverified.get(lease.key) == found:
            return
        self._reported_unverified[lease.key] = found
        metrics.UNVERIFIED_TOKENS.labels("lease_status").inc()
        if found.error is None:
            message = (
                f"status.fencingToken {found.token} does not carry this operator's proof "
                "(written by someone else, signed with another key, or by a version without "
                "proofs): the restore guard ignores it and this pass writes the signed grant "
                "from etcd"
            )
        else:
            shown = "" if found.token is None else f" (it shows fencingToken {found.token})"
            message = (
                f"the status does not parse{shown}: {found.error}; none of it is trusted "
                "(written by someone else, or let in by an older CRD) and this pass writes "
                "the signed grant from etcd"
            )
        await self._event(
            lease_ref(lease.namespace, lease.name, lease.uid), "Warning", "UnverifiedToken", message
        )

    async def _unavailable(
        self, lease: LeaseObject, status: FencedLeaseStatus, result: Unavailable
    ) -> FencedLeaseStatus:
        status, reason = project.unavailable(status, result, self.wall())
        if reason is not None:
            ref = lease_ref(lease.namespace, lease.name, lease.uid)
            await self._event(ref, "Warning", reason, result.reason)
        return status

    async def _report_invalid(
        self, lease: LeaseObject, current: FencedLeaseStatus, error: str
    ) -> None:
        status = project.invalid_spec(current, lease.generation, error, self.wall())
        await self._write_status(lease, current, status)
        if self._reported_spec_error.get(lease.key) != lease.generation:
            self._reported_spec_error[lease.key] = lease.generation
            await self._event(
                lease_ref(lease.namespace, lease.name, lease.uid), "Warning", "InvalidSpec", error
            )

    async def _write_status(
        self, lease: LeaseObject, current: FencedLeaseStatus, status: FencedLeaseStatus
    ) -> bool:
        """``True`` when ``status`` was written (``False``: unchanged, or the lease moved)."""
        if status == current:
            return False
        # Conditional on the version this pass decided from: a replica paused between its
        # leadership check and this write (SIGSTOP, a GC pause) finds the version moved on
        # and writes nothing from its outdated view. The next pass writes from the new one.
        version = await self.kube.patch_lease_status(
            lease.namespace, lease.name, status.to_patch(), lease.resource_version
        )
        if version is None:
            log.debug(
                "%s/%s: status not written: the lease changed since version %s",
                lease.namespace,
                lease.name,
                lease.resource_version,
            )
            return False
        lease.resource_version = version
        self.leases.written(lease.key, status)
        return True
