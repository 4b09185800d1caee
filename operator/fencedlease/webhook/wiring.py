"""Start the webhook part of a process (called by the composition root, :mod:`fencedlease.app`).

Serve ``/fence``; with ``webhook_registration == "url"`` also create the local CA, register the
MutatingWebhookConfiguration by URL and keep it registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fencedlease.kube import KubeClient
from fencedlease.settings import Settings, WebhookRegistration
from fencedlease.webhook.checker import FenceStore, LeaseLookup
from fencedlease.webhook.registration import ensure_registered
from fencedlease.webhook.server import AdmissionServer

log = logging.getLogger(__name__)


async def start_webhook(
    settings: Settings, store: FenceStore, kube: KubeClient, lookup: LeaseLookup
) -> tuple[AdmissionServer, list[asyncio.Task[Any]]]:
    """Start serving; returns the server (its :attr:`~AdmissionServer.serving` is readiness)
    and the tasks to cancel on shutdown (cancelling stops the server).

    Events about cluster-scoped objects (the configuration) go to ``kube``'s home namespace.
    """
    server = AdmissionServer(settings, store, lookup, kube.events)
    await server.start()
    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(_serve_until_cancelled(server), name="webhook-server")
    ]
    if settings.webhook_registration is WebhookRegistration.URL:
        registration = await ensure_registered(settings, server.port, kube.api, events=kube.events)
        tasks.append(asyncio.create_task(registration.watch(), name="webhook-registration"))
    return server, tasks


async def _serve_until_cancelled(server: AdmissionServer) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await server.stop()
