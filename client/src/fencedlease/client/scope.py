"""Run one unit of work under a grant, and stop it when the grant is lost.

:class:`GrantScope` takes the current grant from a :class:`~fencedlease.client.grant.GrantSource`
(refusing to start without a held one), then watches the source while the work runs.  The
grant is lost when the source shows another generation (new token or lease id), ``state:
lost``, nothing at all, or when its ``valid-until`` deadline passes without a renewal.

* **asyncio** (``async with``): the task running the block is **cancelled** when the grant is
  lost, and the block ends with :class:`~fencedlease.client.errors.GrantLost` (like
  ``asyncio.timeout`` raises ``TimeoutError``).
* **threads** (``with``): Python cannot stop a thread from outside, so the block stops
  cooperatively: check :meth:`GrantScope.check` (raises ``GrantLost``) or
  :attr:`GrantScope.lost` (a ``threading.Event``) between steps.

Either way this only saves wasted work: a paused process checks nothing, so every protected
write must still carry the token to a resource that enforces it (the fence).

``release_on_exit=Releaser(...)`` (``AsyncReleaser`` for ``async with``) gives the lease back
when the block ends with the grant still held (:mod:`fencedlease.client.release`); the result
is :attr:`GrantScope.released`.

The :func:`under_grant` decorator wraps a function (sync or async) in a scope and passes the
scope as its first argument.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fencedlease.client._compat import uncancel
from fencedlease.client.errors import GrantAbsent, GrantLost
from fencedlease.client.grant import Grant, GrantSource, GrantState, require
from fencedlease.client.release import AsyncReleaser, Releaser, ReleaseResult

R = TypeVar("R")


class GrantScope:
    """One unit of work under one grant (see the module docs)."""

    def __init__(
        self,
        source: GrantSource,
        *,
        min_remaining: float = 0.0,
        on_lost: Callable[[GrantScope], None] | None = None,
        cancel: bool = True,
        release_on_exit: Releaser | AsyncReleaser | None = None,
    ) -> None:
        self.source = source
        self.release_on_exit = release_on_exit
        self.released: ReleaseResult | None = None
        """What releasing on exit answered (``None``: not asked, or the grant was lost)."""
        self.min_remaining = min_remaining
        self.on_lost = on_lost
        self.cancel = cancel
        self.lost = threading.Event()
        """Set once the grant is lost (sync and async)."""
        self.reason = ""
        self._grant: Grant | None = None
        self._current: Grant | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._astop: asyncio.Event | None = None
        self._host: asyncio.Task[Any] | None = None
        self._cancelled = False

    # ------------------------------------------------------------------ what the work sees

    @property
    def grant(self) -> Grant:
        """The grant the work started under (same token for the whole scope)."""
        if self._grant is None:
            raise RuntimeError("the scope has not been entered")
        return self._grant

    @property
    def token(self) -> int:
        return self.grant.token

    @property
    def current(self) -> Grant:
        """The latest reading of the same generation (renewals move ``valid_until``)."""
        return self._current or self.grant

    def remaining(self) -> float:
        return 0.0 if self.lost.is_set() else self.current.remaining()

    def check(self, min_remaining: float = 0.0) -> Grant:
        """Raise :class:`GrantLost` if the grant is lost (or has less than ``min_remaining``
        seconds left); else return the current grant."""
        if not self.lost.is_set() and self.current.status() is not GrantState.HELD:
            self._lose(f"deadline {self.current.valid_until.isoformat()} passed")
        if self.lost.is_set():
            raise GrantLost(self._message(), source=self.source.describe(), grant=self.current)
        if min_remaining and self.current.remaining() < min_remaining:
            raise GrantLost(
                f"{self._message()}: {self.current.remaining():.1f}s left, need {min_remaining}s",
                source=self.source.describe(),
                grant=self.current,
            )
        return self.current

    # ------------------------------------------------------------------ loss detection

    def _message(self) -> str:
        g = self.current
        return (
            f"lease {g.lease or '?'}: grant {g.lease_id} (token {g.token}) "
            f"{'lost: ' + self.reason if self.reason else 'held'}"
        )

    def _start(self, grant: Grant | None) -> None:
        self._grant = self._current = require(grant, self.source.describe(), self.min_remaining)

    def _observe(self, seen: Grant | None) -> None:
        grant = self.grant
        if seen is None:
            self._lose("the grant disappeared")
        elif not grant.same_generation(seen):
            self._lose(f"a new generation (token {seen.token}, lease id {seen.lease_id})")
        elif seen.state != "held":
            self._current = seen
            self._lose(f"state is {seen.state!r}")
        else:
            self._current = seen  # a renewal: same generation, later deadline

    def _lose(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.reason = reason
        self.lost.set()
        if self.on_lost is not None:
            self.on_lost(self)
        host = self._host
        if host is not None and self.cancel and not host.done():
            self._cancelled = True
            try:
                same_loop = asyncio.get_running_loop() is host.get_loop()
            except RuntimeError:
                same_loop = False
            if same_loop:
                host.cancel()
            else:
                host.get_loop().call_soon_threadsafe(host.cancel)

    # ------------------------------------------------------------------ threads

    def __enter__(self) -> GrantScope:
        self._start(self.source.read())
        watcher = threading.Thread(target=self._watch, name="fencedlease-grant-watch", daemon=True)
        clock = threading.Thread(target=self._clock, name="fencedlease-grant-clock", daemon=True)
        self._threads = [watcher, clock]
        for t in self._threads:
            t.start()
        return self

    def _watch(self) -> None:
        try:
            for seen in self.source.watch(self._stop):
                if self._stop.is_set():
                    return
                self._observe(seen)
        except Exception as exc:  # a watch that breaks leaves the work without evidence
            self._lose(f"watching {self.source.describe()} failed: {exc}")

    def _clock(self) -> None:
        while not self._stop.is_set() and not self.lost.is_set():
            left = self.current.remaining()
            if left <= 0:
                self._lose(f"deadline {self.current.valid_until.isoformat()} passed")
                return
            self._stop.wait(min(left, 0.5))

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        releaser = self.release_on_exit
        if releaser is not None and self._grant is not None and not self.lost.is_set():
            if not isinstance(releaser, Releaser):
                raise TypeError("a sync GrantScope releases with a Releaser, not AsyncReleaser")
            self.released = releaser.release(self._lease(), grant=self._grant)

    def _lease(self) -> str:
        lease = self.source.lease or (self._grant.lease if self._grant else None)
        if lease is None:
            raise GrantAbsent("release_on_exit needs the lease name", source=self.source.describe())
        return lease

    # ------------------------------------------------------------------ asyncio

    async def __aenter__(self) -> GrantScope:
        self._start(await self.source.aread())
        self._host = asyncio.current_task()
        self._astop = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._awatch(), name="fencedlease-grant-watch"),
            asyncio.create_task(self._aclock(), name="fencedlease-grant-clock"),
        ]
        return self

    async def _awatch(self) -> None:
        assert self._astop is not None
        try:
            async for seen in self.source.awatch(self._astop):
                self._observe(seen)
                if self.lost.is_set():
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._lose(f"watching {self.source.describe()} failed: {exc}")

    async def _aclock(self) -> None:
        while not self.lost.is_set():
            left = self.current.remaining()
            if left <= 0:
                self._lose(f"deadline {self.current.valid_until.isoformat()} passed")
                return
            await asyncio.sleep(min(left, 0.5))

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, *tb: object
    ) -> None:
        assert self._astop is not None
        self._astop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        host = self._host
        self._host = None
        releaser = self.release_on_exit
        if releaser is not None and self._grant is not None and not self.lost.is_set():
            if not isinstance(releaser, AsyncReleaser):
                raise TypeError("async with GrantScope releases with an AsyncReleaser")
            self.released = await releaser.release(self._lease(), grant=self._grant)
        # We cancelled the block: turn that cancellation into GrantLost (unless someone else
        # cancelled the task too).
        if (
            self._cancelled
            and host is not None
            and uncancel(host) == 0
            and exc_type is asyncio.CancelledError
        ):
            raise GrantLost(
                self._message(), source=self.source.describe(), grant=self.current
            ) from exc


def under_grant(
    source: GrantSource, **options: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: run the function in a :class:`GrantScope` (passed as its first argument).

    An ``async def`` is cancelled when the grant is lost (``GrantLost`` is raised); a plain
    function checks ``scope.check()`` / ``scope.lost`` itself.  Without a held grant at the
    call, :class:`~fencedlease.client.errors.GrantAbsent` / ``GrantLost`` / ``GrantExpired``
    is raised and the function does not run.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                async with GrantScope(source, **options) as scope:
                    return await fn(scope, *args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with GrantScope(source, **options) as scope:
                return fn(scope, *args, **kwargs)

        return run

    return decorate


async def run_under_grant(
    source: GrantSource, work: Callable[[GrantScope], Awaitable[R]], **options: Any
) -> R:
    """``await work(scope)`` in a :class:`GrantScope`; cancelled with ``GrantLost`` on loss."""
    async with GrantScope(source, **options) as scope:
        return await work(scope)


__all__ = ["GrantAbsent", "GrantLost", "GrantScope", "run_under_grant", "under_grant"]
