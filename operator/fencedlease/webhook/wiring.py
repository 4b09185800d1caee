"""Start the webhook part of a process (called by the composition root, :mod:`fencedlease.app`).

Serve the admission paths (``/fence``, ``/fence-release``, ``/fence-claim``, ``/fence-object``);
with ``webhook_registration == "url"`` the server creates the local CA and its serving pair.
Registering the configuration is not the webhook's: :mod:`fencedlease.registration`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
from collections.abc import Callable
from typing import Any

from fencedlease.kube import KubeApi
from fencedlease.settings import EventLoop, Settings
from fencedlease.webhook.checker import FenceStore, LeaseLookup
from fencedlease.webhook.parents import ApiParents
from fencedlease.webhook.server import AdmissionServer

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 10_000
"""The webhook process's youngest-generation GC threshold (CPython's default: 700)."""


def settle_heap(gen0_threshold: int = GEN0_THRESHOLD) -> int:
    """Collect once, move every object alive now into the permanent generation
    (``gc.freeze``), and collect the youngest generation less often; returns the objects frozen.

    For a ``role=webhook`` process once it serves: the modules, clients and caches of startup
    (about 140,000 objects) stay alive for the life of the process, and a full collection would
    walk them all while every review in flight waits; frozen, it walks only what came later. A
    review allocates short-lived containers that reference counting frees at once, so the
    youngest generation is collected less often. Cyclic garbage still goes at the next
    collection; only an object frozen now and later part of a cycle stays (startup objects live
    anyway). Why and how much: docs/performance.md, "The fenced write: nearly free".
    """
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
    return gc.get_freeze_count()


LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def event_loop_factory(choice: EventLoop) -> LoopFactory | None:
    """The loop factory of a ``role=webhook`` process (``None``: asyncio's default loop).

    ``uvloop`` (libuv) when asked for and installed. The webhook's work per review is TLS,
    HTTP and a gRPC round trip, all of it loop and socket code: uvloop's TLS runs in Cython
    over OpenSSL memory BIOs instead of asyncio's pure-Python ``sslproto``, and its transports
    and callbacks are cheaper (docs/performance.md, "The fenced write: nearly free"). aiohttp and
    grpc.aio (the etcd client) run on it unchanged. Not installed (a platform without a
    wheel): asyncio, with a warning, the same answers only slower."""
    if choice is not EventLoop.UVLOOP:
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        log.warning("webhook_event_loop=uvloop but uvloop is not installed: running on asyncio")
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory


async def start_webhook(
    settings: Settings, store: FenceStore, kube: KubeApi, lookup: LeaseLookup
) -> tuple[AdmissionServer, list[asyncio.Task[Any]]]:
    """Start serving; returns the server (its :attr:`~AdmissionServer.serving` is readiness)
    and the tasks to cancel on shutdown (cancelling stops the server).

    Events about cluster-scoped objects (the configuration) go to ``kube``'s home namespace.
    """
    server = AdmissionServer(settings, store, lookup, kube.events, parents=ApiParents(kube.api))
    await server.start()
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(_serve_until_cancelled(server), name="webhook-server")
    ]
    return server, tasks


async def _serve_until_cancelled(server: AdmissionServer) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await server.stop()
