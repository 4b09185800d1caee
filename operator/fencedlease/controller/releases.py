"""Holders giving their lease back: the FencedRelease objects the controller sees, and the
pass step that acts on them.

A holder Pod creates a FencedRelease naming the generation it holds (lease id and token);
the webhook admitted it only from that Pod (``webhook/releases.py``). The lease's next pass
(:meth:`HolderReleases.apply`, called by the reconciler before it decides) ends the generation
with the store's conditional release on that lease id and token, so a release of an older
generation changes nothing, and writes the outcome to the request's status. The releasing
Pod is then passed over for that lease while its FencedRelease exists
(:func:`~fencedlease.authority.handback.passed_over`); the next holder is chosen in the same
pass and granted a greater token at once, without waiting for expiry.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fencedlease import metrics
from fencedlease.authority import handback
from fencedlease.authority.handback import HolderRelease
from fencedlease.authority.types import (
    LeaseKey,
    LeaseView,
    NotHeld,
    Released,
)
from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.controller.ports import LeaseStore, ReleaseWrites
from fencedlease.controller.reports import LeaseEvents
from fencedlease.controller.requests import ByLease
from fencedlease.models import FencedReleaseSpec, parse_spec, rfc3339

log = logging.getLogger(__name__)


def release_from_body(body: Mapping[str, Any]) -> HolderRelease | None:
    """A FencedRelease as the controller keeps it (``None``: its spec does not parse, so it
    names nothing to act on; the CRD schema makes that rare)."""
    meta = body.get("metadata") or {}
    spec = parse_spec(FencedReleaseSpec, body.get("spec"))
    if isinstance(spec, str):
        return None
    phase = (body.get("status") or {}).get("phase")
    return HolderRelease(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        lease=spec.lease_ref.name,
        lease_id=spec.lease_id,
        token=spec.fencing_token,
        holder=spec.holder,
        holder_uid=spec.holder_uid,
        phase=phase if phase in ("Released", "Refused") else None,
    )


class ReleaseRequests(ByLease[HolderRelease]):
    """The FencedReleases of every lease, from the watch (and this process's own outcomes,
    which the watch confirms)."""

    def __init__(self) -> None:
        super().__init__(release_from_body, lambda r: LeaseKey(r.namespace, r.lease))

    def upsert(self, request: HolderRelease) -> bool:
        """Keep ``request``; ``True`` when it waits to be acted on."""
        known = self.known(request)
        if known is not None and known.phase is not None and request.phase is None:
            request = replace(request, phase=known.phase)  # our outcome, not yet in the watch
        self.put(request)
        return request.phase is None

    def pending(self, key: LeaseKey) -> list[HolderRelease]:
        """The releases of lease ``key`` not acted on yet, oldest name first."""
        return sorted((r for r in self.of(key) if r.phase is None), key=lambda r: r.name)

    def passed_over(self, key: LeaseKey) -> frozenset[str]:
        """The Pod UIDs not to choose for lease ``key`` (their release of it took effect)."""
        return handback.passed_over(self.of(key))

    def decided(self, request: HolderRelease, phase: str) -> None:
        self.update(replace(request, phase=phase))


class HolderReleases:
    """Acts on the pending releases of a lease, within its pass."""

    def __init__(
        self,
        store: LeaseStore,
        kube: ReleaseWrites | None,
        events: LeaseEvents,
        requests: ReleaseRequests,
        *,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.store = store
        self.kube = kube
        self.events = events
        self.requests = requests
        """The FencedReleases, kept by the watch (the composition hands the same registry to
        its handlers)."""
        self.wall = wall

    def candidates(self, key: LeaseKey, pods: list[PodInfo]) -> list[PodInfo]:
        """``pods`` without those whose release of lease ``key`` took effect (they are not
        chosen again unless they ask again)."""
        passed_over = self.requests.passed_over(key)
        return [p for p in pods if p.uid not in passed_over] if passed_over else pods

    async def apply(
        self, lease: LeaseObject, view: LeaseView | None
    ) -> tuple[LeaseView | None, bool]:
        """Act on each pending release of ``lease``: the view to decide on next, and whether
        one of them ended the generation (its holder is then passed over)."""
        key = lease.key
        ended = False
        for request in self.requests.pending(key):
            why = handback.refusal(view, request)
            if why is None:
                result = await self.store.release(
                    key.namespace, key.name, request.lease_id, request.token
                )
                match result:
                    case Released():
                        ended = True
                        view = await self.store.read(key.namespace, key.name)
                    case NotHeld():
                        why = result.reason
            await self._answer(lease, request, why)
        return view, ended

    async def _answer(self, lease: LeaseObject, request: HolderRelease, why: str | None) -> None:
        phase = "Refused" if why is not None else "Released"
        self.requests.decided(request, phase)
        metrics.HOLDER_RELEASES.labels(phase.lower()).inc()
        if why is None:
            await self.events.post(
                lease,
                "Normal",
                "Released",
                f"lease {request.lease_id} (token {request.token}) released by its holder Pod "
                f"{request.holder} (FencedRelease {request.name})",
            )
        else:
            log.info("%s/%s refused: %s", request.namespace, request.name, why)
        status: dict[str, Any] = {"phase": phase, "reason": (why or "")[:1024]}
        if why is None:
            status["releasedAt"] = rfc3339(self.wall())
        if self.kube is not None:
            await self.kube.patch_release_status(request.namespace, request.name, status)


def loss_reason(forced: str | None, released: bool, expired: bool) -> str:
    """Why the previous holder lost the lease (the ``holder_losses_total`` reason)."""
    if forced:
        return "force_released"
    return "released" if released else "expired" if expired else "handed_over"
