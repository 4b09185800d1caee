"""Reconcile one FencedLease: grant, renew, expire, hand over, annotate Pods, project status.

The decisions are the grant authority's (``fencedlease.authority``), the pure holder choice
(:func:`~.pods.choose_holder`), the pure choice of the pass's next etcd step
(:func:`~.steps.next_step`) and the pure status projection (:mod:`.projection`); this module
only sequences store calls and Kubernetes writes, through the Protocols of :mod:`.ports`, with
the collaborators it is handed (built once by :func:`~.runtime.lease_reconciler`). Each run
returns when it wants to run again (renewal or expiry due), so one scheduler drives every
lease.

A pass (:meth:`LeaseReconciler.reconcile`) handles a deleted or deleting lease and an invalid
spec, else drives the grant in etcd (:meth:`~LeaseReconciler._drive_grant`: the steps
:func:`~.steps.next_step` names — renew this term's live grant without a read, grant a lease
never granted without a read, or decide on a read, :meth:`~LeaseReconciler._decide`: keep a
live generation or let it lapse, else hand over and grant), then writes the finalizer, the
Events and the status. Beside it: what it remembers between passes (:mod:`.grants`), its Pod
writes (:mod:`.podwrites`), its Events (:mod:`.reports`), force releases and restored
generations (:mod:`.endings`), holder releases (:mod:`.releases`), claimed items
(:mod:`.claims`) and a lease's deletion and finalizer (:mod:`.deletions`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from fencedlease.authority.types import (
    Acquired,
    Busy,
    LeaseKey,
    LeaseRecord,
    LeaseState,
    LeaseView,
    NotHeld,
    Renewed,
    StoreUnavailable,
)
from fencedlease.controller import projection
from fencedlease.controller.claims import Claims
from fencedlease.controller.deletions import Deletions
from fencedlease.controller.endings import Endings
from fencedlease.controller.grants import LiveGrant, Memories, RenewalTicks
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo, choose_holder
from fencedlease.controller.podwrites import PodWrites
from fencedlease.controller.ports import LeaseStore, LeaseWrites
from fencedlease.controller.releases import HolderReleases, loss_reason
from fencedlease.controller.reports import LeaseEvents
from fencedlease.controller.steps import Facts, Step, Unsettled, next_step
from fencedlease.models import (
    ANNOTATION_FORCE_RELEASE,
    FencedLeaseSpec,
    FencedLeaseStatus,
    pod_annotation_keys,
    rfc3339,
)

log = logging.getLogger(__name__)

Passed = tuple[float | None, FencedLeaseStatus]
"""A settled pass: seconds until the next one (``None``: none due) and the status decided."""


@dataclass(slots=True)
class SoFar:
    """One pass's status as decided so far: what a ``StoreUnavailable`` raised by its next
    store call is reported on."""

    status: FencedLeaseStatus


RENEW_FRACTION = projection.RENEW_FRACTION  # renew when a third of the lease duration has passed
RETRY_UNAVAILABLE = 5.0  # seconds between attempts while etcd or the restore guard says no
RECHOOSE = 0.05  # seconds until a pass whose chosen holder left meanwhile decides again


class LeaseReconciler:
    """One pass at a time per lease (the scheduler's rule), many leases concurrently."""

    def __init__(
        self,
        store: LeaseStore,
        kube: LeaseWrites,
        pods: PodCache,
        leases: LeaseCache,
        *,
        memory: Memories,
        ticks: RenewalTicks,
        writes: PodWrites,
        events: LeaseEvents,
        endings: Endings,
        releases: HolderReleases,
        claims: Claims,
        deletions: Deletions,
        clock: Callable[[], float],
        wall: Callable[[], dt.datetime],
        pod_scope: str | None = None,
    ) -> None:
        """Every collaborator is handed in, built once by :func:`lease_reconciler` (the
        controller's composition, :meth:`~.runtime.Controller.build`)."""
        self.store = store
        self.kube = kube
        self.pods = pods
        self.leases = leases
        self.pod_scope = pod_scope
        """The label selector the Pod watch is scoped to (``None``: every Pod), for messages."""
        self.clock = clock
        self.wall = wall
        self.memory = memory
        """Per lease: this term's live grant, and what was reported."""
        self.ticks = ticks
        """Per holder Pod: the grid its leases' renewals fall due on."""
        self.writes = writes
        """The Pod annotation writes (one at a time per Pod, renewed deadlines batched)."""
        self.events = events
        """The Events on leases, and what was said once."""
        self.endings = endings
        """Force releases, and generations an etcd restore brought back."""
        self.releases = releases
        """Holders giving their lease back (FencedRelease)."""
        self.claims = claims
        """Items claimed from code (FencedClaim): their leases, made from templates."""
        self.deletions = deletions
        """The lease finalizer, and the release that deleting a lease carries out."""

    # ----------------------------------------------------------------------- entry points

    async def reconcile(self, key: LeaseKey) -> float | None:
        """One pass over lease ``key``; returns seconds until the next pass is due."""
        lease = self.leases.get(key)
        if lease is None:
            await self.deletions.missing(key)
            lease = await self.claims.missing_lease(key)  # an item claimed: its lease, made
            if lease is None:
                return None
        if lease.deleting:
            await self.deletions.deleting(lease)
            return None
        if await self.claims.skip(lease):  # a template, or an item lease unclaimed: deleted
            return None
        current = self.leases.status(key) or lease.status
        status = current
        if isinstance(lease.spec, str):
            await self.deletions.ensure_finalizer(lease)
            await self._report_invalid(lease, current, lease.spec)
            return None
        so_far = SoFar(status)
        try:
            delay, status = await self._drive_grant(lease, lease.spec, so_far)
        except StoreUnavailable as exc:  # the one place a store that cannot decide is handled
            status = await self._unavailable(lease, so_far.status, exc)
            delay = RETRY_UNAVAILABLE
        # Claimants learn the grant first (it is committed in etcd); the writes below follow.
        delay = await self.claims.report(lease, status, delay)
        # The next pass is due ``delay`` from now (a renewal: on its holder's ticks): the
        # writes below (finalizer, Event, status) must not push it back, and the scheduler
        # counts the delay from when this returns, so their time comes off it.
        decided = self.clock()
        if not await self.deletions.ensure_finalizer(lease):
            return None  # deleted meanwhile: released and cleaned up, nothing to write
        status = projection.reconciled(status, lease.generation, self.wall())
        await self.events.unverified(lease, self.leases.unverified(lease.key))
        if (
            await self._write_status(lease, current, status)
            and status.renew_time != current.renew_time
        ):
            self.memory.status_recorded(key, self.clock())
        if delay is None:
            return None
        return max(0.0, delay - (self.clock() - decided))

    async def _drive_grant(
        self, lease: LeaseObject, spec: FencedLeaseSpec, so_far: SoFar
    ) -> Passed:
        """The etcd part of a pass: the steps :func:`~.steps.next_step` chooses, each on what
        the pass knows now (:meth:`_facts`), until one settles it."""
        tried: Step | None = None
        while True:
            step = next_step(tried, self._facts(lease, spec, so_far.status), self.clock())
            found = await self._take(step, lease, spec, so_far)
            if not isinstance(found, Unsettled):
                return found
            log.debug("%s: %s did not settle the pass: %s", lease.key, step.value, found.value)
            tried = step

    async def _take(
        self, step: Step, lease: LeaseObject, spec: FencedLeaseSpec, so_far: SoFar
    ) -> Passed | Unsettled:
        status = so_far.status
        if step is Step.RENEW:
            return await self._renew_live(lease, spec, status)
        if step is Step.GRANT_UNREAD:
            return await self._decide(lease, spec, None, status, so_far, step)
        view = await self.store.read(lease.namespace, lease.name)
        status = projection.with_condition(
            status, "EtcdAvailable", "True", "Connected", "", self.wall()
        )
        return await self._decide(lease, spec, view, status, so_far, step)

    def _facts(self, lease: LeaseObject, spec: FencedLeaseSpec, status: FencedLeaseStatus) -> Facts:
        """What :func:`~.steps.next_step` decides on, read from the caches and memory now."""
        key = lease.key
        term = self.memory.live(key)
        ending = bool(lease.annotations.get(ANNOTATION_FORCE_RELEASE)) or bool(
            self.releases.requests.pending(key)
        )
        verified = self.leases.verified_token(key)
        state = pod_annotation_keys(key.name)["state"]
        return Facts(
            due=None if term is None else term.next_due(),
            superseded=term is not None and term.grant.token < verified,
            holder_eligible=term is not None
            and self._candidate(key, spec, term.grant.holder, term.grant.holder_uid) is not None,
            ending_asked=ending,
            never_granted=(
                status.lease_id is None
                and status.fencing_token is None
                and term is None
                and not ending
                and verified == 0
                and self.leases.unverified(key) is None
                and not any(state in p.annotations for p in self.pods.annotated(*key))
            ),
        )

    def leadership_started(self) -> None:
        """A new term: what this process wrote or renewed in an earlier term may be stale."""
        self.memory.term_started()
        self.ticks.clear()
        self.leases.forget_written()

    def priority(self, key: LeaseKey) -> int:
        """Scheduler priority: renewing a live grant (0) before granting or expiring (1)."""
        return 0 if self.memory.live(key) is not None else 1

    def group(self, key: LeaseKey) -> str:
        """Scheduler group: the holder Pod of a live grant (``""`` for any other lease), so
        the renewals of the leases one Pod holds, due on its ticks together, run back to back
        and share its one deadline write (:meth:`~.podwrites.PodWrites.patch_shared`) rather
        than spread among other Pods' renewals over several writes."""
        grant = self.memory.grant(key)
        return "" if grant is None else f"{key.namespace}/{grant.holder}"

    # ------------------------------------------------------------------------ the pass

    async def _decide(
        self,
        lease: LeaseObject,
        spec: FencedLeaseSpec,
        view: LeaseView | None,
        status: FencedLeaseStatus,
        so_far: SoFar,
        step: Step,
    ) -> Passed | Unsettled:
        """Decide on ``view``. :attr:`Step.GRANT_UNREAD`: ``view`` was not read (a lease
        never granted); only a grant is made from it, anything else is
        :attr:`Unsettled.NOT_A_GRANT` (decide on a read)."""
        key = lease.key
        excluded: str | None = None
        forced = lease.annotations.get(ANNOTATION_FORCE_RELEASE)
        if forced:
            view, excluded = await self.endings.force_release(lease, view, forced)
        view, released = await self.releases.apply(lease, view)
        view, withdrawn = await self.claims.end_withdrawn(lease, view)

        if view is not None and view.record.state is LeaseState.HELD:
            newest = self.leases.verified_token(key)
            view = await self.endings.restored_generation(lease, view, newest)

        so_far.status = status
        # Pods that released it are passed over; an item's lease goes to its claimants only.
        pods = self.pods.candidates(key.namespace, spec.holder_selector)
        candidates = self.releases.candidates(key, self.claims.candidates(lease, pods))
        if view is not None and view.record.state is LeaseState.HELD and not view.expired:
            return await self._keep_or_lapse(lease, view, status, so_far, candidates)

        expired = view is not None and view.record.state is LeaseState.HELD
        if expired:  # held, but this replica saw its duration pass without renewal
            assert view is not None
            await self.events.post(
                lease,
                "Warning",
                "Expired",
                f"lease {view.record.lease_id} (token {view.token}) of Pod {view.record.holder} "
                f"expired without renewal",
            )
        self.memory.forget_grant(key)  # no live grant of ours to renew any more
        choice = choose_holder([p for p in candidates if p.name != excluded], None)
        if choice is None:
            choice = choose_holder(candidates, None)
        if choice is None and step is Step.GRANT_UNREAD:
            return Unsettled.NOT_A_GRANT
        loss = loss_reason(excluded, released or withdrawn, expired)
        await self.writes.mark_lost(key, keep=None, reason=loss)
        if choice is not None and self._candidate(key, spec, choice.name, choice.uid) is None:
            # The writes above let Pod events in: the chosen Pod left (a relist, a DELETED or
            # NotReady event), and that event poked this lease. A grant now would go to a Pod
            # that is no longer renewed, and hold the lease from the others for a duration.
            return RECHOOSE, status
        if choice is None:
            if view is not None and view.record.state is LeaseState.HELD:
                await self.store.expire(key.namespace, key.name, view.record.lease_id)
            proof = self._proof(key, view.record.lease_id, view.token) if view else None
            return None, projection.idle(status, view, proof, self.wall(), self.pod_scope)

        return await self._grant(lease, spec, choice, status, step)

    async def _grant(
        self,
        lease: LeaseObject,
        spec: FencedLeaseSpec,
        choice: PodInfo,
        status: FencedLeaseStatus,
        step: Step,
    ) -> Passed | Unsettled:
        """Grant lease ``lease`` to Pod ``choice`` (one etcd transaction decides), tell the
        Pod, and schedule its first renewal. :attr:`Unsettled.BUSY`: unread
        (:attr:`Step.GRANT_UNREAD`) and etcd holds a record we did not know of (decide on a
        read)."""
        key = lease.key
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
                status = projection.with_condition(
                    status, "EtcdAvailable", "True", "Connected", "", self.wall()
                )
                granted_at = self.clock()
                self.leases.see_token(result.token)
                await self.writes.announce(
                    key, choice, result.token, result.lease_id, rfc3339(result.valid_until)
                )
                proof = self._proof(key, result.lease_id, result.token)
                grant = LiveGrant(
                    result.lease_id,
                    result.token,
                    choice.name,
                    choice.uid or None,
                    result.duration,
                    result.valid_until,
                    proof,
                )
                self.memory.granted(key, grant, granted_at)
                status = projection.granted(status, result, proof, self.wall())
                await self.events.post(
                    lease,
                    "Normal",
                    "Granted",
                    f"granted to Pod {result.holder} with fencing token {result.token} "
                    f"(lease {result.lease_id}, valid until {rfc3339(result.valid_until)})",
                )
                return self._schedule(key, choice, result.duration), status
            case Busy():
                if step is Step.GRANT_UNREAD:
                    return Unsettled.BUSY  # a record we did not know of: decide on a read
                # Another replica granted first (etcd's compare decided): follow its record.
                return max(0.1, result.remaining_seconds), status
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
        # An item's lease: its Pod must still claim it.
        return pod if self.claims.allows(self.leases.get(key), pod.uid) else None

    async def _keep_or_lapse(
        self,
        lease: LeaseObject,
        view: LeaseView,
        status: FencedLeaseStatus,
        so_far: SoFar,
        candidates: list[PodInfo],
    ) -> Passed:
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
        await self.writes.mark_lost(key, keep=(record.holder, record.lease_id))
        proof = self._proof(key, record.lease_id, view.token)
        status = so_far.status = projection.held(status, record, view.token, proof, self.wall())
        if holder is None or not holder.eligible:
            why = (
                "gone (or replaced by another Pod of the same name)"
                if holder is None
                else "not Ready, terminating or not Running"
            )
            status = projection.not_renewing(
                status, record.holder, why, view.remaining_seconds, self.wall()
            )
            return view.remaining_seconds + 0.05, status
        now = self.clock()
        live = self.memory.live(key)
        last = None if live is None else live.renewed
        # The generation renews on the duration etcd granted it with (its holder's deadline
        # runs on it); a changed spec.leaseDurationSeconds takes effect at the next grant.
        interval = projection.renew_interval(record.duration_seconds)
        if last is not None and now - last < interval:
            await self._annotate_if_missing(key, holder, view, status)
            return last + interval - now, status
        result = await self.store.renew(key.namespace, key.name, record.lease_id, view.token)
        match result:
            case Renewed():
                grant = LiveGrant(
                    result.lease_id,
                    result.token,
                    holder.name,
                    record.holder_uid,
                    result.duration,
                    result.valid_until,
                    proof,
                )
                return await self._publish_renewal(key, grant, holder, status, result)
            case NotHeld():
                return 0.05, status  # changed under us: re-read and decide again
        raise AssertionError(result)  # pragma: no cover

    async def _renew_live(
        self, lease: LeaseObject, spec: FencedLeaseSpec, status: FencedLeaseStatus
    ) -> Passed | Unsettled:
        """The steady-state renewal (:attr:`Step.RENEW`): one etcd transaction and one Pod
        write, no read.

        Taken only when this replica granted or renewed the generation in its current term
        (:class:`LiveGrant`), its renewal is due, its holder Pod (same UID) is still an
        eligible candidate, nothing asks for a force release and no signed status shows a
        newer token (:func:`~.steps.renewable`). The store decides on its cached version and
        its compare checks it. :attr:`Unsettled.REFUSED`: the store refused it (``NotHeld``,
        which the store itself confirmed with a read): decide on a read."""
        key = lease.key
        term = self.memory.live(key)
        live = None if term is None else term.grant
        holder = None if live is None else self._candidate(key, spec, live.holder, live.holder_uid)
        assert live is not None and holder is not None, "chosen by next_step: renewable"
        await self.writes.mark_lost(key, keep=(live.holder, live.lease_id))
        # Nothing below awaits before this renewal joins (or opens) its Pod's write.
        with self.writes.renewing((holder.namespace, holder.name)):
            result = await self.store.renew(key.namespace, key.name, live.lease_id, live.token)
        match result:
            case Renewed():
                status = projection.with_condition(
                    status, "EtcdAvailable", "True", "Connected", "", self.wall()
                )
                record = LeaseRecord(result.lease_id, result.holder, result.duration, result.token)
                status = projection.held(status, record, result.token, live.proof, self.wall())
                return await self._publish_renewal(key, live, holder, status, result)
            case NotHeld():
                self.memory.forget_grant(key)
                return Unsettled.REFUSED
        raise AssertionError(result)  # pragma: no cover

    async def _publish_renewal(
        self,
        key: LeaseKey,
        live: LiveGrant,
        holder: PodInfo,
        status: FencedLeaseStatus,
        result: Renewed,
    ) -> Passed:
        """A renewal committed: publish the holder's new deadline (one Pod write) and say
        whether the status records it (:func:`~.projection.record_renewal`)."""
        now = self.clock()
        live = replace(live, valid_until=result.valid_until)
        self.memory.renewed(key, live, now)
        await self.writes.publish_deadline(key, holder, live)
        term = self.memory.live(key)
        record = projection.record_renewal(None if term is None else term.recorded, now)
        status = projection.renewed(status, result, self.wall(), record=record)
        return self._schedule(key, holder, live.duration), status

    def _schedule(self, key: LeaseKey, holder: PodInfo, duration: float) -> float:
        """The delay to this grant's next renewal, on its holder Pod's ticks
        (:func:`~.projection.next_renewal`). ``duration`` is the live grant's, as etcd holds it
        (the holder's deadline runs on it), not the spec's: a changed
        ``leaseDurationSeconds`` applies from the next grant."""
        interval = projection.renew_interval(duration)
        now = self.clock()
        anchor = self.ticks.anchor(holder.namespace, holder.name, interval, now)
        delay = projection.next_renewal(now, anchor, interval)
        self.memory.scheduled(key, now + delay)
        return delay

    # ------------------------------------------------------------------------ helpers

    def _proof(self, key: LeaseKey, lease_id: str, token: int) -> str:
        return self.leases.proofs.sign(key.namespace, key.name, lease_id, token)

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
        live = self.memory.grant(key)
        if live is not None and live.lease_id == view.record.lease_id:
            until = rfc3339(live.valid_until)
        else:  # granted or renewed in an earlier term: no deadline we can vouch for yet
            until = rfc3339(self.wall())
        await self.writes.announce(key, pod, view.token, view.record.lease_id, until)

    async def _unavailable(
        self, lease: LeaseObject, status: FencedLeaseStatus, result: StoreUnavailable
    ) -> FencedLeaseStatus:
        status, reason = projection.unavailable(status, result, self.wall())
        if reason is not None:
            await self.events.post(lease, "Warning", reason, result.reason)
        return status

    async def _report_invalid(
        self, lease: LeaseObject, current: FencedLeaseStatus, error: str
    ) -> None:
        status = projection.invalid_spec(current, lease.generation, error, self.wall())
        await self._write_status(lease, current, status)
        await self.events.invalid_spec(lease, error)

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
