"""Claims: a worker Pod asks, from code, for the lease of one item (a FencedClaim), without a
FencedLease made beforehand per item.

A *template* is a FencedLease annotated ``fencedlease.io/claim-template: "true"``: it is never
granted itself; its spec (duration, fencing policy, holderSelector: who may hold items) is
what each item's lease copies. For a claim of item ``i`` under template ``t`` the controller
creates the FencedLease ``t-i`` (owned by the template, annotated with it) and grants it
like any lease, from etcd, with one restriction: only Pods with a live claim on the item are
candidates (and they must match the holderSelector). The grant, or who holds the item, is
written to each claim's status. A claim deleted (the item done, or given up) stops its Pod
being a candidate; an item lease left with no claim is deleted, which releases it through its
finalizer (its token records and mark stay in etcd for the retention window, so its old tokens
stay refused).

The webhook admits a claim only from the Pod it names (``webhook/claims.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fencedlease.authority.types import (
    LeaseKey,
    LeaseState,
    LeaseView,
    Released,
)
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.controller.ports import ClaimWrites, LeaseStore
from fencedlease.controller.requests import ByLease
from fencedlease.models import (
    ANNOTATION_CLAIM_TEMPLATE,
    GROUP,
    LABEL_TEMPLATE,
    VERSION,
    FencedClaimSpec,
    FencedLeaseStatus,
    Phase,
    parse_spec,
)

log = logging.getLogger(__name__)

UNCLAIMED_GRACE = 5.0
"""Seconds an item lease stays unclaimed before it is deleted: after a restart the watch may
show an item lease before the claims on it, and a held lease deleted then would end the
work of its holder."""


@dataclass(frozen=True, slots=True)
class Claim:
    """A FencedClaim as the controller keeps it, with the status last written to it."""

    namespace: str
    name: str
    template: str
    item: str
    holder: str
    holder_uid: str
    reported: tuple[Any, ...] = ()

    @property
    def lease(self) -> LeaseKey:
        return LeaseKey(self.namespace, f"{self.template}-{self.item}")


def claim_from_body(body: Mapping[str, Any]) -> Claim | None:
    """A FencedClaim (``None``: its spec does not parse, it names nothing)."""
    meta = body.get("metadata") or {}
    spec = parse_spec(FencedClaimSpec, body.get("spec"))
    if isinstance(spec, str):
        return None
    status = body.get("status") or {}
    reported = _status_key(status) if status.get("phase") else ()
    return Claim(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        spec.template_ref.name,
        spec.item,
        spec.holder,
        spec.holder_uid,
        reported,
    )


def _status_key(status: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(status.get(k) for k in ("phase", "leaseId", "fencingToken", "holder", "reason"))


def is_template(lease: LeaseObject) -> bool:
    return lease.annotations.get(ANNOTATION_CLAIM_TEMPLATE) == "true"


def template_of(lease: LeaseObject) -> str | None:
    """The template an item's lease was made from (``None``: not an item's lease)."""
    return lease.annotations.get(LABEL_TEMPLATE)


def claim_status(claim: Claim, lease: str, status: FencedLeaseStatus) -> dict[str, Any]:
    """What a claim's status says, from its item lease's status (pure)."""
    held = status.phase is Phase.HELD and status.holder is not None
    if held and status.holder == claim.holder:
        return {
            "phase": "Granted",
            "leaseName": lease,
            "leaseId": status.lease_id,
            "fencingToken": status.fencing_token,
            "holder": claim.holder,
            "reason": "",
        }
    if held:
        return {
            "phase": "Busy",
            "leaseName": lease,
            "leaseId": None,
            "fencingToken": None,
            "holder": status.holder,
            "reason": f"item {claim.item} is held by Pod {status.holder}",
        }
    return {
        "phase": "Pending",
        "leaseName": lease,
        "leaseId": None,
        "fencingToken": None,
        "holder": None,
        "reason": "",
    }


def item_lease_body(key: LeaseKey, template: LeaseObject) -> dict[str, Any]:
    """Item lease ``key``: the template's spec, owned by the template, annotated with it."""
    assert not isinstance(template.spec, str)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FencedLease",
        "metadata": {
            "name": key.name,
            "namespace": key.namespace,
            "labels": {LABEL_TEMPLATE: template.name},
            "annotations": {LABEL_TEMPLATE: template.name},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "FencedLease",
                    "name": template.name,
                    "uid": template.uid,
                }
            ],
        },
        "spec": template.spec.model_dump(by_alias=True, mode="json"),
    }


class ClaimRequests(ByLease[Claim]):
    """Every FencedClaim, by the item lease it asks for."""

    def __init__(self) -> None:
        super().__init__(claim_from_body, lambda c: c.lease)

    def upsert(self, claim: Claim) -> bool:
        """Keep ``claim``; ``True`` when its item lease should be looked at (a new claim)."""
        known = self.known(claim)
        if known is not None and known.holder_uid == claim.holder_uid:
            self.put(replace(claim, reported=claim.reported or known.reported))
            return False
        self.put(claim)
        return True

    def claimants(self, key: LeaseKey, template: str | None = None) -> frozenset[str]:
        """The UIDs of the Pods claiming item lease ``key`` (under ``template``, when given:
        ``a-b`` + ``c`` and ``a`` + ``b-c`` name the same lease, which belongs to the template
        it was made from)."""
        return frozenset(c.holder_uid for c in self.of(key) if template in (None, c.template))

    def reported(self, claim: Claim, status: dict[str, Any]) -> None:
        known = self.known(claim)
        if known is not None:
            self.put(replace(known, reported=_status_key(status)))


