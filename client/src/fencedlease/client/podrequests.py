"""What a Pod's request objects share: a FencedRelease (:mod:`.release`) and a FencedClaim
(:mod:`.claims`) are both created by the Pod they name, answered by the operator in their
status, and withdrawn by deleting them.

Here once: the ``refused`` and ``pending`` results (each kind names its own subclass, so a
``match`` tells them apart), the refusal or unavailability an API answer means, the object's
path and body, the request plan (:func:`plan`: create, then read the status until answered),
this Pod's UID from its object, what a withdrawal's answer says, and what a requester holds
(:class:`Requester`: its client and Pod). The steps and their drivers are :mod:`.plans`'.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from fencedlease.client.api import AsyncKubeClient, KubeClient
from fencedlease.client.contract import GROUP, VERSION
from fencedlease.client.errors import GrantError
from fencedlease.client.plans import Reply, Request, Sleep, Step
from fencedlease.client.publish import TRANSIENT_STATUS, fence_code
from fencedlease.client.results import Unavailable
from fencedlease.client.sources import own_pod
from fencedlease.client.validation import dns_label, dns_subdomain


class _Fields(dict[str, Any]):
    def __init__(self, result: object) -> None:
        super().__init__()
        self.result = result

    def __missing__(self, key: str) -> Any:
        return getattr(self.result, key)


class Said:
    """A result whose ``message`` is its class's ``says`` filled in with its fields."""

    __slots__ = ()
    says: ClassVar[str]

    @property
    def message(self) -> str:
        return self.says.format_map(_Fields(self))


@dataclass(frozen=True)
class Refused(Said):
    """Nothing changed: ``reason`` is the webhook's code, or the operator's, and ``detail``
    says why."""

    says: ClassVar[str] = "refused ({reason}): {detail}"
    reason: str
    detail: str
    code: Literal["refused"] = "refused"


@dataclass(frozen=True)
class Pending(Said):
    """The request ``name`` exists; the operator has not answered it yet."""

    says: ClassVar[str] = "pending: {kind} {name} {waiting}"
    name: str
    code: Literal["pending"] = "pending"
    kind: ClassVar[str] = "request"
    waiting: ClassVar[str] = "not answered yet"


RefusedT = TypeVar("RefusedT")


def refusal(reply: Reply, refused: Callable[[str, str], RefusedT]) -> RefusedT | Unavailable:
    """What a failed create means: :class:`Unavailable` for a transient answer, else a refusal
    with the webhook's code (``forbidden``, ``invalid`` or ``http_<status>`` without one)."""
    info = reply.info()
    missing = reply.not_installed()
    if missing is not None:
        return refused("not_installed", missing)
    if reply.status_code == 0:  # no answer: the message says why (refused, timed out)
        return Unavailable(info.message, 1, 0)
    if reply.status_code in TRANSIENT_STATUS:
        return Unavailable(f"HTTP {reply.status_code}: {info.message}", 1, reply.status_code)
    code = fence_code(info.message) or {403: "forbidden", 422: "invalid"}.get(
        reply.status_code, f"http_{reply.status_code}"
    )
    return refused(code, info.message or info.reason)


def request_path(resource: str, namespace: str, name: str | None = None) -> str:
    """The URL path of the request objects ``resource`` in ``namespace`` (of ``name``), both
    checked (a name made of an item or a lease id from outside must not leave the path)."""
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{dns_label(namespace)}/{resource}"
    return f"{base}/{dns_subdomain(name, f'{resource} name')}" if name else base


T = TypeVar("T")


