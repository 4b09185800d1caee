"""Pure rules of a holder's voluntary release (a FencedRelease): which one the controller
acts on, and whom a release keeps from being chosen again.

The generation itself is ended by :func:`fencedlease.authority.decide.decide_release` (the
store's conditional release on the exact lease id and token); this module decides, on what the
controller read, whether to ask for it at all, and says why not in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fencedlease.authority.types import EndedBy, LeaseState, LeaseView


@dataclass(frozen=True, slots=True)
class HolderRelease:
    """A holder's request to end generation ``lease_id`` (token ``token``) of lease ``lease``,
    as Pod ``holder`` with UID ``holder_uid``; ``phase`` is ``None`` until acted on, then
    ``Released`` or ``Refused``."""

    namespace: str
    name: str
    lease: str
    lease_id: str
    token: int
    holder: str
    holder_uid: str
    phase: str | None = None


def refusal(view: LeaseView | None, request: HolderRelease) -> str | None:
    """Why ``request`` ends nothing, on the generation etcd holds (``view``); ``None``: ask
    the store to end it (its compare on the lease id still decides).

    A release of an older generation (delayed, or sent after the lease expired and moved on)
    is refused: it names a lease id that is not the current one, and the newer holder keeps
    its lease. A generation granted to another Pod UID is never ended by this request, even
    if the lease id matches (the webhook already refuses such a request; this holds without
    it)."""
    if view is None:
        return f"lease {request.lease} has no generation in etcd (lease id {request.lease_id})"
    record = view.record
    if record.lease_id != request.lease_id or view.token != request.token:
        return (
            f"generation {request.lease_id} (token {request.token}) is not current: lease "
            f"{request.lease} is at generation {record.lease_id} (token {view.token}); "
            "a release of an older generation changes nothing"
        )
    if record.holder_uid is not None and record.holder_uid != request.holder_uid:
        return (
            f"generation {request.lease_id} was granted to Pod {record.holder} "
            f"(uid {record.holder_uid}), not to uid {request.holder_uid}"
        )
    if record.state is LeaseState.RELEASED and record.ended_by not in (None, EndedBy.RELEASE):
        return f"generation {request.lease_id} already ended ({record.ended_by})"
    return None


def passed_over(requests: Iterable[HolderRelease]) -> frozenset[str]:
    """The Pod UIDs not to choose for the lease: each Pod whose release of it took effect,
    for as long as that FencedRelease exists. A Pod asks again by deleting it (the SDK's
    ``rejoin``); it goes with its Pod (its owner) in any case."""
    return frozenset(r.holder_uid for r in requests if r.phase == "Released")
