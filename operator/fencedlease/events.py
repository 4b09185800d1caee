"""Kubernetes Events: one implementation for the controller and the webhook.

Events are best effort: :meth:`KubeEvents.event` logs a failure and never raises.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.models import GROUP, VERSION, rfc3339

log = logging.getLogger(__name__)

COMPONENT = "fencedlease"


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
    """:class:`EventSink` on a kubernetes_asyncio ``ApiClient``.

    Cluster-scoped objects (``ref.namespace == ""``) get their Event in ``home_namespace``.
    """

    def __init__(
        self, api: client.ApiClient, component: str = COMPONENT, home_namespace: str = "default"
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.component = component
        self.home_namespace = home_namespace
        """Where Events about cluster-scoped objects go (the operator's own namespace)."""

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        now = rfc3339(dt.datetime.now(dt.UTC))
        namespace = ref.namespace or self.home_namespace
        body: Any = {
            "metadata": {"name": f"{ref.name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
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