class Claims:
    """The pass steps of item leases: make them, restrict their candidates, report to the
    claims, and delete them once unclaimed."""

    def __init__(
        self,
        store: LeaseStore,
        kube: ClaimWrites | None,
        leases: LeaseCache,
        requests: ClaimRequests,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.kube = kube
        self.leases = leases
        self.clock = clock
        self.requests = requests
        """The FencedClaims, kept by the watch (the composition hands the same registry to its
        handlers)."""
        self._unclaimed: dict[LeaseKey, float] = {}

    async def missing_lease(self, key: LeaseKey) -> LeaseObject | None:
        """Item lease ``key`` does not exist but is claimed: create it from its template and
        return it (the pass goes on with it at once, without waiting for the watch). ``None``:
        not claimed, not a template (the claims are told), or one of that name is still being
        deleted (its DELETED event pokes the key again)."""
        claims = self.requests.of(key)
        if not claims or self.kube is None:
            return None
        template = self.leases.get(LeaseKey(key.namespace, claims[0].template))
        if template is None or not is_template(template) or isinstance(template.spec, str):
            why = (
                f"FencedLease {claims[0].template} is not a claim template (it needs the "
                f'annotation {ANNOTATION_CLAIM_TEMPLATE}: "true" and a valid spec)'
            )
            for claim in claims:
                await self._report(claim, {"phase": "Refused", "reason": why})
            return None
        created = await self.kube.create_lease(key.namespace, item_lease_body(key, template))
        if created is None:
            return None
        lease = LeaseObject.from_body(created)
        self.leases.upsert(lease)
        return lease

    async def end_withdrawn(
        self, lease: LeaseObject, view: LeaseView | None
    ) -> tuple[LeaseView | None, bool]:
        """An item's generation whose holder withdrew its claim (the item is done, or given
        up) ends now, with the conditional release on its lease id and token, so the next
        claimant is granted at once: the view to decide on next, and whether it ended."""
        if (
            template_of(lease) is None
            or view is None
            or view.record.state is not LeaseState.HELD
            or view.record.holder_uid in self.requests.claimants(lease.key, template_of(lease))
        ):
            return view, False
        key = lease.key
        result = await self.store.release(key.namespace, key.name, view.record.lease_id, view.token)
        return await self.store.read(key.namespace, key.name), isinstance(result, Released)

    def candidates(self, lease: LeaseObject, pods: Iterable[PodInfo]) -> list[PodInfo]:
        """An item lease's candidates are the Pods claiming it; any other lease's, all."""
        if template_of(lease) is None:
            return list(pods)
        claimants = self.requests.claimants(lease.key, template_of(lease))
        return [p for p in pods if p.uid in claimants]

    def allows(self, lease: LeaseObject | None, uid: str | None) -> bool:
        """May Pod ``uid`` hold ``lease``? (Of an item's lease: only while it claims it.)"""
        if lease is None or template_of(lease) is None:
            return True
        return uid in self.requests.claimants(lease.key, template_of(lease))

    async def skip(self, lease: LeaseObject) -> bool:
        """Not a lease to grant: a template, or an item lease nobody claimed for
        :data:`UNCLAIMED_GRACE` (deleted here; its finalizer's pass then releases it)."""
        if is_template(lease):
            return True
        key = lease.key
        template = template_of(lease)
        if template is None or self.requests.claimants(key, template):
            self._unclaimed.pop(key, None)
            return False
        since = self._unclaimed.setdefault(key, self.clock())
        if self.clock() - since < UNCLAIMED_GRACE:
            return False
        self._unclaimed.pop(key, None)
        if self.kube is not None:
            await self.kube.delete_lease(lease.namespace, lease.name)
        return True

    async def report(
        self, lease: LeaseObject, status: FencedLeaseStatus, delay: float | None
    ) -> float | None:
        """Tell each claim of item lease ``lease`` what its status says now; the delay to the
        lease's next pass (soon while it waits, unclaimed, to be deleted)."""
        template = template_of(lease)
        if template is None:
            return delay
        for claim in self.requests.of(lease.key):
            if claim.template == template:
                await self._report(claim, claim_status(claim, lease.name, status))
            else:
                why = f"FencedLease {lease.name} is an item of template {template}"
                await self._report(claim, {"phase": "Refused", "reason": why})
        if lease.key in self._unclaimed:
            return min(1.0, delay if delay is not None else 1.0)
        return delay

    async def _report(self, claim: Claim, status: dict[str, Any]) -> None:
        if claim.reported == _status_key(status) or self.kube is None:
            return
        if await self.kube.patch_claim_status(claim.namespace, claim.name, status):
            self.requests.reported(claim, status)
