"""Fenced leadership for Kopf operators: handlers run only while this replica holds the grant,
and every write they make carries its token (docs/fenced-objects.md, "The controller pattern").

An operator's replicas are the candidate Pods of one FencedLease; the operator's grant reaches
each replica through its downward-API files. :class:`FencedLeadership` watches them::

    leadership = FencedLeadership(DirectoryGrant("/etc/fencedlease", lease="my-operator"))
    leadership.install()                                # a Kopf startup handler runs the watch

    @kopf.on.event("configmaps", when=leadership.when)  # only while this replica leads
    async def sync(body, **_):
        api = client.CoreV1Api(leadership.api_client())  # every write stamped with the token
        ...

    kopf.run(standalone=True, stop_flag=leadership.stopped)

A write refused by the fence (``stale_fence``: a newer leader reached the object) means this
replica is no longer the leader whatever its files say: call :meth:`FencedLeadership.refused`
(:meth:`guard` does it for you), and the replica stops leading and sets :attr:`stopped` —
the article's "a stale leader stops".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fencedlease.client.errors import GrantLost
from fencedlease.client.fenced import fence_denial, fenced_async_api_client
from fencedlease.client.grant import Grant, GrantSource

log = logging.getLogger(__name__)
T = TypeVar("T")

STOPPING_CODES = frozenset({"stale_fence", "holder_mismatch", "lease_mismatch", "unknown_token"})
"""Denials after which this replica's grant can never write again."""


class FencedLeadership:
    """This replica's leadership, as its grant says (see the module docstring)."""

    def __init__(self, source: GrantSource, *, min_remaining: float = 0.0) -> None:
        self.source = source
        self.min_remaining = min_remaining
        self.grant: Grant | None = None
        self.stopped = asyncio.Event()
        """Set once a write was refused for good: stop the operator (``kopf.run``'s
        ``stop_flag``)."""
        self.changed = asyncio.Event()
        self._refused: tuple[int, str] | None = None
        self._task: asyncio.Task[None] | None = None

    # --------------------------------------------------------------------- the decision

    def leading(self) -> bool:
        """Held, before its deadline, and never refused by the fence."""
        grant = self.grant
        if grant is None or self.stopped.is_set():
            return False
        if self._refused is not None and self._refused[0] == grant.token:
            return False
        return grant.remaining() > self.min_remaining and grant.held

    def when(self, **_: Any) -> bool:
        """A Kopf ``when=`` filter: handle the event only while this replica leads."""
        return self.leading()

    def token(self) -> int:
        """The token to stamp now (raises :class:`GrantError` when not leading)."""
        grant = self.grant
        if grant is None or not self.leading():
            where = self.source.describe()
            raise GrantLost(f"{where}: this replica does not lead", source=where, grant=grant)
        return grant.token

    def _current(self) -> Grant:
        self.token()  # raises when not leading
        assert self.grant is not None
        return self.grant

    def api_client(self, configuration: Any = None) -> Any:
        """A ``kubernetes_asyncio`` ApiClient stamping this replica's token on every write."""
        return fenced_async_api_client(self._current, configuration)

    # ------------------------------------------------------------------ the fence's word

    def refused(self, status: int, body: Any) -> str | None:
        """Read an API error: a definitive fence denial ends this replica's leadership and
        sets :attr:`stopped`. Returns the fence code (``None``: not a fence denial)."""
        code = fence_denial(status, body)
        if code in STOPPING_CODES:
            token = self.grant.token if self.grant is not None else -1
            self._refused = (token, code)
            log.warning("the fence refused this replica's write (%s): it stops leading", code)
            self.stopped.set()
            self.changed.set()
        return code

    @asynccontextmanager
    async def guard(self) -> AsyncIterator[None]:
        """``async with leadership.guard():`` around writes: a fence denial is read with
        :meth:`refused` before the error propagates."""
        try:
            yield
        except Exception as error:
            status = getattr(error, "status", None)
            if isinstance(status, int):
                self.refused(status, getattr(error, "body", None))
            raise

    # -------------------------------------------------------------------------- watching

    async def run(self) -> None:
        """Follow the grant source (forever; cancel to stop)."""
        async for grant in self.source.awatch(self.stopped):
            before = self.leading()
            self.grant = grant
            if self.leading() != before:
                log.info("fenced leadership: %s", "leading" if self.leading() else "standby")
            self.changed.set()

    def install(self) -> None:
        """Register Kopf startup and cleanup handlers that run and stop :meth:`run`."""
        import kopf

        @kopf.on.startup()
        async def _start_fenced_leadership(**_: Any) -> None:
            self._task = asyncio.create_task(self.run(), name="fenced-leadership")

        @kopf.on.cleanup()
        async def _stop_fenced_leadership(**_: Any) -> None:
            if self._task is not None:
                self._task.cancel()

    async def wait_leading(self) -> None:
        """Until this replica leads (or :attr:`stopped`)."""
        while not self.leading() and not self.stopped.is_set():
            self.changed.clear()
            await self.changed.wait()


async def while_leading(leadership: FencedLeadership, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run ``work`` if this replica leads now (``None`` otherwise), reading a fence denial."""
    if not leadership.leading():
        return None
    async with leadership.guard():
        return await work()
