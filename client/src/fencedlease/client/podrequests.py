"""What a Pod's request objects share: a FencedRelease (:mod:`.release`) and a FencedClaim
(:mod:`.claims`) are both created by the Pod they name, answered by the operator in their
status, and withdrawn by deleting them.

Here once: the ``refused`` and ``pending`` results (each kind names its own subclass, so a
``match`` tells them apart), the refusal or unavailability an API answer means, this Pod's UID
from its object, and what a withdrawal's answer says. The plans and their drivers are
:mod:`.publish`'s (:class:`~.publish.Request`, :func:`~.publish.drive`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from fencedlease.client._contract import GROUP, VERSION
from fencedlease.client.api import Reply
from fencedlease.client.errors import GrantError
from fencedlease.client.publish import TRANSIENT_STATUS, fence_code
from fencedlease.client.results import Unavailable


@dataclass(frozen=True, slots=True)
class Refused:
    """Nothing changed: ``reason`` is the webhook's code, or the operator's, and ``detail``
    says why."""

    reason: str
    detail: str
    code: Literal["refused"] = "refused"

    @property
    def message(self) -> str:
        return f"refused ({self.reason}): {self.detail}"


@dataclass(frozen=True, slots=True)
class Pending:
    """The request ``name`` exists; the operator has not answered it yet."""

    name: str
    code: Literal["pending"] = "pending"
    kind: ClassVar[str] = "request"
    waiting: ClassVar[str] = "not answered yet"

    @property
    def message(self) -> str:
        return f"pending: {self.kind} {self.name} {self.waiting}"


RefusedT = TypeVar("RefusedT", bound=Refused)


def refusal(reply: Reply, refused: Callable[[str, str], RefusedT]) -> RefusedT | Unavailable:
    """What a failed create means: :class:`Unavailable` for a transient answer, else a refusal
    with the webhook's code (``forbidden``, ``invalid`` or ``http_<status>`` without one)."""
    info = reply.info()
    if reply.status_code in TRANSIENT_STATUS:
        return Unavailable(f"HTTP {reply.status_code}: {info.message}", 1, reply.status_code)
    code = fence_code(info.message) or {403: "forbidden", 422: "invalid"}.get(
        reply.status_code, f"http_{reply.status_code}"
    )
    return refused(code, info.message or info.reason)


def pod_owned(
    kind: str,
    name: str,
    namespace: str,
    labels: dict[str, str],
    pod: str,
    pod_uid: str,
    spec: dict[str, Any],
) -> dict[str, Any]:
    """A new request object ``kind`` from Pod ``pod``: ``spec`` names it as the holder, and it
    is owned by it, so it goes with the Pod (no ``blockOwnerDeletion``: that would need more
    RBAC)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid}],
        },
        "spec": {**spec, "holder": pod, "holderUID": pod_uid},
    }


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
