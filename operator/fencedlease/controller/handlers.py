"""Watch events to the controller's caches: the handlers only update a cache and poke a
scheduler.

FencedLease events come from Kopf (``fencedlease/kopfapp.py``, an ``@kopf.on.event``
handler) to :func:`on_lease`. Our list-then-watch loops
(:class:`fencedlease.watching.ListWatch`, wired by :mod:`.runtime`) hand each Pod and
FencedArtifact event to :func:`on_pod` and :func:`on_artifact` (FencedReleases and
FencedClaims to their registries, ``controller/requests.py``), in the order the API server
sent them; a complete list (the first, and each relist after ``410 Gone``) goes to
:func:`pods_listed`, :func:`artifacts_listed`, :func:`releases_listed` and
:func:`claims_listed`, which handle what it no longer shows as deleted (no ``DELETED`` event
comes for what was deleted while no watch was open). Kopf reports no relist: a FencedLease
deleted while its watch was away is forgotten by the reconciler's own pass instead (the
lease holds our finalizer, so only that pass lets it go; docs/design.md, "What is Kopf's and
what is ours"). Every replica, standby included, watches; only the elected one writes,
through the schedulers (``controller/leadership.py``). Nothing here writes to an object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactKey, ArtifactObject
from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.pods import PodInfo
from fencedlease.controller.requests import unlisted
from fencedlease.models import FencedLeaseSpec

if TYPE_CHECKING:
    from fencedlease.controller.runtime import Controller

log = logging.getLogger(__name__)


def on_lease(rt: Controller, event: Mapping[str, Any]) -> None:
    """One FencedLease watch event: update the cache, poke the lease if it can move."""
    body = event.get("object") or {}
    lease = LeaseObject.from_body(body)
    if event.get("type") == "DELETED":
        lease_gone(rt, lease.key)
        return
    known = rt.leases.get(lease.key)
    foreign = rt.leases.upsert(lease)
    if (
        known is not None
        and _same_for_reconcile(known, lease)
        and rt.leases.unverified(lease.key) is None
        and not foreign
    ):
        return  # e.g. our own status write coming back: the scheduler already has it
    rt.scheduler.poke(lease.key)


def lease_gone(rt: Controller, key: LeaseKey) -> None:
    """FencedLease ``key`` was deleted: forget it, and run one last pass (a lease granted
    this term and deleted before our finalizer landed is released and its holder cleaned
    there; a lease we finalized is a no-op)."""
    rt.leases.remove(key)
    rt.scheduler.forget(key)
    rt.scheduler.poke(key)


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


def on_release_event(rt: Controller, event: Mapping[str, Any]) -> None:
    """One FencedRelease watch event (``controller/releases.py``)."""
    rt.release_requests.on_event(event, rt.scheduler.poke)


def releases_listed(rt: Controller, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete FencedRelease list: forget the releases deleted while no watch was open."""
    rt.release_requests.listed(namespace, listed, rt.scheduler.poke)


def on_claim_event(rt: Controller, event: Mapping[str, Any]) -> None:
    """One FencedClaim watch event (``controller/claims.py``)."""
    rt.claim_requests.on_event(event, rt.scheduler.poke)


def claims_listed(rt: Controller, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete FencedClaim list: forget the claims deleted while no watch was open."""
    rt.claim_requests.listed(namespace, listed, rt.scheduler.poke)


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
    """A complete Pod list (the first one, or a relist after ``410 Gone``): every cached
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


def on_artifact(rt: Controller, event: Mapping[str, Any]) -> None:
    """One FencedArtifact watch event: committed states feed the recorder (high-water mark,
    finalizer, status)."""
    artifact = ArtifactObject.from_body(event.get("object") or {})
    if event.get("type") == "DELETED":
        artifact_gone(rt, artifact.key)
        return
    rt.artifacts.upsert(artifact)
    rt.artifact_scheduler.poke(artifact.key)


def artifact_gone(rt: Controller, key: ArtifactKey) -> None:
    rt.artifacts.remove(key)
    rt.artifact_scheduler.forget(key)


def artifacts_listed(rt: Controller, namespace: str | None, listed: set[tuple[str, str]]) -> None:
    """A complete FencedArtifact list: a cached artifact it does not show was deleted while no
    watch was open: forget it."""
    for key in unlisted(rt.artifacts.all_keys(), namespace, listed):
        log.info("FencedArtifact list: %s/%s is gone (missed while the watch was away)", *key)
        artifact_gone(rt, key)
