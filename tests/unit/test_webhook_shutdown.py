"""Stopping the webhook is bounded, whatever is in flight.

Hardening found while chasing issue 14 item 4's teardown hang (whose root cause was a lost
cancellation: ``tests/unit/test_cancellation.py``): aiohttp's ``runner.cleanup()`` waits up to
its ``shutdown_timeout`` (60 s by default) for a request in flight, twice (before and after
cancelling it), and nothing bounded the Events still queued.  Each test holds the blocking
call on an event nobody sets and proves it reached it (a barrier), then stops under a bound
far below the old waits."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import cast

import aiohttp
import pytest

from fencedlease import metrics
from fencedlease.events import ObjectRef, artifact_ref
from fencedlease.settings import Settings
from fencedlease.webhook.checker import FenceChecker
from fencedlease.webhook.events import BackgroundEvents
from fencedlease.webhook.server import FENCE_PATH, AdmissionServer

from .reviews import art, review
from .test_webhook_timeout import BlockedStore

BOUND = 0.2
"""The shutdown bound the tests configure (the product's default is the check budget + 1 s)."""
LIMIT = 10.0
"""What a test waits at most: well above the fixed code's worst case (2 * BOUND + 1 s, then
the checker's bound), well below the 60 s aiohttp waited before the fix."""


async def _lookup(namespace: str, name: str) -> str | None:
    return "AllowEqual"


async def test_stop_returns_within_the_bound_while_a_review_is_in_flight(tmp_path: Path) -> None:
    settings = Settings(
        webhook_host="127.0.0.1",
        webhook_port=0,
        webhook_cert_dir=tmp_path / "certs",
        webhook_registration="url",
    )
    store = BlockedStore()  # etcd never answers: the review waits on it
    server = AdmissionServer(
        settings,
        store,
        _lookup,
        reload_interval=3600,
        check_timeout=3600,  # the check's own budget never ends the review here
        shutdown_timeout=BOUND,
    )
    assert server.shutdown_timeout == BOUND
    await server.start()
    ctx = ssl.create_default_context(cafile=str(cast(Path, settings.webhook_cert_dir) / "ca.crt"))
    async with aiohttp.ClientSession() as session:
        url = f"https://127.0.0.1:{server.port}{FENCE_PATH}"
        request = asyncio.create_task(session.post(url, json=review("CREATE", art(7)), ssl=ctx))
        try:
            async with asyncio.timeout(LIMIT):
                await store.called.wait()  # the review is in flight, blocked in the store
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with asyncio.timeout(LIMIT):  # a regression fails here, never hangs
                await server.stop()
            elapsed = loop.time() - started
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
    assert not server.running
    assert elapsed < 2 * BOUND + 1.0 + BOUND * 3 + 1.0, elapsed


def test_the_default_shutdown_bound_follows_the_check_budget(tmp_path: Path) -> None:
    settings = Settings(webhook_cert_dir=tmp_path, webhook_timeout_seconds=3)
    server = AdmissionServer(settings, BlockedStore(), _lookup)
    assert server.shutdown_timeout == pytest.approx(server.checker.timeout + 1.0)


class StuckSink:
    """An API server that accepts an Event post and never answers."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.never = asyncio.Event()
        self.cancelled = 0

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.entered.set()
        try:
            await self.never.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def _dropped(cause: str) -> float:
    return metrics.counter_total(metrics.EVENTS_DROPPED, reason="FenceStaleFence", cause=cause)


async def test_queued_events_are_cancelled_and_counted_after_the_bound() -> None:
    sink = StuckSink()
    events = BackgroundEvents(sink)
    before = _dropped("shutdown")
    events.emit(artifact_ref("ns", "cat"), "Warning", "FenceStaleFence", "stale")
    async with asyncio.timeout(LIMIT):
        await sink.entered.wait()  # the post is in flight
    async with asyncio.timeout(LIMIT):  # a regression fails here, never hangs
        await events.close(BOUND)
    assert sink.cancelled == 1
    assert _dropped("shutdown") - before == 1
    assert events.dropped == 1


async def test_checker_stop_is_bounded_with_an_event_in_flight() -> None:
    sink = StuckSink()
    checker = FenceChecker(BlockedStore(), _lookup, sink)
    checker.start()
    checker.events.emit(artifact_ref("ns", "cat"), "Warning", "FenceStaleFence", "stale")
    async with asyncio.timeout(LIMIT):
        await sink.entered.wait()
    async with asyncio.timeout(LIMIT):
        await checker.stop(within=BOUND)
    assert sink.cancelled == 1
