"""Reconcile one FencedLease: grant, renew, expire, hand over, annotate Pods, project status.

The decisions are the grant authority's (``fencedlease.authority``) and the pure holder
choice (:func:`choose_holder`); this module only sequences store calls and Kubernetes writes.
Each run returns when it wants to run again (renewal or expiry due), so one scheduler drives
every lease.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from fencedlease import metrics
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import (
    Acquired,
    Busy,
    EndedBy,
    LeaseKey,
    LeaseState,
    LeaseView,
    NotHeld,
    Released,
    Renewed,
    StoreUnavailable,
    Unavailable,
)
from fencedlease.controller.kube import KubeClient, ObjectRef, lease_ref
from fencedlease.controller.pods import PodCache, PodInfo, choose_holder
from fencedlease.models import (
    ANNOTATION_FORCE_RELEASE,
    FencedLeaseSpec,
    FencedLeaseStatus,
    Phase,
    parse_spec,
    pod_annotation_keys,
    rfc3339,
    set_condition,
)
from fencedlease.store.etcd import EtcdStore

log = logging.getLogger(__name__)

RENEW_FRACTION = 1 / 3  # renew when a third of the lease duration has passed
RETRY_UNAVAILABLE = 5.0  # seconds between attempts while etcd or the restore guard says no


@dataclass
class LeaseObject:
    """The controller's copy of one FencedLease (from the watch)."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: FencedLeaseSpec | str  # a parsed spec, or the user-facing error
    status: FencedLeaseStatus
    annotations: dict[str, str] = field(default_factory=dict)
    deleting: bool = False

    @property
    def key(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> LeaseObject:
        meta = body.get("metadata") or {}
        raw_status = dict(body.get("status") or {})
        raw_status.pop("kopf", None)
        try:
            status = FencedLeaseStatus.model_validate(raw_status)
        except ValueError:
            status = FencedLeaseStatus()
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            generation=int(meta.get("generation") or 0),
            spec=parse_spec(FencedLeaseSpec, body.get("spec")),
            status=status,
            annotations=dict(meta.get("annotations") or {}),
            deleting=meta.get("deletionTimestamp") is not None,
        )


class LeaseCache:
    """FencedLeases by key, and the highest *verified* token they show (restore-guard floor).

    A status token counts only when it carries the authority's proof (``tokenProof``): anyone
    allowed to patch ``fencedleases/status`` could otherwise stop every grant in the cluster
    with one huge number.  Unverified tokens above the floor are kept for reporting.
    """

    def __init__(self, proofs: TokenProofs) -> None:
        self.proofs = proofs
        self._leases: dict[LeaseKey, LeaseObject] = {}
        self._written: dict[LeaseKey, FencedLeaseStatus] = {}
        self._unverified: dict[LeaseKey, int] = {}
        self.max_token = 0

    def upsert(self, lease: LeaseObject) -> None:
        self._leases[lease.key] = lease
        status = lease.status
        token = status.fencing_token
        if token is None:
            self._unverified.pop(lease.key, None)
        elif self.proofs.verify(
            lease.namespace, lease.name, status.lease_id, token, status.token_proof
        ):
            self._unverified.pop(lease.key, None)
            self.see_token(token)
        else:
            # Someone else wrote the status: forget ours so the next pass starts from what
            # the API shows and puts the signed truth back.
            self._unverified[lease.key] = token
            self._written.pop(lease.key, None)

    def unverified(self, key: LeaseKey) -> int | None:
        """The token lease ``key``'s status shows without a valid proof (``None``: none)."""
        return self._unverified.get(key)

    def remove(self, key: LeaseKey) -> None:
        self._leases.pop(key, None)
        self._written.pop(key, None)
        self._unverified.pop(key, None)

    def status(self, key: LeaseKey) -> FencedLeaseStatus | None:
        """The status this process last wrote (newer than a watch event still in flight)."""
        lease = self._leases.get(key)
        return self._written.get(key) or (lease.status if lease is not None else None)

    def written(self, key: LeaseKey, status: FencedLeaseStatus) -> None:
        self._written[key] = status
        token = status.fencing_token
        if token is not None and self.proofs.verify(
            key.namespace, key.name, status.lease_id, token, status.token_proof
        ):
            self.see_token(token)

    def get(self, key: LeaseKey) -> LeaseObject | None:
        return self._leases.get(key)

    def see_token(self, token: int) -> None:
        self.max_token = max(self.max_token, token)

    def in_namespace(self, namespace: str) -> list[LeaseObject]:
        return [lease for key, lease in self._leases.items() if key.namespace == namespace]

    def __len__(self) -> int:
        return len(self._leases)

    def phases(self) -> dict[str, int]:
        counts = {phase.value: 0 for phase in Phase}
        for key in self._leases:
            status = self.status(key)
            if status is not None and status.phase is not None:
                counts[status.phase.value] += 1
        return counts


