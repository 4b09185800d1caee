"""Kubernetes Events: one implementation for the controller and the webhook.

Events are correlated like client-go's recorder (:mod:`fencedlease.authority.correlation`):
the same reason on the same object is one Event whose ``count`` and ``series`` grow (a PATCH,
not a new object), similar messages are combined, and a flood on one object is rate limited;
what is not posted is counted in ``fencedlease_events_dropped_total`` (docs/operations.md).

Events are best effort: :meth:`KubeEvents.event` logs a failure and never raises.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.authority.correlation import Dropped, EventCorrelator, Record
from fencedlease.models import GROUP, VERSION, rfc3339

log = logging.getLogger(__name__)

COMPONENT = "fencedlease"
MAX_MESSAGE = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """What an Event is about."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str = ""


def lease_ref(namespace: str, name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("FencedLease", f"{GROUP}/{VERSION}", namespace, name, uid)


def artifact_ref(namespace: str, name: str, uid: str = "") -> ObjectRef:
    return ObjectRef("FencedArtifact", f"{GROUP}/{VERSION}", namespace, name, uid)


class EventSink(Protocol):
    """Posts one core/v1 Event about ``ref`` (best effort: never raises)."""

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None: ...


class KubeEvents:
    """:class:`EventSink` on a kubernetes_asyncio ``ApiClient``, correlated.

    Cluster-scoped objects (``ref.namespace == ""``) get their Event in ``home_namespace``.
    ``correlator``: the aggregation and spam-filter decisions (default: client-go's limits on
    the wall clock).  Observations of one (object, type, reason) are posted one at a time, so
    an Event is created before it is patched.  ``correlate=False``: every observation is its
    own Event with count 1 (the controller's lifecycle Events: one per lease transition).
    Each create or patch is bounded by ``request_timeout`` seconds (a timeout is counted as
    ``api_error``), so a series never waits forever on one stuck call.
    """

    def __init__(
        self,
        api: client.ApiClient,
        component: str = COMPONENT,
        home_namespace: str = "default",
        *,
        correlator: EventCorrelator | None = None,
        wall: Callable[[], float] = time.time,
        correlate: bool = True,
        request_timeout: float = 10.0,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.component = component
        self.home_namespace = home_namespace
        """Where Events about cluster-scoped objects go (the operator's own namespace)."""
        self.correlator = correlator or EventCorrelator(wall)
        self.correlate = correlate
        self.wall = wall
        self.request_timeout = request_timeout
        """Seconds one create or patch may take (the observations of a series wait on it)."""
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        message = message[:MAX_MESSAGE]
        if not self.correlate:
            now = self.wall()
            single = Record((ref, type_, reason, message), message, 1, now, now, None)
            try:
                await self._post(ref, type_, reason, single)
            except (TimeoutError, ApiException, OSError) as exc:
                metrics.EVENTS_DROPPED.labels(reason, "api_error").inc()
                log.warning(
                    "could not post Event %s on %s/%s: %s", reason, ref.namespace, ref.name, exc
                )
            return
        async with self._serialized((ref, type_, reason)):
            decision = self.correlator.observe(ref, type_, reason, message)
            if isinstance(decision, Dropped):
                metrics.EVENTS_DROPPED.labels(reason, decision.cause).inc()
                log.debug(
                    "Event %s on %s/%s dropped: %s", reason, ref.namespace, ref.name, decision.cause
                )
                return
            try:
                name = await self._post(ref, type_, reason, decision)
            except (TimeoutError, ApiException, OSError) as exc:
                metrics.EVENTS_DROPPED.labels(reason, "api_error").inc()
                log.warning(
                    "could not post Event %s on %s/%s: %s", reason, ref.namespace, ref.name, exc
                )
                return
            self.correlator.posted(decision, name)

    async def _post(self, ref: ObjectRef, type_: str, reason: str, record: Record) -> str:
        """Patch the series' Event, or create one (also when the patched Event is gone: the
        API server deletes Events after its event TTL); returns the Event's name."""
        namespace = ref.namespace or self.home_namespace
        if record.name is not None:
            try:
                await self.core.patch_namespaced_event(
                    record.name,
                    namespace,
                    _series_patch(record),
                    _request_timeout=self.request_timeout,
                )
                return record.name
            except ApiException as exc:
                if exc.status != 404:
                    raise
        name = f"{ref.name}.{uuid.uuid4().hex[:16]}"
        await self.core.create_namespaced_event(
            namespace,
            self._body(ref, type_, reason, record, name, namespace),
            _request_timeout=self.request_timeout,
        )
        return name

    def _body(
        self, ref: ObjectRef, type_: str, reason: str, record: Record, name: str, namespace: str
    ) -> Any:  # a JSON body where the client's stubs say CoreV1Event
        body: dict[str, Any] = {
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": ref.kind,
                "apiVersion": ref.api_version,
                # The core/v1 API accepts a cluster-scoped object's Event only in "default"
                # unless involvedObject.namespace matches the Event's namespace: a
                # namespace-scoped install may post only in its own namespace.
                "namespace": ref.namespace or (namespace if namespace != "default" else None),
                "name": ref.name,
                "uid": ref.uid or None,
            },
            "type": type_,
            "reason": reason,
            "message": record.message,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": os.environ.get("HOSTNAME", "local"),
            "firstTimestamp": _stamp(record.first),
            "lastTimestamp": _stamp(record.last),
            "count": record.count,
        }
        if record.count > 1:
            body["series"] = _series(record)
        return body

    @asynccontextmanager
    async def _serialized(self, key: Hashable) -> AsyncIterator[None]:
        """One observation of ``key`` at a time; the lock is forgotten when nobody waits."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


def _stamp(seconds: float) -> str:
    return rfc3339(dt.datetime.fromtimestamp(seconds, dt.UTC))


def _micro(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _series(record: Record) -> dict[str, Any]:
    return {"count": record.count, "lastObservedTime": _micro(record.last)}


def _series_patch(record: Record) -> dict[str, Any]:
    return {
        "count": record.count,
        "lastTimestamp": _stamp(record.last),
        "message": record.message,
        "series": _series(record),
    }
