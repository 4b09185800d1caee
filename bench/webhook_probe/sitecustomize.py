"""Loaded by the webhook process that ``bench/webhook_tail.py`` starts (this directory is put
on its ``PYTHONPATH``; ``FENCEDLEASE_BENCH_PROBE`` names the output file): it records, on the
system-wide monotonic clock, when each review entered and left the handler, each etcd read,
each accepted connection, each GC collection and each event-loop stall over 4 ms (seen by a
task that sleeps 1 ms), and writes them as JSON on SIGUSR2. Bench tooling only: nothing in the
operator refers to it, and without the variable it does nothing."""

from __future__ import annotations

import os

if os.environ.get("FENCEDLEASE_BENCH_PROBE"):
    import asyncio
    import gc
    import json
    import signal
    import time
    from types import FrameType
    from typing import Any

    from aiohttp import web_server

    from fencedlease import app
    from fencedlease.store import etcd
    from fencedlease.webhook import server

    _out = os.environ["FENCEDLEASE_BENCH_PROBE"]
    _now = time.monotonic
    _seen: dict[str, list[Any]] = {"conn": [], "req": [], "read": [], "gc": [], "lag": []}

    _connection_made = web_server.Server.connection_made

    def _count_connection(self: Any, handler: Any, transport: Any) -> None:
        _seen["conn"].append(_now())
        _connection_made(self, handler, transport)

    web_server.Server.connection_made = _count_connection  # type: ignore[method-assign]

    _answer = server.AdmissionServer._answer

    async def _timed_answer(self: Any, request: Any) -> Any:
        started = _now()
        try:
            return await _answer(self, request)
        finally:
            _seen["req"].append((started, _now()))

    server.AdmissionServer._answer = _timed_answer  # type: ignore[method-assign]

    _read = etcd.EtcdStore.grant_and_mark

    async def _timed_read(self: Any, *args: Any) -> Any:
        started = _now()
        try:
            return await _read(self, *args)
        finally:
            _seen["read"].append((started, _now()))

    etcd.EtcdStore.grant_and_mark = _timed_read  # type: ignore[method-assign]

    _gc_start = [0.0]

    def _gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_start[0] = _now()
        else:
            _seen["gc"].append((_gc_start[0], _now(), info["generation"]))

    gc.callbacks.append(_gc)

    async def _watch_the_loop() -> None:
        while True:
            before = _now()
            await asyncio.sleep(0.001)
            late = _now() - before
            if late > 0.004:
                _seen["lag"].append((before, late))

    _settle_heap = app.settle_heap
    _tasks: set[asyncio.Task[None]] = set()

    def _settle_and_watch(*args: Any, **kwargs: Any) -> int:
        frozen = _settle_heap(*args, **kwargs)  # called once the webhook serves
        _tasks.add(asyncio.get_running_loop().create_task(_watch_the_loop()))
        return frozen

    app.settle_heap = _settle_and_watch

    def _dump(signum: int, frame: FrameType | None) -> None:
        with open(_out + ".tmp", "w") as file:
            json.dump(_seen, file)
        os.replace(_out + ".tmp", _out)

    signal.signal(signal.SIGUSR2, _dump)
