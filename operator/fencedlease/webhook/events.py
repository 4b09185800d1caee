"""Kubernetes Events from the webhook: posted in the background, never on the admission path.

:class:`EventSink` is the one method the webhook needs; the controller's
:class:`fencedlease.controller.kube.KubeClient` already has it (``event(ref, type_, reason,
message)``), and :class:`KubeEvents` is a standalone implementation (namespaced or
cluster-scoped objects).  :class:`BackgroundEvents` wraps any sink so posting an Event never
delays an admission response: Events are queued to tasks and dropped (and logged) when too
many are in flight.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import uuid
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.controller.kube import ObjectRef
from fencedlease.models import rfc3339

log = logging.getLogger(__name__)

COMPONENT = "fencedlease-webhook"


class EventSink(Protocol):
    """Posts one core/v1 Event about ``ref`` (best effort: never raises)."""

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


class KubeEvents:
    """:class:`EventSink` on a kubernetes_asyncio ``ApiClient``.

    Cluster-scoped objects (``ref.namespace == ""``) get their Event in ``default``.
    """

    def __init__(self, api: client.ApiClient, component: str = COMPONENT) -> None:
        self.core = client.CoreV1Api(api)
        self.component = component

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        now = rfc3339(dt.datetime.now(dt.UTC))
        namespace = ref.namespace or "default"
        body: Any = {
            "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "kind": ref.kind,
                "apiVersion": ref.api_version,
                "namespace": ref.namespace or None,
                "name": ref.name,
                "uid": ref.uid or None,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": os.environ.get("HOSTNAME", "local"),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.core.create_namespaced_event(namespace, body)
        except (TimeoutError, ApiException, OSError) as exc:
            log.warning("could not post Event %s on %s/%s: %s", reason, namespace, ref.name, exc)


class BackgroundEvents:
    """Fire-and-forget wrapper: :meth:`emit` returns at once; :meth:`drain` waits (tests, stop)."""

    def __init__(self, sink: EventSink | None, max_in_flight: int = 256) -> None:
        self.sink = sink
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    def emit(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        if self.sink is None:
            return
        if len(self._tasks) >= self.max_in_flight:
            self.dropped += 1
            log.warning(
                "dropping Event %s on %s/%s: too many in flight", reason, ref.namespace, ref.name
            )
            return
        task = asyncio.create_task(self._post(ref, type_, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        assert self.sink is not None
        try:
            await self.sink.event(ref, type_, reason, message)
        except Exception:  # best effort: an Event must never break admission
            log.exception("posting Event %s failed", reason)

    async def drain(self, within: float = 5.0) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=within)
