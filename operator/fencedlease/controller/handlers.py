"""Kopf handlers: they only feed the controller's caches and poke its schedulers.

Kopf watches FencedLeases, Pods and FencedArtifacts; the schedulers run
:class:`~.reconciler.LeaseReconciler` and :class:`~.artifacts.ArtifactRecorder` passes. There
are only ``on.event`` handlers, so Kopf itself writes nothing (no finalizer, no progress or
diff-base annotations): every replica, standby included, watches; only the elected one writes,
through the schedulers (``controller/leadership.py``). The lease finalizer is the reconciler's.

FencedLease and Pod events do not go through Kopf's per-object workers: Kopf's watch loop
(list, resume, relist after ``410 Gone``, server-side label selector, reconnects) hands each
event straight to :func:`on_lease` / :func:`on_pod` (:func:`dispatch_directly`), which only
update a cache and poke the scheduler. Kopf's event processing (its per-object memory, diff
base, handler invocation) cost more CPU than the rest of a renewal's operator work and about
a millisecond of every grant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import kopf
from kopf._cogs.clients import fetching, watching

from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactObject
from fencedlease.controller.claims import on_claim
from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.controller.releases import on_release
from fencedlease.health import WatchActivity
from fencedlease.models import (
    ARTIFACTS,
    CLAIMS,
    GROUP,
    LEASES,
    RELEASES,
    VERSION,
    FencedLeaseSpec,
)
from fencedlease.settings import StartupError

if TYPE_CHECKING:
    from fencedlease.controller.runtime import Controller

log = logging.getLogger(__name__)
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
    """Kopf's handler (it makes Kopf watch FencedLeases); with :func:`dispatch_directly`
    installed, the events never reach it."""
    on_lease(_controller(memo), event)


def on_lease(rt: Controller, event: Mapping[str, Any]) -> None:
    """One FencedLease watch event: update the cache, poke the lease if it can move."""
    body = event.get("object") or {}
    lease = LeaseObject.from_body(body)
    if event.get("type") == "DELETED":
        rt.leases.remove(lease.key)
        rt.scheduler.forget(lease.key)
        # One last pass: a lease granted this term and deleted before our finalizer landed is
        # released and its holder cleaned there (a lease we finalized is a no-op).
        rt.scheduler.poke(lease.key)
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


@kopf.on.event(GROUP, VERSION, RELEASES, registry=registry)
async def release_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Kopf's handler (it makes Kopf watch FencedReleases; ``controller/releases.py``)."""
    rt = _controller(memo)
    on_release(rt.reconciler.releases.requests, rt.scheduler.poke, event)


@kopf.on.event(GROUP, VERSION, CLAIMS, registry=registry)
async def claim_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Kopf's handler (it makes Kopf watch FencedClaims; ``controller/claims.py``)."""
    rt = _controller(memo)
    on_claim(rt.reconciler.claims.requests, rt.scheduler.poke, event)