class LeaseReconciler:
    def __init__(
        self,
        store: EtcdStore,
        kube: KubeClient,
        pods: PodCache,
        leases: LeaseCache,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.store = store
        self.kube = kube
        self.pods = pods
        self.leases = leases
        self.clock = clock
        self.wall = wall
        self._last_renewal: dict[LeaseKey, float] = {}
        self._reported_spec_error: dict[LeaseKey, int] = {}
        self._reported_unverified: dict[LeaseKey, int] = {}

    # ----------------------------------------------------------------------- entry points

    async def reconcile(self, key: LeaseKey) -> float | None:
        """One pass over lease ``key``; returns seconds until the next pass is due."""
        lease = self.leases.get(key)
        if lease is None or lease.deleting:
            return None
        if isinstance(lease.spec, str):
            await self._report_invalid(lease, lease.spec)
            return None
        spec = lease.spec
        current = self.leases.status(key) or lease.status
        status = current.model_copy(deep=True)
        try:
            view = await self.store.read(key.namespace, key.name)
            status.conditions = self._cond(status, "EtcdAvailable", "True", "Connected", "")
            delay, status = await self._reconcile(lease, spec, view, status)
        except StoreUnavailable as exc:
            status = await self._unavailable(lease, status, Unavailable(exc.code, exc.reason))
            delay = RETRY_UNAVAILABLE
        status.observed_generation = lease.generation
        status.conditions = self._cond(status, "SpecValid", "True", "Valid", "")
        await self._report_unverified(lease, status)
        await self._write_status(lease, current, status)
        return delay

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
        for pod in self.pods.in_namespace(namespace):
            if any(k in pod.annotations for k in keys.values()):
                await self.kube.patch_pod_annotations(
                    namespace, pod.name, dict.fromkeys(keys.values())
                )
        self._last_renewal.pop(key, None)
        self.leases.remove(key)

    def priority(self, key: LeaseKey) -> int:
        """Scheduler priority: renewing a live grant (0) before granting or expiring (1)."""
        return 0 if key in self._last_renewal else 1

    # ------------------------------------------------------------------------ the pass

    async def _reconcile(
        self,
        lease: LeaseObject,
        spec: FencedLeaseSpec,
        view: LeaseView | None,
        status: FencedLeaseStatus,
    ) -> tuple[float | None, FencedLeaseStatus]:
        key = lease.key
        excluded: str | None = None
        forced = lease.annotations.get(ANNOTATION_FORCE_RELEASE)
        if forced:
            view, excluded = await self._force_release(lease, view, forced)

        candidates = self.pods.candidates(key.namespace, spec.holder_selector)
        held = view is not None and view.record.state is LeaseState.HELD and not view.expired

        if held:
            assert view is not None
            return await self._keep(lease, spec, view, status, candidates)

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
        self._last_renewal.pop(key, None)  # no live grant of ours to renew any more
        choice = choose_holder([p for p in candidates if p.name != excluded], None)
        if choice is None:
            choice = choose_holder(candidates, None)
        loss = "force_released" if excluded else "expired" if expired else "handed_over"
        await self._mark_lost(key, keep=None, reason=loss)
        if choice is None:
            if view is not None and view.record.state is LeaseState.HELD:
                ended = await self.store.expire(key.namespace, key.name, view.record.lease_id)
                if isinstance(ended, Unavailable):
                    return RETRY_UNAVAILABLE, await self._unavailable(lease, status, ended)
            return None, self._idle_status(status, lease, view)

        floor = self.leases.max_token
        result = await self.store.acquire(
            key.namespace,
            key.name,
            choice.name,
            spec.lease_duration_seconds,
            token_floor=floor,
            holder_uid=choice.uid,
        )
        match result:
            case Acquired():
                self._last_renewal[key] = self.clock()
                self.leases.see_token(result.token)
                await self._annotate_holder(
                    key,
                    choice,
                    result.token,
                    result.lease_id,
                    result.valid_until,
                )
                status.phase = Phase.HELD
                status.holder = result.holder
                self._set_grant(status, key, result.lease_id, result.token)
                status.acquire_time = rfc3339(result.acquired_at)
                status.renew_time = rfc3339(result.acquired_at)
                status.expire_time = rfc3339(result.valid_until)
                status.transitions = (status.transitions or 0) + 1
                status.conditions = self._cond(
                    status, "Held", "True", "Granted", f"held by Pod {result.holder}"
                )
                status.conditions = self._cond(status, "TokensMonotonic", "True", "AboveFloor", "")
                await self._event(
                    lease_ref(key.namespace, key.name, lease.uid),
                    "Normal",
                    "Granted",
                    f"granted to Pod {result.holder} with fencing token {result.token} "
                    f"(lease {result.lease_id}, valid until {rfc3339(result.valid_until)})",
                )
                return self._renew_delay(spec), status
            case Busy():
                # Another replica granted first (etcd's compare decided): follow its record.
                return max(0.1, result.remaining_seconds), status
            case Unavailable():
                return RETRY_UNAVAILABLE, await self._unavailable(lease, status, result)
        raise AssertionError(result)  # pragma: no cover

    async def _keep(
        self,
        lease: LeaseObject,
        spec: FencedLeaseSpec,
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
        status.phase = Phase.HELD
        if status.lease_id != record.lease_id:
            # Granted by another replica (or the status was lost): adopt it. Its exact grant
            # time is that replica's; the first time we saw it is the best we know.
            status.transitions = (status.transitions or 0) + (1 if status.lease_id else 0)
            status.acquire_time = rfc3339(self.wall())
        status.holder = record.holder
        self._set_grant(status, key, record.lease_id, view.token)
        if holder is None or not holder.eligible:
            why = (
                "gone (or replaced by another Pod of the same name)"
                if holder is None
                else "not Ready, terminating or not Running"
            )
            status.conditions = self._cond(
                status,
                "Held",
                "True",
                "HolderNotReady",
                f"Pod {record.holder} is {why}: not renewing; the lease expires in "
                f"{view.remaining_seconds:.1f}s",
            )
            return view.remaining_seconds + 0.05, status
        now = self.clock()
        last = self._last_renewal.get(key)
        interval = spec.lease_duration_seconds * RENEW_FRACTION
        if last is not None and now - last < interval:
            await self._annotate_if_missing(key, holder, view, status)
            return last + interval - now, status
        result = await self.store.renew(key.namespace, key.name, record.lease_id, view.token)
        match result:
            case Renewed():
                self._last_renewal[key] = self.clock()
                await self._annotate_holder(
                    key, holder, result.token, result.lease_id, result.valid_until
                )
                status.renew_time = rfc3339(result.renewed_at)
                status.expire_time = rfc3339(result.valid_until)
                status.conditions = self._cond(
                    status, "Held", "True", "Renewed", f"held by Pod {result.holder}"
                )
                return self._renew_delay(spec), status
            case NotHeld():
                return 0.05, status  # changed under us: re-read and decide again
            case Unavailable():
                return RETRY_UNAVAILABLE, await self._unavailable(lease, status, result)
        raise AssertionError(result)  # pragma: no cover

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
        await self.kube.patch_lease_annotations(
            key.namespace, key.name, {ANNOTATION_FORCE_RELEASE: None}
        )
        lease.annotations.pop(ANNOTATION_FORCE_RELEASE, None)
        return view, excluded

    # ------------------------------------------------------------------------ helpers

    async def _event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Log it and post it as a Kubernetes Event on the lease."""
        level = logging.INFO if type_ == "Normal" else logging.WARNING
        log.log(level, "%s/%s: %s: %s", ref.namespace, ref.name, reason, message)
        await self.kube.event(ref, type_, reason, message)

    def _renew_delay(self, spec: FencedLeaseSpec) -> float:
        return max(0.1, spec.lease_duration_seconds * RENEW_FRACTION)

    async def _annotate_holder(
        self, key: LeaseKey, pod: PodInfo, token: int, lease_id: str, valid_until: dt.datetime
    ) -> None:
        keys = pod_annotation_keys(key.name)
        await self.kube.patch_pod_annotations(
            key.namespace,
            pod.name,
            {
                keys["token"]: str(token),
                keys["lease_id"]: lease_id,
                keys["valid_until"]: rfc3339(valid_until),
                keys["state"]: "held",
            },
        )

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
        until = status.expire_time or rfc3339(self.wall())
        await self.kube.patch_pod_annotations(
            key.namespace,
            pod.name,
            {
                keys["token"]: str(view.token),
                keys["lease_id"]: view.record.lease_id,
                keys["valid_until"]: until,
                keys["state"]: "held",
            },
        )

    async def _mark_lost(
        self, key: LeaseKey, keep: tuple[str, str] | None, reason: str = "handed_over"
    ) -> None:
        """Every Pod that reads ``held`` for this lease but is not the live holder → ``lost``.

        The token and lease id stay: a former holder may still read what it had.
        """
        keys = pod_annotation_keys(key.name)
        for pod in self.pods.in_namespace(key.namespace):
            if pod.annotations.get(keys["state"]) != "held":
                continue
            if keep is not None and (pod.name, pod.annotations.get(keys["lease_id"])) == keep:
                continue
            if await self.kube.patch_pod_annotations(
                key.namespace, pod.name, {keys["state"]: "lost"}
            ):
                metrics.HOLDER_LOSSES.labels(reason).inc()
                self.pods.upsert(_with_annotation(pod, keys["state"], "lost"))

    def _set_grant(
        self, status: FencedLeaseStatus, key: LeaseKey, lease_id: str, token: int
    ) -> None:
        """Project a grant read from etcd into the status, signed (see ``LeaseCache``)."""
        status.lease_id = lease_id
        status.fencing_token = token
        status.token_proof = self.leases.proofs.sign(key.namespace, key.name, lease_id, token)

    async def _report_unverified(self, lease: LeaseObject, status: FencedLeaseStatus) -> None:
        """A status token without the authority's proof: say so once, never trust it."""
        token = self.leases.unverified(lease.key)
        if token is None or self._reported_unverified.get(lease.key) == token:
            return
        self._reported_unverified[lease.key] = token
        metrics.UNVERIFIED_TOKENS.labels("lease_status").inc()
        await self._event(
            lease_ref(lease.namespace, lease.name, lease.uid),
            "Warning",
            "UnverifiedToken",
            f"status.fencingToken {token} does not carry this operator's proof (written by "
            "someone else, or signed with another key): it is ignored by the restore guard",
        )

    def _idle_status(
        self, status: FencedLeaseStatus, lease: LeaseObject, view: LeaseView | None
    ) -> FencedLeaseStatus:
        if view is not None:
            self._set_grant(status, lease.key, view.record.lease_id, view.token)
        if view is None:
            status.phase = Phase.PENDING
            reason, msg = "NoCandidate", "no Running and Ready Pod matches spec.holderSelector"
        elif view.record.state is LeaseState.RELEASED and view.record.ended_by in (
            EndedBy.RELEASE,
            EndedBy.FORCE_RELEASE,
        ):
            status.phase = Phase.RELEASED
            reason, msg = "Released", f"lease {view.record.lease_id} was released"
        else:
            status.phase = Phase.EXPIRED
            reason, msg = "Expired", f"lease {view.record.lease_id} expired; no candidate"
        status.holder = None
        status.conditions = self._cond(status, "Held", "False", reason, msg)
        return status

    async def _unavailable(
        self, lease: LeaseObject, status: FencedLeaseStatus, result: Unavailable
    ) -> FencedLeaseStatus:
        ref = lease_ref(lease.namespace, lease.name, lease.uid)
        status.phase = Phase.UNAVAILABLE
        if result.code == "restore_guard":
            before = _condition_status(status, "TokensMonotonic")
            status.conditions = self._cond(
                status, "TokensMonotonic", "False", "RestoreGuard", result.reason
            )
            if before != "False":
                await self._event(ref, "Warning", "RestoreGuard", result.reason)
        else:
            before = _condition_status(status, "EtcdAvailable")
            status.conditions = self._cond(
                status, "EtcdAvailable", "False", "EtcdUnavailable", result.reason
            )
            if before != "False":
                await self._event(ref, "Warning", "EtcdUnavailable", result.reason)
        return status

    async def _report_invalid(self, lease: LeaseObject, error: str) -> None:
        current = self.leases.status(lease.key) or lease.status
        status = current.model_copy(deep=True)
        status.observed_generation = lease.generation
        status.conditions = self._cond(status, "SpecValid", "False", "InvalidSpec", error)
        await self._write_status(lease, current, status)
        if self._reported_spec_error.get(lease.key) != lease.generation:
            self._reported_spec_error[lease.key] = lease.generation
            await self._event(
                lease_ref(lease.namespace, lease.name, lease.uid), "Warning", "InvalidSpec", error
            )

    def _cond(
        self,
        status: FencedLeaseStatus,
        type_: str,
        value: Literal["True", "False", "Unknown"],
        reason: str,
        message: str,
    ) -> list[Any]:
        return set_condition(
            status.conditions,
            type_,
            value,
            reason,
            message,
            self.wall(),
            status.observed_generation,
        )

    async def _write_status(
        self, lease: LeaseObject, current: FencedLeaseStatus, status: FencedLeaseStatus
    ) -> None:
        if status == current:
            return
        if await self.kube.patch_lease_status(lease.namespace, lease.name, status.to_patch()):
            self.leases.written(lease.key, status)


def _condition_status(status: FencedLeaseStatus, type_: str) -> str | None:
    return next((c.status for c in status.conditions if c.type == type_), None)


def _with_annotation(pod: PodInfo, key: str, value: str) -> PodInfo:
    return replace(pod, annotations={**pod.annotations, key: value})
