"""Liveness and readiness decisions: pure functions of observations and an injected clock.

The adapters and parts only record cheap observations (monotonic timestamps); the health
endpoints of :mod:`fencedlease.app` read them and ask these functions:

* **liveness** fails when restarting the process is the cure: a scheduler has work due that
  nothing has started or finished for longer than a bound (its loop died or every worker
  hangs), a watch has shown no activity (event, bookmark, reconnection) for longer than its
  own timeout plus a grace (the watcher is wedged), or no etcd round trip has succeeded for
  longer than a bound while they fail (a wedged channel; a lost etcd also trips it, by design,
  after the longer bound);
* **readiness** of the webhook means it can decide: started, serving TLS, its checker running
  and etcd answered recently.

No I/O here and no imports from the package (docs/design.md, floor 1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Health:
    """A probe's answer: ``ok`` and, when not, every reason (worst first as found)."""

    ok: bool
    reasons: tuple[str, ...] = ()

    @classmethod
    def of(cls, reasons: Iterable[str | None]) -> Health:
        found = tuple(r for r in reasons if r)
        return cls(not found, found)

    def as_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "failing", "reasons": list(self.reasons)}


@dataclass
class EtcdContact:
    """Round trips to etcd as one store saw them (the store updates it; mutable, cheap).

    ``since``: when observation started (a process that never reached etcd counts from it).
    """

    since: float
    last_success: float | None = None
    last_failure: float | None = None
    error: str = ""

    def succeeded(self, now: float) -> None:
        self.last_success = now

    def failed(self, now: float, error: str) -> None:
        self.last_failure = now
        self.error = error


def etcd_unreachable(contact: EtcdContact, now: float, bound: float) -> str | None:
    """The reason etcd counts as unreachable, or ``None``.

    Unreachable: the latest round trip failed and none succeeded for more than ``bound``
    seconds (since the last success, or since observation started). Without a failure it is
    not unreachable, however long ago the last call was (quiet is not broken)."""
    failure = contact.last_failure
    if failure is None:
        return None
    success = contact.last_success
    if success is not None and success >= failure:
        return None
    reached = contact.since if success is None else success
    silent = now - reached
    if silent <= bound:
        return None
    return (
        f"etcd: no successful round trip for {silent:.1f}s (bound {bound:g}s); "
        f"last error: {contact.error or 'unknown'}"
    )


@dataclass(frozen=True)
class SchedulerProgress:
    """A scheduler's progress: the earliest due time of work not started yet (``None``: no
    work is due) and when a run last started or finished."""

    name: str
    waiting_since: float | None
    last_progress: float


def scheduler_stuck(progress: SchedulerProgress, now: float, bound: float) -> str | None:
    """Stuck: work has been due for more than ``bound`` seconds and no run started or finished
    meanwhile. A busy scheduler with a backlog (capacity) keeps finishing runs, so it is not
    stuck; an idle one has nothing due."""
    if progress.waiting_since is None:
        return None
    stalled = now - max(progress.waiting_since, progress.last_progress)
    if stalled <= bound:
        return None
    return (
        f"scheduler {progress.name}: work due for {now - progress.waiting_since:.1f}s and no "
        f"run started or finished for {stalled:.1f}s (bound {bound:g}s)"
    )


@dataclass
class WatchActivity:
    """When each watch last showed life: an event, a bookmark or a (re)connection.

    ``timeout``: the longest a healthy watch goes without any of those (its client timeout:
    the API server ends each watch request before it, and a reconnection counts)."""

    timeout: float
    last: dict[str, float] = field(default_factory=dict)

    def saw(self, watch: str, now: float) -> None:
        self.last[watch] = now


def watches_silent(activity: WatchActivity, now: float, grace: float) -> list[str]:
    """The watches silent for longer than their timeout plus ``grace`` (one reason each)."""
    bound = activity.timeout + grace
    return [
        f"watch {watch}: silent for {now - last:.1f}s (bound {bound:g}s)"
        for watch, last in sorted(activity.last.items())
        if now - last > bound
    ]


@dataclass(frozen=True)
class Bounds:
    """Seconds each liveness and readiness rule tolerates (settings ``health_*``)."""

    scheduler_stall: float = 60.0
    watch_grace: float = 60.0
    etcd_liveness: float = 120.0
    etcd_readiness: float = 10.0


def liveness(
    now: float,
    bounds: Bounds,
    *,
    schedulers: Iterable[SchedulerProgress] = (),
    watches: WatchActivity | None = None,
    etcd: EtcdContact | None = None,
) -> Health:
    """Live unless a scheduler is stuck, a watch is silent or etcd has been unreachable past
    the liveness bound."""
    stall = bounds.scheduler_stall
    reasons: list[str | None] = [scheduler_stuck(s, now, stall) for s in schedulers]
    if watches is not None:
        reasons.extend(watches_silent(watches, now, bounds.watch_grace))
    if etcd is not None:
        reasons.append(etcd_unreachable(etcd, now, bounds.etcd_liveness))
    return Health.of(reasons)


def readiness(
    now: float,
    bounds: Bounds,
    *,
    started: bool,
    etcd: EtcdContact | None = None,
    webhook_serving: bool | None = None,
    stopping: bool = False,
) -> Health:
    """Ready once started and, for a process that answers admission (``webhook_serving`` not
    ``None``), while it can decide: serving with its checker running and etcd reachable
    (no failing round trips for longer than the readiness bound). Not ready once told to stop
    (``stopping``: draining before it exits)."""
    reasons: list[str | None] = [None if started else "starting"]
    reasons.append("stopping: draining before exit" if stopping else None)
    if webhook_serving is not None:
        reasons.append(None if webhook_serving else "webhook: not serving or checker stopped")
        if etcd is not None:
            reasons.append(etcd_unreachable(etcd, now, bounds.etcd_readiness))
    return Health.of(reasons)