@kopf.on.event(*POD_RESOURCE, registry=registry)
async def pod_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Kopf's handler (it makes Kopf watch Pods); with :func:`dispatch_directly` installed,
    the events never reach it."""
    on_pod(_controller(memo), event)


def on_pod(rt: Controller, event: Mapping[str, Any]) -> None:
    """One Pod watch event."""
    apply_pod(
        rt, PodInfo.from_body(event.get("object") or {}), deleted=event.get("type") == "DELETED"
    )


def apply_pod(rt: Controller, pod: PodInfo, *, deleted: bool) -> None:
    """One Pod seen (or gone, or out of the watch's scope): update the cache, poke the leases
    it can move."""
    previous = rt.pods.remove(pod.namespace, pod.name) if deleted else rt.pods.upsert(pod)
    if not deleted and previous is not None and _same_for_leases(previous, pod):
        return  # e.g. our own annotation write coming back (every renewal): no lease to scan
    labels = [pod.labels] if previous is None else [pod.labels, previous.labels]
    touching = rt.leases.touching(pod.namespace, labels, pod.name)
    for key in leases_moved(touching, previous, pod, deleted=deleted):
        rt.scheduler.poke(key)


def leases_moved(
    leases: Iterable[LeaseObject], previous: PodInfo | None, pod: PodInfo, *, deleted: bool
) -> list[LeaseKey]:
    """The leases a Pod change can move (pure): those whose selector matches it now or
    matched it before, and the one it holds. A change that moves no lease (our own
    annotations, a status field we do not read) moves none."""
    if not deleted and previous is not None and _same_for_leases(previous, pod):
        return []
    return [
        lease.key
        for lease in leases
        if isinstance(lease.spec, FencedLeaseSpec)
        and (
            lease.spec.holder_selector.matches(pod.labels)
            or (previous is not None and lease.spec.holder_selector.matches(previous.labels))
            or lease.status.holder == pod.name
        )
    ]


def _same_for_leases(a: PodInfo, b: PodInfo) -> bool:
    """Only changes that can move a lease matter (annotations are ours)."""
    return (a.labels, a.eligible, a.uid) == (b.labels, b.eligible, b.uid)


def pods_listed(rt: Controller, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete Pod list (Kopf's first one, or its relist after ``410 Gone``): every cached
    Pod it does not show was deleted, or left the watch's scope, while no watch was open, and
    no ``DELETED`` event will ever come for it; handle it as deleted."""
    stale = rt.pods.not_listed(namespace, listed)
    if stale:
        log.info(
            "Pod list: %d cached Pods are gone or out of scope (missed while the watch was "
            "away): %s",
            len(stale),
            ", ".join(f"{p.namespace}/{p.name}" for p in stale[:10]),
        )
    for pod in stale:
        apply_pod(rt, pod, deleted=True)


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


EventSink = Callable[[Mapping[str, Any]], None]
_direct: dict[tuple[str, str], EventSink] = {}


def dispatch_directly(sinks: Mapping[tuple[str, str], EventSink]) -> None:
    """Hand the watch events of the resources in ``sinks`` (by ``(group, plural)``) to
    ``sinks[...](event)`` as Kopf's watch loop yields them, instead of to Kopf's per-object
    workers and handlers. Kopf keeps everything else of the loop: the list (its objects come
    as events of type ``None``), resuming, the relist after ``410 Gone`` (still reported by
    :func:`observe_pod_lists`), label selectors, reconnects and liveness
    (:func:`observe_watches`); its ``Bookmark`` markers still reach it. A sink must be quick
    and must not block (it runs in the watch loop, in event order); what it raises is logged
    and the stream goes on (as Kopf does for an ``on.event`` handler). Wraps Kopf's
    ``watching.infinite_watch`` once per process; the latest ``sinks`` win."""
    _direct.clear()
    _direct.update(sinks)
    watching.infinite_watch = _dispatching(watching.infinite_watch)


def _dispatching(original: Any) -> Any:
    if getattr(original, "_fencedlease_direct", False):
        return original

    async def stream(*, resource: Any, **kwargs: Any) -> AsyncIterator[Any]:
        which = (str(getattr(resource, "group", "")), str(getattr(resource, "plural", "")))
        async for item in original(resource=resource, **kwargs):
            sink = _direct.get(which)
            if sink is None or not isinstance(item, dict) or item.get("type") == "BOOKMARK":
                yield item  # Kopf's own markers, the API's bookmarks, undirected resources
                continue
            try:
                sink(item)
            except Exception:
                log.exception("handling a %s watch event failed; ignored", which[1])

    stream._fencedlease_direct = True  # type: ignore[attr-defined]
    return stream


_pod_lists: list[Callable[[str | None, set[tuple[str, str]]], None]] = []


def observe_pod_lists(on_listed: Callable[[str | None, set[tuple[str, str]]], None]) -> None:
    """Call ``on_listed(namespace, {(namespace, name), ...})`` after each *complete* Pod list
    of Kopf's watch loop (its first list, and the relist that follows a ``410 Gone``: Kopf
    replays the listed Pods as events but says nothing of those that vanished meanwhile).
    A list that fails or is cancelled part way reports nothing. Wraps Kopf's
    ``fetching.fetch_objs`` once per process (like :func:`observe_watches`, after it); the
    latest ``on_listed`` wins."""
    _pod_lists[:] = [on_listed]
    fetching.fetch_objs = _listing_pods(fetching.fetch_objs)


def _listing_pods(original: Any) -> Any:
    if getattr(original, "_fencedlease_lists", False):
        return original

    async def fetch(*, resource: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if getattr(resource, "plural", None) != "pods":
            async for item in original(resource=resource, **kwargs):
                yield item
            return
        listed: set[tuple[str, str]] = set()
        async for chunk, version in original(resource=resource, **kwargs):
            for body in chunk:
                meta = body.get("metadata") or {}
                listed.add((str(meta.get("namespace", "")), str(meta.get("name", ""))))
            yield chunk, version
        for on_listed in _pod_lists:
            on_listed(kwargs.get("namespace"), listed)

    fetch._fencedlease_lists = True  # type: ignore[attr-defined]
    # Keep observe_watches' mark: it must not wrap this wrapper again.
    fetch._fencedlease_observed = getattr(original, "_fencedlease_observed", False)  # type: ignore[attr-defined]
    return fetch


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
