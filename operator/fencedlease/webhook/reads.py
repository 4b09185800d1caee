"""One etcd read for concurrent fence checks of the same token on the same lease.

A holder publishing many artifacts at once sends the webhook many reviews that ask the store
the same question: the grant of token ``t`` and lease ``L``'s high-water mark.  Each review
still needs a read **issued after it arrived** (the mark may have advanced a moment before:
a read already in flight when the review came in is too old for it).  So a review joins the
*next* read of its key, never the one in flight: the first review of a key starts a read; the
reviews that arrive while it runs wait together for one more read, started as soon as the
first one completes; and so on.  Under load that is at most two reads in a row per key instead
of one per review; an idle webhook reads exactly as before (one read per review, at once).

Measured in docs/performance.md ("The fenced write: nearly free"): the store call (gRPC,
etcd) was the largest part of the webhook's CPU per review once the lease policy came from a
cache.
"""

from __future__ import annotations

import asyncio
import contextlib

from fencedlease.authority.types import FenceRead
from fencedlease.webhook.checker import FenceStore

Key = tuple[str, str, int]
Answer = FenceRead


class CoalescedReads:
    """A :class:`FenceStore` that shares ``grant_and_mark`` reads as described above.

    Errors are shared too: every review waiting for a read that failed gets its exception
    (``StoreUnavailable``: the write is not admitted).  A review that gives up (its timeout)
    does not cancel the read the others wait for.
    """

    def __init__(self, store: FenceStore) -> None:
        self.store = store
        self._running: dict[Key, asyncio.Future[Answer]] = {}
        self._next: dict[Key, asyncio.Future[Answer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.reads = 0
        """Reads issued (``grant_and_mark`` calls on the store)."""
        self.shared = 0
        """Reviews answered by a read that another review also waited for."""

    async def epoch(self) -> str:
        return await self.store.epoch()

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> Answer:
        key = (namespace, name, token)
        future = self._next.get(key)
        if future is not None:
            self.shared += 1
        elif key in self._running:
            future = self._next[key] = asyncio.get_running_loop().create_future()
            self.shared += 1
        else:
            future = self._start(key, asyncio.get_running_loop().create_future())
        return await asyncio.shield(future)

    def _start(self, key: Key, future: asyncio.Future[Answer]) -> asyncio.Future[Answer]:
        self._running[key] = future
        future.add_done_callback(_retrieve)
        task = asyncio.create_task(self._read(key, future), name="fence-read")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return future

    async def _read(self, key: Key, future: asyncio.Future[Answer]) -> None:
        self.reads += 1
        try:
            answer = await self.store.grant_and_mark(*key)
        except BaseException as error:  # shared with every waiter, cancellation included
            if not future.done():
                future.set_exception(
                    error if isinstance(error, Exception) else asyncio.CancelledError()
                )
            if not isinstance(error, Exception):
                raise
        else:
            if not future.done():
                future.set_result(answer)
        finally:
            del self._running[key]
            waiting = self._next.pop(key, None)
            if waiting is not None and self._closed:
                waiting.cancel()
            elif waiting is not None:
                self._start(key, waiting)

    async def close(self) -> None:
        """Cancel reads still running (their waiters get ``CancelledError``)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _retrieve(future: asyncio.Future[Answer]) -> None:
    """Mark a shared exception as seen (all its waiters may have given up already)."""
    if not future.cancelled():
        future.exception()
