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

Like :mod:`.publish` and :mod:`.release`, the requests are planned without I/O (:func:`plan`)
and driven by :class:`Claimer` (sync) and :class:`AsyncClaimer` (asyncio).
"""

from __future__ import annotations

import math
import os
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

from fencedlease.client import podrequests
from fencedlease.client._contract import GROUP, VERSION
from fencedlease.client.api import AsyncKubeClient, KubeClient, Reply, pod_path
from fencedlease.client.grant import own_pod
from fencedlease.client.plans import Request, Sleep, drive, drive_async
from fencedlease.client.podrequests import Pending, Refused, pod_owned, pod_uid, withdrawn
from fencedlease.client.results import Unavailable

CLAIMS = "fencedclaims"


@dataclass(frozen=True, slots=True)
class Claimed:
    """This Pod holds item ``item``'s lease ``lease`` (generation ``lease_id``, ``token``)."""

    template: str
    item: str
    lease: str
    lease_id: str
    token: int
    name: str
    code: Literal["claimed"] = "claimed"

    @property
    def message(self) -> str:
        return f"claimed: item {self.item} (lease {self.lease}, token {self.token})"


@dataclass(frozen=True, slots=True)
class ClaimBusy:
    """Another Pod holds the item; this Pod's claim was withdrawn."""

    item: str
    holder: str
    code: Literal["busy"] = "busy"

    @property
    def message(self) -> str:
        return f"busy: item {self.item} is held by Pod {self.holder}"


class ClaimPending(Pending):
    """Not granted within ``wait``; the claim stays."""

    __slots__ = ()
    kind = "FencedClaim"
    waiting = "not granted yet"


class ClaimRefused(Refused):
    """Refused: ``reason`` is the webhook's code, or ``template`` (not a claim template)."""

    __slots__ = ()


ClaimResult = Claimed | ClaimBusy | ClaimPending | ClaimRefused | Unavailable
Plan = Generator[Request | Sleep, Reply | None, ClaimResult]


def claim_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{CLAIMS}"
    return f"{base}/{name}" if name else base


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Claim ``item`` under ``template`` as Pod ``pod`` (UID ``pod_uid``)."""

    template: str
    item: str
    pod: str
    pod_uid: str
    namespace: str
    wait: float = 30.0
    poll: float = 0.05

    @property
    def lease(self) -> str:
        return f"{self.template}-{self.item}"

    @property
    def name(self) -> str:
        """One claim per item and Pod: claiming again is the same request."""
        return f"{self.lease}.{self.pod_uid}"

    def body(self) -> dict[str, Any]:
        labels = {"fencedlease.io/template": self.template}
        spec = {"templateRef": {"name": self.template}, "item": self.item}
        return pod_owned(
            "FencedClaim", self.name, self.namespace, labels, self.pod, self.pod_uid, spec
        )


def _answered(req: ClaimRequest, obj: Any) -> ClaimResult | None:
    status = (obj.get("status") if isinstance(obj, dict) else None) or {}
    match status.get("phase"):
        case "Granted" if isinstance(status.get("fencingToken"), int):
            return Claimed(
                req.template,
                req.item,
                str(status.get("leaseName") or req.lease),
                str(status.get("leaseId")),
                int(status["fencingToken"]),
                req.name,
            )
        case "Busy":
            return ClaimBusy(req.item, str(status.get("holder") or "?"))
        case "Refused":
            return ClaimRefused("template", str(status.get("reason") or "refused"))
    return None


def plan(req: ClaimRequest) -> Plan:
    """Create the claim (an existing one is the same claim), read its status until it is
    granted, busy (then withdraw it) or refused, or ``wait`` passed."""
    created = yield Request("POST", claim_path(req.namespace), req.body())
    assert created is not None
    if not created.ok and created.status_code != 409:
        return podrequests.refusal(created, ClaimRefused)
    answer = _answered(req, created.body) if created.ok else None
    for _ in range(max(0, math.ceil(req.wait / req.poll))):
        if answer is not None:
            break
        yield Sleep(req.poll)
        read = yield Request("GET", claim_path(req.namespace, req.name))
        assert read is not None
        answer = _answered(req, read.body) if read.ok else None
    if isinstance(answer, ClaimBusy):
        yield Request("DELETE", claim_path(req.namespace, req.name))
    return answer or ClaimPending(req.name)


class Claimer:
    """Claims items (sync). ``pod``/``pod_uid``: this Pod (default: ``POD_NAME`` or
    ``HOSTNAME``, and ``POD_UID``, else a read of this Pod)."""

    def __init__(
        self,
        client: KubeClient | None = None,
        *,
        pod: str | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self.client = client or KubeClient()
        self.pod = pod or own_pod()[0]
        self.pod_uid = pod_uid or os.environ.get("POD_UID") or None

    def _request(
        self, template: str, item: str, namespace: str | None, wait: float
    ) -> ClaimRequest:
        ns = namespace or self.client.namespace
        if self.pod_uid is None:
            self.pod_uid = pod_uid(self.client.get(pod_path(ns, self.pod)))
        return ClaimRequest(template, item, self.pod, self.pod_uid, ns, wait=wait)

    def claim(
        self, template: str, item: str, *, namespace: str | None = None, wait: float = 30.0
    ) -> ClaimResult:
        """Claim ``item`` under template lease ``template``."""
        return drive(plan(self._request(template, item, namespace, wait)), self.client)

    def done(self, template: str, item: str, *, namespace: str | None = None) -> bool:
        """The item is done (or given up): delete this Pod's claim (``True`` if it existed)."""
        req = self._request(template, item, namespace, 0)
        return withdrawn(self.client.request("DELETE", claim_path(req.namespace, req.name)))


class AsyncClaimer:
    """Claims items (asyncio); same semantics as :class:`Claimer`."""

    def __init__(
        self,
        client: AsyncKubeClient | None = None,
        *,
        pod: str | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self.client = client or AsyncKubeClient()
        self.pod = pod or own_pod()[0]
        self.pod_uid = pod_uid or os.environ.get("POD_UID") or None

    async def _request(
        self, template: str, item: str, namespace: str | None, wait: float
    ) -> ClaimRequest:
        ns = namespace or self.client.namespace
        if self.pod_uid is None:
            self.pod_uid = pod_uid(await self.client.get(pod_path(ns, self.pod)))
        return ClaimRequest(template, item, self.pod, self.pod_uid, ns, wait=wait)

    async def claim(
        self, template: str, item: str, *, namespace: str | None = None, wait: float = 30.0
    ) -> ClaimResult:
        """See :meth:`Claimer.claim`."""
        return await drive_async(
            plan(await self._request(template, item, namespace, wait)), self.client
        )

    async def done(self, template: str, item: str, *, namespace: str | None = None) -> bool:
        """See :meth:`Claimer.done`."""
        req = await self._request(template, item, namespace, 0)
        return withdrawn(await self.client.request("DELETE", claim_path(req.namespace, req.name)))
