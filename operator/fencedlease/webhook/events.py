"""Events from the webhook: posted in the background, never on the admission path.

:class:`BackgroundEvents` wraps any :class:`~fencedlease.events.EventSink` so posting an Event
never delays an admission response: Events are queued to tasks and dropped (logged, and
counted in ``fencedlease_events_dropped_total{cause="queue_full"}``) when too many are in
flight.  Correlation (one Event with a growing count, rate limits) is the sink's
(:class:`fencedlease.events.KubeEvents`).
"""

from __future__ import annotations

import asyncio
import logging

from fencedlease import metrics
from fencedlease.events import EventSink, ObjectRef

log = logging.getLogger(__name__)


class BackgroundEvents:
    """Fire-and-forget wrapper: :meth:`emit` returns at once; :meth:`drain` waits (tests, stop)."""

    def __init__(self, sink: EventSink | None, max_in_flight: int = 256) -> None:
        self.sink = sink
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._reasons: dict[asyncio.Task[None], str] = {}
        self.dropped = 0

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self.sink is None:
            return
        if len(self._tasks) >= self.max_in_flight:
            self.dropped += 1
            metrics.EVENTS_DROPPED.labels(reason, "queue_full").inc()
            log.warning(
                "dropping Event %s on %s/%s: too many in flight", reason, ref.namespace, ref.name
            )
            return
        task = asyncio.create_task(self._post(ref, type_, reason, message))
        self._tasks.add(task)
        self._reasons[task] = reason
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._reasons.pop(task, None)

    async def _post(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        assert self.sink is not None
        try:
            await self.sink.event(ref, type_, reason, message)
        except Exception:  # best effort: an Event must never break admission
            log.exception("posting Event %s failed", reason)

    async def drain(self, within: float = 5.0) -> None:
        """Wait up to ``within`` seconds for the Events in flight (tests)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=within)

    async def close(self, within: float = 5.0) -> None:
        """Shutdown: wait up to ``within`` seconds for the Events in flight, then cancel the
        rest (counted in ``fencedlease_events_dropped_total{cause="shutdown"}``) and wait up
        to ``within`` seconds more for them to finish cancelling."""
        await self.drain(within)
        late = [(task, reason) for task, reason in self._reasons.items() if not task.done()]
        for task, reason in late:
            task.cancel()
            self.dropped += 1
            metrics.EVENTS_DROPPED.labels(reason, "shutdown").inc()
        if late:
            log.warning("%d Events not sent within %.1fs of shutdown: dropped", len(late), within)
            await asyncio.wait({task for task, _ in late}, timeout=within)
