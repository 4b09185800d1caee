"""The legacy sweep, run by the leading controller (docs/tokens.md, "Retention").

Token records and high-water marks written before retention existed are in no lease's retained
list, so no recording transaction ever prunes them: an installation upgraded from such a
version would keep them forever. :class:`LegacySweep` runs the store's sweep
(:meth:`~fencedlease.store.etcd.EtcdStore.sweep_legacy`, rule in
:mod:`fencedlease.authority.retention`) when this replica starts leading and then every
``interval`` seconds, paced so it never crowds out grants and fence checks, and logs its
progress. On a store that has none left it is one paged read of the token records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from fencedlease import metrics
from fencedlease.authority.retention import SweepReport
from fencedlease.authority.types import StoreUnavailable
from fencedlease.controller.leadership import Leadership, NotLeader

log = logging.getLogger(__name__)

SWEEP_INTERVAL_SECONDS = 6 * 3600.0
"""Between two sweeps of one leader (a new leader sweeps at once)."""
SWEEP_RETRY_SECONDS = 300.0
"""After a sweep that etcd failed."""
SWEEP_KEYS_PER_SECOND = 2000.0
"""The most keys a sweep deletes per second (about 30 small etcd transactions)."""
PROGRESS_SECONDS = 30.0
"""A running sweep logs its totals at most this often."""


class SweepStore(Protocol):
    async def sweep_legacy(
        self,
        *,
        page: int = ...,
        pause: Callable[[int], Awaitable[None]] | None = ...,
        progress: Callable[[SweepReport], None] | None = ...,
    ) -> SweepReport: ...


class LegacySweep:
    """Sweeps when leadership starts (:meth:`leadership_started`), then every ``interval``.

    Only the leader sweeps, and a sweep stops between two pages once this replica no longer
    leads (each deletion is conditional anyway, so a late one is harmless)."""

    def __init__(
        self,
        store: SweepStore,
        leadership: Leadership,
        *,
        interval: float = SWEEP_INTERVAL_SECONDS,
        retry: float = SWEEP_RETRY_SECONDS,
        keys_per_second: float = SWEEP_KEYS_PER_SECOND,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._leadership = leadership
        self._interval = interval
        self._retry = retry
        self._rate = keys_per_second
        self._sleep = sleep
        self._clock = clock
        self._wake = asyncio.Event()
        self.last: SweepReport | None = None
        """The totals of the last sweep that finished."""

    def leadership_started(self) -> None:
        """A new term: sweep now (the previous leader may have stopped mid-sweep)."""
        self._wake.set()

    async def run(self) -> None:
        """Sweep whenever woken or due, until cancelled."""
        wait = 0.0
        while True:
            if wait > 0:
                try:
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            wait = await self.sweep_once()

    async def sweep_once(self) -> float:
        """One sweep if this replica leads; the seconds until the next one is due."""
        if not self._leadership.is_leader():
            return self._interval
        started = self._clock()
        logged = [started]

        def progress(report: SweepReport) -> None:
            now = self._clock()
            if now - logged[0] >= PROGRESS_SECONDS:
                logged[0] = now
                log.info("token sweep: %s so far", _totals(report))

        async def pause(deleted: int) -> None:
            if not self._leadership.is_leader():
                raise NotLeader
            await self._sleep(deleted / self._rate if deleted else 0.0)

        try:
            report = await self._store.sweep_legacy(pause=pause, progress=progress)
        except NotLeader:
            log.info("token sweep stopped: this replica no longer leads")
            return self._interval
        except StoreUnavailable as error:
            log.warning("token sweep failed, retrying in %.0fs: %s", self._retry, error)
            return self._retry
        self.last = report
        for action in ("pruned", "kept", "changed", "malformed"):
            metrics.TOKEN_SWEEP_KEYS.labels(action).inc(getattr(report, action))
        level = logging.INFO if report.pruned or report.changed else logging.DEBUG
        log.log(level, "token sweep done in %.1fs: %s", self._clock() - started, _totals(report))
        return self._interval


def _totals(report: SweepReport) -> str:
    return (
        f"{report.scanned} keys scanned, {report.pruned} pruned, {report.kept} kept, "
        f"{report.changed} changed meanwhile (next sweep), {report.malformed} malformed"
    )
