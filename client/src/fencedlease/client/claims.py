"""Claim an item's lease from code (docs/client.md, "Claims"): per-item work without a
FencedLease made beforehand for each item.

A worker Pod creates a ``FencedClaim`` naming a *template* lease, an item and itself. The fence
webhook admits it only from that Pod's own Pod-bound token; the operator creates the item's
FencedLease (``<template>-<item>``) from the template and grants it, from etcd like any lease,
only to Pods that claim the item, then writes the grant into the claim's status. Publish under
it as under any lease (``Publisher.publish(..., lease=claimed.lease, token=claimed.token)``):
the fence applies. Delete the claim when the item is done (:meth:`Claimer.done`): the item's
lease is then released and deleted (its old tokens stay refused). Least privilege for the
worker: ``create``, ``get`` and ``delete`` on ``fencedclaims``.

Results, one per outcome:

=================  ================================================================
``Claimed``        this Pod holds the item's lease: ``lease``, ``lease_id``, ``token``
``ClaimBusy``      another Pod holds it (``holder``); this Pod's claim was withdrawn
``ClaimPending``   not granted within ``wait`` (the claim stays: call again, or ``done``)
``ClaimRefused``   the webhook refused the requester, or the template is not a template
``Unavailable``    the request could not be made (API or webhook unavailable)
=================  ================================================================

Like :mod:`.publish` and :mod:`.release`, the requests are planned without I/O (:func:`plan`,
:mod:`.podrequests`' with the withdrawal of a busy claim) and driven by :class:`Claimer` (sync)
and :class:`AsyncClaimer` (asyncio).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional, Union

from fencedlease.client import podrequests
from fencedlease.client.api import AsyncKubeClient, KubeClient, pod_path
from fencedlease.client.plans import Reply, Request, Step, drive, drive_async
from fencedlease.client.podrequests import C, Pending, PodRequest, Refused, Requester, Said
from fencedlease.client.results import Unavailable

CLAIMS = "fencedclaims"


@dataclass(frozen=True)
class Claimed(Said):
    """This Pod holds item ``item``'s lease ``lease`` (generation ``lease_id``, ``token``)."""

    says: ClassVar[str] = "claimed: item {item} (lease {lease}, token {token})"
    template: str
    item: str
    lease: str
    lease_id: str
    token: int
    name: str
    code: Literal["claimed"] = "claimed"


@dataclass(frozen=True)
class ClaimBusy(Said):
    """Another Pod holds the item; this Pod's claim was withdrawn."""

    says: ClassVar[str] = "busy: item {item} is held by Pod {holder}"
    item: str
    holder: str
    code: Literal["busy"] = "busy"


class ClaimPending(Pending):
    """Not granted within ``wait``; the claim stays."""

    __slots__ = ()
    kind = "FencedClaim"
    waiting = "not granted yet"


class ClaimRefused(Refused):
    """Refused: ``reason`` is the webhook's code, or ``template`` (not a claim template)."""

    __slots__ = ()


ClaimResult = Union[Claimed, ClaimBusy, ClaimPending, ClaimRefused, Unavailable]
Plan = Generator[Step, Optional[Reply], ClaimResult]


def claim_path(namespace: str, name: str | None = None) -> str:
    return podrequests.request_path(CLAIMS, namespace, name)


@dataclass(frozen=True)
class ClaimRequest(PodRequest[ClaimResult]):
    """Claim ``item`` under ``template`` as Pod ``pod`` (UID ``pod_uid``); one claim per item
    and Pod (``name``): claiming again is the same request."""

    template: str
    item: str
    pod: str
    pod_uid: str
    namespace: str
    wait: float = 30.0
    poll: float = 0.05
    kind: ClassVar[str] = "FencedClaim"
    named: ClassVar[str] = "{template}-{item}.{pod_uid}"
    refused_as = ClaimRefused
    pending_as = ClaimPending

    @property
    def lease(self) -> str:
        return f"{self.template}-{self.item}"

    def body(self) -> dict[str, Any]:
        labels = {"fencedlease.io/template": self.template}
        return self.owned(labels, {"templateRef": {"name": self.template}, "item": self.item})

    def answer(self, reply: Reply) -> ClaimResult | None:
        status = podrequests.status(reply)
        phase = status.get("phase")
        if phase == "Granted" and isinstance(status.get("fencingToken"), int):
            lease = str(status.get("leaseName") or self.lease)
            token = int(status["fencingToken"])
            lease_id = str(status.get("leaseId"))
            return Claimed(self.template, self.item, lease, lease_id, token, self.name)
        if phase == "Busy":
            return ClaimBusy(self.item, str(status.get("holder") or "?"))
        if phase == "Refused":
            return ClaimRefused("template", str(status.get("reason") or "refused"))
        return None


def plan(req: ClaimRequest) -> Plan:
    """Create the claim (an existing one is the same claim), read its status until it is
    granted, busy (then withdraw it) or refused, or ``wait`` passed."""
    answer = yield from podrequests.plan(req)
    if isinstance(answer, ClaimBusy):
        yield Request("DELETE", req.path(req.name))
    return answer


class _Claims(Requester[C]):
    pod_at_start = True

    def _request(self, template: str, item: str, ns: str, wait: float, uid: str) -> ClaimRequest:
        self.pod_uid = uid
        return ClaimRequest(
            template, item, pod=self._where(ns)[1], pod_uid=uid, namespace=ns, wait=wait
        )


class Claimer(_Claims[KubeClient]):
    """Claims items (sync). ``pod``/``pod_uid``: this Pod (default: ``POD_NAME`` or
    ``HOSTNAME``, and ``POD_UID``, else a read of this Pod)."""

    new_client = KubeClient

    def _uid(self, ns: str) -> str:
        return self.pod_uid or podrequests.pod_uid(self.client.get(pod_path(*self._where(ns))))

    def claim(
        self, template: str, item: str, *, namespace: str | None = None, wait: float = 30.0
    ) -> ClaimResult:
        """Claim ``item`` under template lease ``template``."""
        ns = self._where(namespace)[0]
        req = self._request(template, item, ns, wait, self._uid(ns))
        return drive(plan(req), self.client)

    def done(self, template: str, item: str, *, namespace: str | None = None) -> bool:
        """The item is done (or given up): delete this Pod's claim (``True`` if it existed)."""
        ns = self._where(namespace)[0]
        req = self._request(template, item, ns, 0, self._uid(ns))
        return podrequests.withdrawn(self.client.request("DELETE", req.path(req.name)))


class AsyncClaimer(_Claims[AsyncKubeClient]):
    """Claims items (asyncio); same semantics as :class:`Claimer`."""

    new_client = AsyncKubeClient

    async def _uid(self, ns: str) -> str:
        return self.pod_uid or podrequests.pod_uid(
            await self.client.get(pod_path(*self._where(ns)))
        )

    async def claim(
        self, template: str, item: str, *, namespace: str | None = None, wait: float = 30.0
    ) -> ClaimResult:
        """See :meth:`Claimer.claim`."""
        ns = self._where(namespace)[0]
        req = self._request(template, item, ns, wait, await self._uid(ns))
        return await drive_async(plan(req), self.client)

    async def done(self, template: str, item: str, *, namespace: str | None = None) -> bool:
        """See :meth:`Claimer.done`."""
        ns = self._where(namespace)[0]
        req = self._request(template, item, ns, 0, await self._uid(ns))
        return podrequests.withdrawn(await self.client.request("DELETE", req.path(req.name)))
