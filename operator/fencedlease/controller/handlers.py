"""Kopf handlers: they only feed the controller's caches and poke its schedulers.

Kopf watches FencedLeases, Pods and FencedArtifacts; the schedulers run
:class:`~.reconciler.LeaseReconciler` and :class:`~.artifacts.ArtifactRecorder` passes. There
are only ``on.event`` handlers, so Kopf itself writes nothing (no finalizer, no progress or
diff-base annotations): every replica, standby included, watches; only the elected one writes,
through the schedulers (``controller/leadership.py``). The lease finalizer is the reconciler's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import kopf
from kopf._cogs.clients import fetching, watching

from fencedlease.controller.artifacts import ArtifactObject
from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.health import WatchActivity
from fencedlease.models import ARTIFACTS, GROUP, LEASES, VERSION, FencedLeaseSpec
from fencedlease.settings import StartupError

if TYPE_CHECKING:
    from fencedlease.controller.runtime import Controller

registry = kopf.OperatorRegistry()

POD_RESOURCE = ("", "v1", "pods")
"""Kopf's selector of the Pod watch (handler and ``label_selectors`` key)."""


def _controller(memo: Any) -> Controller:
    controller: Controller = memo.controller
    return controller


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (no client library needed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.event(GROUP, VERSION, LEASES, registry=registry)
async def lease_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    rt = _controller(memo)
    body = event.get("object") or {}
    lease = LeaseObject.from_body(body)
    if event.get("type") == "DELETED":
        rt.leases.remove(lease.key)
        rt.scheduler.forget(lease.key)
        return
    known = rt.leases.get(lease.key)
    rt.leases.upsert(lease)
    if (
        known is not None
        and _same_for_reconcile(known, lease)
        and rt.leases.unverified(lease.key) is None
    ):
        return  # e.g. our own status write coming back: the scheduler already has it
    rt.scheduler.poke(lease.key)


def _same_for_reconcile(a: LeaseObject, b: LeaseObject) -> bool:
    """Only spec (generation), annotations (force release), finalizers and deletion can move
    a lease."""
    return (a.uid, a.generation, a.annotations, a.deleting, a.finalizers) == (
        b.uid,
        b.generation,
        b.annotations,
        b.deleting,
        b.finalizers,
    )


@kopf.on.event(*POD_RESOURCE, registry=registry)
async def pod_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    rt = _controller(memo)
    pod = PodInfo.from_body(event.get("object") or {})
    if event.get("type") == "DELETED":
        previous = rt.pods.remove(pod.namespace, pod.name)
    else:
        previous = rt.pods.upsert(pod)
    if previous is not None and _same_for_leases(previous, pod) and event.get("type") != "DELETED":
        return
    for lease in rt.leases.in_namespace(pod.namespace):
        if isinstance(lease.spec, FencedLeaseSpec) and (
            lease.spec.holder_selector.matches(pod.labels)
            or (previous is not None and lease.spec.holder_selector.matches(previous.labels))
            or lease.status.holder == pod.name
        ):
            rt.scheduler.poke(lease.key)


def _same_for_leases(a: PodInfo, b: PodInfo) -> bool:
    """Only changes that can move a lease matter (annotations are ours)."""
    return (a.labels, a.eligible, a.uid) == (b.labels, b.eligible, b.uid)


@kopf.on.event(GROUP, VERSION, ARTIFACTS, registry=registry)
async def artifact_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Committed artifact states feed the recorder (high-water mark, finalizer, status)."""
    rt = _controller(memo)
    artifact = ArtifactObject.from_body(event.get("object") or {})
    if event.get("type") == "DELETED":
        rt.artifacts.remove(artifact.key)
        rt.artifact_scheduler.forget(artifact.key)
        return
    rt.artifacts.upsert(artifact)
    rt.artifact_scheduler.poke(artifact.key)


WATCH_CLIENT_TIMEOUT = 330.0
"""Seconds one watch request may last (the API server ends it after 300): a healthy watch
reconnects, and shows activity, at least this often."""

_observed: list[tuple[WatchActivity, Callable[[], float]]] = []


def observe_watches(activity: WatchActivity, clock: Callable[[], float] = time.monotonic) -> None:
    """Record in ``activity`` every list, event, bookmark, connection and disconnection of
    Kopf's watch loops, by resource (liveness: :func:`fencedlease.health.watches_silent`).

    A loop that keeps trying (an API server that is down) shows activity; one that is wedged
    does not. Kopf has no public hook for its streams (bookmarks never reach handlers), so
    this wraps its ``watching.watch_objs`` and ``fetching.fetch_objs`` once per process;
    ``tests/unit/test_health.py`` fails if Kopf renames them. The latest ``activity`` wins
    (one controller per process)."""
    _observed[:] = [(activity, clock)]
    watching.watch_objs = _observed_stream(watching.watch_objs)
    fetching.fetch_objs = _observed_stream(fetching.fetch_objs)


def _saw(resource: Any) -> None:
    for target, now in _observed:
        target.saw(str(getattr(resource, "plural", resource)), now())


def _observed_stream(original: Any) -> Any:
    if getattr(original, "_fencedlease_observed", False):
        return original

    async def stream(*, resource: Any, **kwargs: Any) -> AsyncIterator[Any]:
        _saw(resource)
        try:
            async for item in original(resource=resource, **kwargs):
                _saw(resource)
                yield item
        finally:
            _saw(resource)

    stream._fencedlease_observed = True  # type: ignore[attr-defined]
    return stream


def kopf_settings(pod_selector: str | None = None) -> kopf.OperatorSettings:
    """Kopf settings: watch timeouts against silent streams; Pods scoped by ``pod_selector``.

    ``pod_selector`` (a label selector every candidate Pod carries) goes to the API server as
    ``labelSelector`` on the Pod list and every Pod watch request (Kopf's
    ``settings.watching.label_selectors``, Kopf >= 1.45): Pods without it are never sent,
    cached or handled. A Pod that stops matching arrives as ``DELETED`` (the API server's
    rule for a filtered watch), one that starts matching as ``ADDED``. FencedLeases and
    FencedArtifacts are never filtered.

    Kopf's finalizer must not be ours: with no changing handlers Kopf removes "its" finalizer
    from every object it sees, so it keeps its default marker (never present) and the
    reconciler owns ``fencedlease.io/finalizer``."""
    ks = kopf.OperatorSettings()
    if pod_selector:
        selectors = getattr(ks.watching, "label_selectors", None)
        if selectors is None:
            raise StartupError(
                f"pod_selector needs Kopf >= 1.45 (server-side label selectors); Kopf "
                f"{getattr(kopf, '__version__', '?')} is installed"
            )
        selectors[POD_RESOURCE] = pod_selector
    ks.watching.server_timeout = 300
    ks.watching.client_timeout = WATCH_CLIENT_TIMEOUT
    ks.watching.connect_timeout = 30
    ks.watching.inactivity_timeout = 600
    ks.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="fencedlease.io")
    ks.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="fencedlease.io", key="last-handled-configuration"
    )
    ks.posting.level = logging.WARNING
    ks.networking.request_timeout = 30
    return ks
