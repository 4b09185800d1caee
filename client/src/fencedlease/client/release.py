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

The request plan is written once without I/O (:func:`plan`, :mod:`.podrequests`', shared with
:mod:`.claims`) and driven by :class:`Releaser` (sync) and :class:`AsyncReleaser` (asyncio), like
:mod:`.publish`.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Optional, TypedDict, Union

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

from fencedlease.client import podrequests
from fencedlease.client.api import AsyncKubeClient, KubeClient, pod_path
from fencedlease.client.errors import GrantError
from fencedlease.client.grant import Grant
from fencedlease.client.plans import Reply, Step, drive, drive_async
from fencedlease.client.podrequests import C, Pending, PodRequest, Refused, Requester, Said
from fencedlease.client.results import Unavailable

RELEASES = "fencedreleases"


@dataclass(frozen=True)
class Released(Said):
    """The generation ended; the next candidate is granted a greater token."""

    says: ClassVar[str] = "released: lease {lease} generation {lease_id} (token {token})"
    lease: str
    lease_id: str
    token: int
    name: str
    code: Literal["released"] = "released"


class ReleaseRefused(Refused):
    """Nothing changed; ``reason`` (``not_current``, or the webhook's code) says why."""

    __slots__ = ()


class ReleasePending(Pending):
    """The request exists; the operator has not acted on it yet (it will)."""

    __slots__ = ()
    kind = "FencedRelease"
    waiting = "not acted on yet"


ReleaseResult = Union[Released, ReleaseRefused, ReleasePending, Unavailable]
Plan = Generator[Step, Optional[Reply], ReleaseResult]


def release_path(namespace: str, name: str | None = None) -> str:
    return podrequests.request_path(RELEASES, namespace, name)


@dataclass(frozen=True)
class ReleaseRequest(PodRequest[ReleaseResult]):
    """Give back generation ``lease_id`` (token ``token``) of ``lease``, as Pod ``pod``; one
    name per generation: retrying a release is idempotent."""

    lease: str
    lease_id: str
    token: int
    pod: str
    pod_uid: str
    namespace: str
    wait: float = 30.0
    poll: float = 0.2
    kind: ClassVar[str] = "FencedRelease"
    named: ClassVar[str] = "{lease}-{lease_id}"
    refused_as = ReleaseRefused
    pending_as = ReleasePending

    def body(self) -> dict[str, Any]:
        ref = {"leaseRef": {"name": self.lease}}
        spec = {**ref, "leaseId": self.lease_id, "fencingToken": self.token}
        return self.owned({"fencedlease.io/lease": self.lease}, spec)

    def answer(self, reply: Reply) -> ReleaseResult | None:
        if reply.status_code == 404:
            return ReleaseRefused("gone", f"FencedRelease {self.name} was deleted")
        status = podrequests.status(reply)
        if status.get("phase") == "Released":
            return Released(self.lease, self.lease_id, self.token, self.name)
        if status.get("phase") == "Refused":
            return ReleaseRefused("not_current", str(status.get("reason") or "refused"))
        return None


def plan(req: ReleaseRequest) -> Plan:
    """Create the request (an existing one of the same generation is the same request), then
    read its status until the operator answered or ``wait`` passed."""
    return (yield from podrequests.plan(req))


class ReleaseOptions(TypedDict, total=False):
    """The keywords of :meth:`Releaser.release`."""

    grant: Grant | None
    lease_id: str | None
    token: int | None
    pod: str | None
    namespace: str | None
    wait: float


class _Releases(Requester[C]):
    def _generation(self, lease: str, options: ReleaseOptions) -> tuple[str, int, str, str]:
        """The generation to end (lease id, token), the Pod's name and the namespace."""
        unknown = sorted(set(options) - ReleaseOptions.__optional_keys__)
        if unknown:
            raise TypeError(f"release() got an unexpected keyword argument {unknown[0]!r}")
        grant = options.get("grant")
        lease_id, token = options.get("lease_id"), options.get("token")
        if grant is not None:
            lease_id, token = grant.lease_id, grant.token
        if lease_id is None or token is None:
            message = "a release names the generation: pass grant=, or lease_id= and token="
            raise GrantError(message, source=lease)
        ns, pod = self._where(options.get("namespace"), options.get("pod"))
        return lease_id, int(token), pod, ns

    def _request(self, lease: str, options: ReleaseOptions, uid: str) -> ReleaseRequest:
        lease_id, token, pod, ns = self._generation(lease, options)
        wait = options.get("wait", 30.0)
        return ReleaseRequest(lease, lease_id, token, pod=pod, pod_uid=uid, namespace=ns, wait=wait)

    def _rejoined(self, lease: str, lease_id: str, namespace: str | None) -> str:
        """The path of the FencedRelease of generation ``lease_id``."""
        return release_path(namespace or self.client.namespace, f"{lease}-{lease_id}")


class Releaser(_Releases[KubeClient]):
    """Gives leases back (sync). ``pod``: this Pod's name (default: ``POD_NAME``, else
    ``HOSTNAME``); ``pod_uid``: its UID (default: ``POD_UID`` from a downward-API ``env``
    entry, else a read of this Pod, which needs ``get`` on pods)."""

    new_client = KubeClient

    def release(self, lease: str, **options: Unpack[ReleaseOptions]) -> ReleaseResult:
        """End the generation ``grant`` (or ``lease_id`` + ``token``) of ``lease``, as Pod
        ``pod`` (default: this one) in ``namespace``; ``wait``: seconds (default 30)."""
        _, _, pod, ns = self._generation(lease, options)
        uid = self.pod_uid or podrequests.pod_uid(self.client.get(pod_path(ns, pod)))
        return drive(plan(self._request(lease, options, uid)), self.client)

    def rejoin(self, lease: str, lease_id: str, *, namespace: str | None = None) -> bool:
        """Ask for ``lease`` again after releasing generation ``lease_id``: delete that
        FencedRelease (``True`` when it existed)."""
        path = self._rejoined(lease, lease_id, namespace)
        return podrequests.withdrawn(self.client.request("DELETE", path))


class AsyncReleaser(_Releases[AsyncKubeClient]):
    """Gives leases back (asyncio); same semantics as :class:`Releaser`."""

    new_client = AsyncKubeClient

    async def release(self, lease: str, **options: Unpack[ReleaseOptions]) -> ReleaseResult:
        """See :meth:`Releaser.release`."""
        _, _, pod, ns = self._generation(lease, options)
        uid = self.pod_uid or podrequests.pod_uid(await self.client.get(pod_path(ns, pod)))
        return await drive_async(plan(self._request(lease, options, uid)), self.client)

    async def rejoin(self, lease: str, lease_id: str, *, namespace: str | None = None) -> bool:
        """See :meth:`Releaser.rejoin`."""
        path = self._rejoined(lease, lease_id, namespace)
        return podrequests.withdrawn(await self.client.request("DELETE", path))
