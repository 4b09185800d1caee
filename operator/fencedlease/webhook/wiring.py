"""Start the webhook inside ``fencedlease run`` (called by ``controller.app.run_operator``).

``role`` all or webhook: serve ``/fence``; with ``webhook_registration == "url"`` also create
the local CA, register the MutatingWebhookConfiguration by URL and keep it registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fencedlease.settings import Settings, WebhookRegistration
from fencedlease.webhook.leases import ApiLeaseLookup, CachedLeaseLookup
from fencedlease.webhook.registration import ensure_registered
from fencedlease.webhook.server import AdmissionServer

log = logging.getLogger(__name__)


async def start_webhook(settings: Settings, runtime: Any) -> list[asyncio.Task[Any]]:
    """Start serving; returns the tasks to cancel on shutdown (cancelling stops the server).

    ``runtime`` is :class:`fencedlease.controller.app.Runtime` (uses ``store``, ``kube.api``
    and ``leases``).
    """
    api = runtime.kube.api
    lookup = CachedLeaseLookup(runtime.leases, ApiLeaseLookup(api))
    events = runtime.kube.events  # Events about cluster-scoped objects go to our namespace
    server = AdmissionServer(settings, runtime.store, lookup, events)
    await server.start()
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(_serve_until_cancelled(server), name="webhook-server")
    ]
    if settings.webhook_registration is WebhookRegistration.URL:
        registration = await ensure_registered(settings, server.port, api, events=events)
        tasks.append(asyncio.create_task(registration.watch(), name="webhook-registration"))
    return tasks


async def _serve_until_cancelled(server: AdmissionServer) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await server.stop()
