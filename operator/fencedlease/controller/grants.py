"""What the lease reconciler remembers between passes: per lease, the grant this replica made
or renewed in its current leadership term and what it already reported; per holder Pod, the
grid its renewals fall due on.

One record per lease (:class:`LeaseMemory`), changed only by the named transitions of
:class:`Memories`: a grant leaves it as a whole (:meth:`Memories.forget_grant`), never field by
field, and a lease that is gone leaves nothing behind (:meth:`Memories.gone`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from fencedlease.authority.types import LeaseKey
from fencedlease.controller import projection
from fencedlease.controller.leases import Unverified
from fencedlease.controller.pods import PodCache


@dataclass(frozen=True, slots=True)
class LiveGrant:
    """A grant this replica made or renewed in its current leadership term: what a renewal
    pass decides on instead of reading etcd (``docs/operations.md``, "What a renewal
    writes"). The renew transaction compares on the version the store cached with it, so a
    stale copy costs a refused compare, never a wrong write."""

    lease_id: str
    token: int
    holder: str
    holder_uid: str | None
    duration: float
    valid_until: dt.datetime
    proof: str


@dataclass(slots=True)
class LiveTerm:
    """A live grant and its renewal clock (all times on the reconciler's clock)."""

    grant: LiveGrant
    renewed: float
    """When it was last granted or renewed."""
    due: float | None = None
    """When its next renewal is due, on its holder Pod's ticks (``None``: not scheduled yet;
    one renew interval after :attr:`renewed`)."""
    recorded: float | None = None
    """When a renewal was last recorded in the status this term (``None``: not yet)."""

    def next_due(self) -> float:
        return (
            self.due
            if self.due is not None
            else self.renewed + projection.renew_interval(self.grant.duration)
        )


@dataclass(slots=True)
class LeaseMemory:
    """What the reconciler remembers of one lease."""

    live: LiveTerm | None = None
    """This term's grant (``None``: none: never granted, or ended, or granted in an earlier
    term, which a pass decides on from a read of etcd)."""
    reported_spec_error: int | None = None
    """The generation whose invalid spec was reported (one Event per generation)."""
    reported_unverified: Unverified | None = None
    """The unverified status last reported (one Event per forgery)."""

    @property
    def empty(self) -> bool:
        return (
            self.live is None
            and self.reported_spec_error is None
            and self.reported_unverified is None
        )


class Memories:
    """One :class:`LeaseMemory` per lease that has something to remember.

    Transitions of a lease's grant: *none* → :meth:`granted` (a grant made, or a generation
    of an earlier term renewed) → *live*, which :meth:`renewed` and :meth:`scheduled` move
    on and :meth:`forget_grant` (expired, handed over, refused by etcd, finalized) or
    :meth:`term_started` (every lease) end. Reports are kept across terms and go with the
    lease (:meth:`gone`)."""

    def __init__(self) -> None:
        self._by_key: dict[LeaseKey, LeaseMemory] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def _at(self, key: LeaseKey) -> LeaseMemory:
        memory = self._by_key.get(key)
        if memory is None:
            memory = self._by_key[key] = LeaseMemory()
        return memory

    def _drop_if_empty(self, key: LeaseKey) -> None:
        memory = self._by_key.get(key)
        if memory is not None and memory.empty:
            del self._by_key[key]

    # ------------------------------------------------------------------------ reading

    def live(self, key: LeaseKey) -> LiveTerm | None:
        memory = self._by_key.get(key)
        return None if memory is None else memory.live

    def grant(self, key: LeaseKey) -> LiveGrant | None:
        live = self.live(key)
        return None if live is None else live.grant

    # ------------------------------------------------------------------------ the grant

    def granted(self, key: LeaseKey, grant: LiveGrant, now: float) -> None:
        """A new grant: its renewal clock starts at ``now``."""
        self._at(key).live = LiveTerm(grant, now)

    def renewed(self, key: LeaseKey, grant: LiveGrant, now: float) -> None:
        """``grant`` renewed at ``now`` (valid until ``grant.valid_until``): this term's grant
        from now on, keeping the record of when a renewal was last recorded."""
        memory = self._at(key)
        if memory.live is None:
            memory.live = LiveTerm(grant, now)
        else:
            memory.live.grant = grant
            memory.live.renewed = now

    def scheduled(self, key: LeaseKey, due: float) -> None:
        live = self.live(key)
        if live is not None:
            live.due = due

    def status_recorded(self, key: LeaseKey, now: float) -> None:
        """The status now records a renewal (or the grant) of the live grant."""
        live = self.live(key)
        if live is not None:
            live.recorded = now

    def forget_grant(self, key: LeaseKey) -> None:
        """No live grant of ours to renew any more."""
        memory = self._by_key.get(key)
        if memory is not None:
            memory.live = None
            self._drop_if_empty(key)

    def term_started(self) -> None:
        """A new leadership term: what this process granted or renewed in an earlier one may
        be stale (another replica may have written since)."""
        for key in list(self._by_key):
            self.forget_grant(key)

    def gone(self, key: LeaseKey) -> None:
        """The lease is gone: nothing about it stays."""
        self._by_key.pop(key, None)

    # ------------------------------------------------------------------------ reports

    def report_spec_error(self, key: LeaseKey, generation: int) -> bool:
        """``True`` the first time generation ``generation``'s invalid spec is reported."""
        memory = self._at(key)
        if memory.reported_spec_error == generation:
            return False
        memory.reported_spec_error = generation
        return True

    def report_unverified(self, key: LeaseKey, found: Unverified | None) -> bool:
        """``True`` the first time ``found`` is reported (``None``: the status is verified
        again, and a later forgery is reported anew)."""
        if found is None:
            memory = self._by_key.get(key)
            if memory is not None:
                memory.reported_unverified = None
                self._drop_if_empty(key)
            return False
        memory = self._at(key)
        if memory.reported_unverified == found:
            return False
        memory.reported_unverified = found
        return True

    def reported_spec_error(self, key: LeaseKey) -> int | None:
        memory = self._by_key.get(key)
        return None if memory is None else memory.reported_spec_error


class RenewalTicks:
    """Each holder Pod's renewal grid, per renew interval: the renewals of the leases one Pod
    holds fall due together (:func:`~.projection.tick_anchor`,
    :func:`~.projection.next_renewal`) and share its one deadline write."""

    def __init__(self, pods: PodCache) -> None:
        self.pods = pods
        self.anchors: dict[tuple[str, str, float], float] = {}

    def __len__(self) -> int:
        return len(self.anchors)

    def anchor(self, namespace: str, pod: str, interval: float, now: float) -> float:
        tick = (namespace, pod, interval)
        anchor = self.anchors.get(tick)
        if anchor is None:
            self.prune()
            anchor = self.anchors[tick] = projection.tick_anchor(now)
        return anchor

    def prune(self) -> None:
        """Drop the ticks of Pods gone from the cache (deleted, or out of the watch's scope)
        once the ticks outnumber the cached Pods twice: where holder Pods come and go (a job
        per Pod), one tick per Pod name ever used would grow without bound."""
        if len(self.anchors) > 2 * len(self.pods) + 64:
            self.anchors = {
                tick: anchor
                for tick, anchor in self.anchors.items()
                if self.pods.get(tick[0], tick[1]) is not None
            }

    def clear(self) -> None:
        self.anchors.clear()