class PodRequest(Generic[T]):
    """What a request object's dataclass shares: this Pod, the namespace and the waiting (each
    kind's frozen dataclass declares them after its own fields, as keywords: ``pod``,
    ``pod_uid``, ``namespace``, ``wait``, ``poll``); its ``kind``, ``name`` (``named`` filled
    in with its fields), path and body, and how its answers read (results ``T``:
    ``refused_as``, ``pending_as``)."""

    kind: ClassVar[str]
    named: ClassVar[str]
    refused_as: ClassVar[type[Refused]]
    pending_as: ClassVar[type[Pending]]
    pod: str
    pod_uid: str
    namespace: str
    wait: float
    """Seconds to wait for the operator's answer (0: pending at once)."""
    poll: float

    def __post_init__(self) -> None:
        """Its name and namespace go into URLs (the reads and the withdrawal): checked at once,
        with what they are (an item or a lease id from a queue must not leave the path)."""
        dns_subdomain(self.name, f"{self.kind} name")
        dns_label(self.namespace)

    @property
    def name(self) -> str:
        return self.named.format_map(_Fields(self))

    def path(self, name: str | None = None) -> str:
        return request_path(f"{self.kind.lower()}s", self.namespace, name)

    def owned(self, labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
        """The new object: ``spec`` names this Pod as the holder, and it is owned by it, so
        it goes with the Pod (no ``blockOwnerDeletion``: that would need more RBAC)."""
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": self.kind,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": labels,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": self.pod, "uid": self.pod_uid}
                ],
            },
            "spec": {**spec, "holder": self.pod, "holderUID": self.pod_uid},
        }

    def body(self) -> dict[str, Any]:
        raise NotImplementedError

    def answer(self, reply: Reply) -> T | None:
        """The result a reply (to the create, or a read) shows; ``None``: not answered yet."""
        raise NotImplementedError

    def refused(self, reason: str, detail: str) -> T:
        return cast(T, self.refused_as(reason, detail))

    def pending(self) -> T:
        return cast(T, self.pending_as(self.name))


def plan(req: PodRequest[T]) -> Generator[Step, Reply | None, T | Unavailable]:
    """Create the request object (an existing one is the same request: a retry), then read
    its status until the operator answered or ``wait`` passed."""
    created = yield Request("POST", req.path(), req.body())
    assert created is not None
    if not created.ok and created.status_code != 409:  # 409: made before (a retry)
        return refusal(created, req.refused)
    answer = req.answer(created)
    for _ in range(max(0, math.ceil(req.wait / req.poll))):
        if answer is not None:
            break
        yield Sleep(req.poll)
        read = yield Request("GET", req.path(req.name))
        assert read is not None
        answer = req.answer(read)
    return req.pending() if answer is None else answer


def status(reply: Reply) -> dict[str, Any]:
    """The status of a request object in a successful reply (``{}`` otherwise)."""
    obj = reply.body if reply.ok else None
    return (obj.get("status") if isinstance(obj, dict) else None) or {}


C = TypeVar("C", KubeClient, AsyncKubeClient)


class Requester(Generic[C]):
    """A Pod making request objects: ``client`` (default: a new one) and this Pod, ``pod``
    (default: ``POD_NAME``, else ``HOSTNAME``; read at once when :attr:`pod_at_start`) and
    ``pod_uid`` (default: ``POD_UID`` from a downward-API ``env`` entry, else a read of this
    Pod, which needs ``get`` on pods)."""

    new_client: Callable[[], C]
    pod_at_start: ClassVar[bool] = False

    def __init__(
        self, client: C | None = None, *, pod: str | None = None, pod_uid: str | None = None
    ) -> None:
        self.client: C = client or self.new_client()
        self.pod = pod or (own_pod()[0] if self.pod_at_start else None)
        self.pod_uid = pod_uid or os.environ.get("POD_UID") or None

    def _where(self, namespace: str | None, pod: str | None = None) -> tuple[str, str]:
        """The namespace and the Pod's name of a request."""
        return namespace or self.client.namespace, pod or self.pod or own_pod()[0]


def pod_uid(pod: dict[str, Any]) -> str:
    """The UID of a Pod object (read from the API: no ``POD_UID`` in the environment)."""
    uid = (pod.get("metadata") or {}).get("uid")
    if not isinstance(uid, str) or not uid:
        raise GrantError("this Pod has no UID", source="the API")
    return uid


def withdrawn(reply: Reply) -> bool:
    """The answer to a request object's DELETE: ``True`` when it existed, ``False`` when it
    was gone already; any other failure raises."""
    if reply.status_code == 404:
        return False
    reply.raise_for_status()
    return True
