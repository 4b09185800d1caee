"""One scheduler for every lease: a due-time heap and a bounded pool of workers.

Renewal and expiry of 10,000 leases must not mean 10,000 Kopf timers or daemons. Watch events
``poke`` a key (run soon); each run returns when it wants to run next (renewal due, expiry
due) or ``None`` (wait for an event). A key never runs twice at once: a poke during a run
schedules one more run after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from fencedlease import metrics
from fencedlease.health import SchedulerProgress

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


class Scheduler(Generic[K]):
    def __init__(
        self,
        work: Callable[[K], Awaitable[float | None]],
        *,
        concurrency: int = 16,
        clock: Callable[[], float] = time.monotonic,
        error_backoff: float = 2.0,
        priority: Callable[[K], int] = lambda _key: 0,
        kind: str = "leases",
        slack: float = 0.0,
        group: Callable[[K], str] = lambda _key: "",
    ) -> None:
        """``priority(key)``: among keys that are due, lower runs first (e.g. renewals of live
        grants before new grants, so a burst of new leases cannot starve renewals into
        expiry and churn). ``kind`` labels this scheduler's metrics (one of
        :data:`fencedlease.metrics.SCHEDULER_KINDS`). ``slack``: a wake also runs the keys
        due within this many seconds after it, so work due at one instant (give or take
        float and clock-reading noise) runs together, in one wake with its round trips in
        flight at once, rather than in a wake each; the work must accept running that early.
        ``group(key)``: the keys that fall due in one wake run grouped by this, the groups in
        order, each group's keys by due time (e.g. the renewals of the leases one Pod holds
        back to back, so they share that Pod's one write); the keys of earlier wakes still
        run first, so no group waits longer than its wake's turn."""
        if kind not in metrics.SCHEDULER_KINDS:
            raise ValueError(
                f"scheduler kind {kind!r} is not one of {sorted(metrics.SCHEDULER_KINDS)}"
            )
        self._kind = kind
        self._slack = slack
        self._work = work
        self._clock = clock
        self._error_backoff = error_backoff
        self._priority = priority
        self._group = group
        self._wakes = itertools.count()
        self._heap: list[tuple[float, int, K]] = []  # (due, seq, key): waiting for its time
        self._due: dict[K, float] = {}
        # Due now: by priority, then the wake that found them due, their group, due time.
        self._ready: list[tuple[int, int, str, float, int, K]] = []
        self._queued: dict[K, float] = {}  # due now, not started: key -> its due time
        self._running: set[K] = set()
        self._again: dict[K, float] = {}
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._free = concurrency
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_progress = clock()  # a run started or finished (health)

    def __len__(self) -> int:
        return len(self._due)

    def poke(self, key: K, delay: float = 0.0) -> None:
        """Run ``key`` after ``delay`` seconds (or earlier if already due earlier)."""
        when = self._clock() + max(0.0, delay)
        if key in self._running:
            self._again[key] = min(when, self._again.get(key, when))
            return
        if key in self._queued or (key in self._due and self._due[key] <= when):
            return  # already due at that time or earlier
        self._due[key] = when
        heapq.heappush(self._heap, (when, next(self._seq), key))
        if len(self._heap) > 2 * len(self._due) + 64:
            self._compact()
        self._wake.set()

    def _compact(self) -> None:
        """Drop the heap's superseded entries. An earlier poke leaves the key's old entry in
        place until its time comes (skipped then): a long lease poked often would pile up
        one per poke. Rebuilt when they outnumber the live ones, so amortised O(1) a poke."""
        self._heap = [entry for entry in self._heap if self._due.get(entry[2]) == entry[0]]
        heapq.heapify(self._heap)

    def forget(self, key: K) -> None:
        self._due.pop(key, None)
        self._again.pop(key, None)
        self._queued.pop(key, None)

    def progress(self, name: str) -> SchedulerProgress:
        """For liveness (:func:`fencedlease.health.scheduler_stuck`): the earliest due time of
        work not started yet and when a run last started or finished. O(keys), for probes."""
        now = self._clock()
        due = [when for when in self._due.values() if when <= now]
        due.extend(self._queued.values())
        return SchedulerProgress(name, min(due, default=None), self._last_progress)

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                now = self._clock()
                wake = next(self._wakes)
                while self._heap and self._heap[0][0] <= now + self._slack:
                    when, seq, key = heapq.heappop(self._heap)
                    if self._due.get(key) != when:
                        continue  # superseded by an earlier poke, or forgotten
                    del self._due[key]
                    self._queued[key] = when
                    order = (self._priority(key), wake, self._group(key), when, seq, key)
                    heapq.heappush(self._ready, order)
                while self._ready and self._free > 0:
                    _, _, _, due, _, key = heapq.heappop(self._ready)
                    if key not in self._queued:
                        continue  # forgotten while queued
                    del self._queued[key]
                    metrics.SCHEDULER_LATENESS.labels(self._kind).observe(max(0.0, now - due))
                    self._free -= 1
                    self._last_progress = now
                    self._running.add(key)
                    task = asyncio.create_task(self._run_one(key))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                metrics.SCHEDULER_QUEUE_DEPTH.labels(self._kind).set(len(self._queued))
                timeout = max(0.0, self._heap[0][0] - now) if self._heap else None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):  # not wait_for: see store/etcd.py
                        await self._wake.wait()
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run_one(self, key: K) -> None:
        delay: float | None
        started = self._clock()
        try:
            delay = await self._work(key)
            metrics.RECONCILES.labels(self._kind, "ok").inc()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the scheduler is stopping
            # Cancelled from below (e.g. a gRPC call whose shared channel another call closed):
            # a pass that ends so must run again, or its key would never be scheduled again.
            log.error("reconciling %s was cancelled; retrying in %.1fs", key, self._error_backoff)
            metrics.RECONCILES.labels(self._kind, "error").inc()
            metrics.RECONCILE_ERRORS.labels(self._kind).inc()
            delay = self._error_backoff
        except Exception:
            log.exception("reconciling %s failed; retrying in %.1fs", key, self._error_backoff)
            metrics.RECONCILES.labels(self._kind, "error").inc()
            metrics.RECONCILE_ERRORS.labels(self._kind).inc()
            delay = self._error_backoff
        finally:
            metrics.RECONCILE_DURATION.labels(self._kind).observe(max(0.0, self._clock() - started))
            self._last_progress = self._clock()
            self._running.discard(key)
            self._free += 1
            self._wake.set()  # a slot is free: dispatch what is ready
        again = self._again.pop(key, None)
        if again is not None:
            self.poke(key, max(0.0, again - self._clock()))
        if delay is not None:
            self.poke(key, delay)
