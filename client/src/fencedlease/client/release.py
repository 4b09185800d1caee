"""A holder giving its lease back (docs/client.md, "Release").

The holder Pod creates a ``FencedRelease`` naming the exact generation it holds (lease id and
token) and itself (Pod name and UID). The fence webhook admits it only from that Pod's
Pod-bound service-account token; the operator then ends the generation in etcd only if it is
still the current one (a delayed release changes nothing) and hands the lease to the next
candidate with a greater token at once. The releasing Pod is not chosen for that lease again
while its FencedRelease exists: :meth:`Releaser.rejoin` deletes it (asking again); it also goes
with the Pod, its owner. Least privilege for the holder: ``create`` and ``get`` (``delete`` to
rejoin) on ``fencedreleases``.

Results, one per outcome (the CLI's exit codes, docs/client.md):

=====================  ==========================================================
``Released``           the generation ended (or had already been released by it)
``ReleaseRefused``     nothing changed: the generation is not current (``not_current``),
                       or the webhook refused the requester (``holder_mismatch``,
                       ``unknown_token``, ``lease_mismatch``, ``forbidden``, ``invalid``)
``ReleasePending``     created, the operator has not answered within ``wait``
``Unavailable``        the request could not be made (API or webhook unavailable)
=====================  ==========================================================

The request plan is written once without I/O (:func:`plan`) and driven by :class:`Releaser`
(sync) and :class:`AsyncReleaser` (asyncio), like :mod:`.publish`.
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
from fencedlease.client.errors import GrantError
from fencedlease.client.grant import Grant, own_pod
from fencedlease.client.plans import Request, Sleep, drive, drive_async
from fencedlease.client.podrequests import Pending, Refused, pod_owned, pod_uid, withdrawn
from fencedlease.client.results import Unavailable

RELEASES = "fencedreleases"


@dataclass(frozen=True, slots=True)
class Released:
    """The generation ended; the next candidate is granted a greater token."""

    lease: str
    lease_id: str
    token: int
    name: str
    code: Literal["released"] = "released"

    @property
    def message(self) -> str:
        return f"released: lease {self.lease} generation {self.lease_id} (token {self.token})"


class ReleaseRefused(Refused):
    """Nothing changed; ``reason`` (``not_current``, or the webhook's code) says why."""

    __slots__ = ()


class ReleasePending(Pending):
    """The request exists; the operator has not acted on it yet (it will)."""

    __slots__ = ()
    kind = "FencedRelease"
    waiting = "not acted on yet"


ReleaseResult = Released | ReleaseRefused | ReleasePending | Unavailable
Plan = Generator[Request | Sleep, Reply | None, ReleaseResult]


def release_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RELEASES}"
    return f"{base}/{name}" if name else base


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """Give back generation ``lease_id`` (token ``token``) of ``lease``, as Pod ``pod``."""

    lease: str
    lease_id: str
    token: int
    pod: str
    pod_uid: str
    namespace: str
    wait: float = 30.0
    """Seconds to wait for the operator's answer (0: return ``ReleasePending`` at once)."""
    poll: float = 0.2

    @property
    def name(self) -> str:
        """One name per generation: retrying a release is idempotent."""
        return f"{self.lease}-{self.lease_id}"

    def body(self) -> dict[str, Any]:
        labels = {"fencedlease.io/lease": self.lease}
        spec = {
            "leaseRef": {"name": self.lease},
            "leaseId": self.lease_id,
            "fencingToken": self.token,
        }
        return pod_owned(
            "FencedRelease", self.name, self.namespace, labels, self.pod, self.pod_uid, spec
        )


def _answered(req: ReleaseRequest, obj: Any) -> ReleaseResult | None:
    status = (obj.get("status") if isinstance(obj, dict) else None) or {}
    phase = status.get("phase")
    if phase == "Released":
        return Released(req.lease, req.lease_id, req.token, req.name)
    if phase == "Refused":
        return ReleaseRefused("not_current", str(status.get("reason") or "refused"))
    return None


def plan(req: ReleaseRequest) -> Plan:
    """Create the request (an existing one of the same generation is the same request), then
    read its status until the operator answered or ``wait`` passed."""
    created = yield Request("POST", release_path(req.namespace), req.body())
    assert created is not None
    if not created.ok and created.status_code != 409:  # 409: made before (a retry)
        return podrequests.refusal(created, ReleaseRefused)
    polls = max(0, math.ceil(req.wait / req.poll)) if req.wait > 0 else 0
    answer = _answered(req, created.body) if created.ok else None
    for _ in range(polls):
        if answer is not None:
            return answer
        yield Sleep(req.poll)
        read = yield Request("GET", release_path(req.namespace, req.name))
        assert read is not None
        if read.status_code == 404:
            return ReleaseRefused("gone", f"FencedRelease {req.name} was deleted")
        answer = _answered(req, read.body) if read.ok else None
    return answer or ReleasePending(req.name)


def _request(
    lease: str,
    grant: Grant | None,
    lease_id: str | None,
    token: int | None,
    pod: str | None,
    namespace: str,
) -> tuple[str, int, str, str]:
    if grant is not None:
        lease_id, token = grant.lease_id, grant.token
    if lease_id is None or token is None:
        raise GrantError(
            "a release names the generation: pass grant=, or lease_id= and token=", source=lease
        )
    name = pod or own_pod()[0]
    return lease_id, int(token), name, namespace


class Releaser:
    """Gives leases back (sync). ``pod``: this Pod's name (default: ``POD_NAME``, else
    ``HOSTNAME``); ``pod_uid``: its UID (default: ``POD_UID`` from a downward-API ``env``
    entry, else a read of this Pod, which needs ``get`` on pods)."""

    def __init__(
        self,
        client: KubeClient | None = None,
        *,
        pod: str | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self.client = client or KubeClient()
        self.pod = pod
        self.pod_uid = pod_uid or os.environ.get("POD_UID") or None

    def release(
        self,
        lease: str,
        *,
        grant: Grant | None = None,
        lease_id: str | None = None,
        token: int | None = None,
        pod: str | None = None,
        namespace: str | None = None,
        wait: float = 30.0,
    ) -> ReleaseResult:
        """End the generation ``grant`` (or ``lease_id`` + ``token``) of ``lease``."""
        ns = namespace or self.client.namespace
        lid, tok, name, ns = _request(lease, grant, lease_id, token, pod or self.pod, ns)
        uid = self.pod_uid or pod_uid(self.client.get(pod_path(ns, name)))
        return drive(plan(ReleaseRequest(lease, lid, tok, name, uid, ns, wait=wait)), self.client)

    def rejoin(self, lease: str, lease_id: str, *, namespace: str | None = None) -> bool:
        """Ask for ``lease`` again after releasing generation ``lease_id``: delete that
        FencedRelease (``True`` when it existed)."""
        ns = namespace or self.client.namespace
        return withdrawn(self.client.request("DELETE", release_path(ns, f"{lease}-{lease_id}")))


class AsyncReleaser:
    """Gives leases back (asyncio); same semantics as :class:`Releaser`."""

    def __init__(
        self,
        client: AsyncKubeClient | None = None,
        *,
        pod: str | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self.client = client or AsyncKubeClient()
        self.pod = pod
        self.pod_uid = pod_uid or os.environ.get("POD_UID") or None

    async def release(
        self,
        lease: str,
        *,
        grant: Grant | None = None,
        lease_id: str | None = None,
        token: int | None = None,
        pod: str | None = None,
        namespace: str | None = None,
        wait: float = 30.0,
    ) -> ReleaseResult:
        """See :meth:`Releaser.release`."""
        ns = namespace or self.client.namespace
        lid, tok, name, ns = _request(lease, grant, lease_id, token, pod or self.pod, ns)
        uid = self.pod_uid or pod_uid(await self.client.get(pod_path(ns, name)))
        steps = plan(ReleaseRequest(lease, lid, tok, name, uid, ns, wait=wait))
        return await drive_async(steps, self.client)

    async def rejoin(self, lease: str, lease_id: str, *, namespace: str | None = None) -> bool:
        """See :meth:`Releaser.rejoin`."""
        ns = namespace or self.client.namespace
        reply = await self.client.request("DELETE", release_path(ns, f"{lease}-{lease_id}"))
        return withdrawn(reply)
