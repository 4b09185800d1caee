"""What the operator knows about candidate Pods, and the pure choice of a holder."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fencedlease.models import (
    ANNOTATION_LEASE_ID,
    ANNOTATION_STATE,
    ANNOTATION_TOKEN,
    ANNOTATION_VALID_UNTIL,
    LabelSelector,
)

OUR_ANNOTATIONS = (
    f"{ANNOTATION_TOKEN}/",
    f"{ANNOTATION_LEASE_ID}/",
    f"{ANNOTATION_VALID_UNTIL}/",
    f"{ANNOTATION_STATE}/",
)
"""Prefixes of the only Pod annotations the controller reads (its own downward-API keys)."""


def our_annotations(annotations: Mapping[str, Any]) -> dict[str, str]:
    """The operator's own annotations: the rest of a Pod's (often large: last-applied
    configuration, sidecar injection) is never read, so it is not cached."""
    return {k: str(v) for k, v in annotations.items() if k.startswith(OUR_ANNOTATIONS)}


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The few Pod facts that decide eligibility, taken from a watch event body.

    ``annotations`` holds only the operator's own (:data:`OUR_ANNOTATIONS`)."""

    namespace: str
    name: str
    uid: str
    created: str  # RFC 3339, sorts chronologically
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    running: bool = False
    ready: bool = False
    deleting: bool = False
    resource_version: str = ""
    """The version these facts were read at (empty: unknown, no write precondition)."""

    @property
    def eligible(self) -> bool:
        """A holder must be Running, Ready and not terminating."""
        return self.running and self.ready and not self.deleting

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodInfo:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        conditions = status.get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            created=str(meta.get("creationTimestamp") or ""),
            labels=dict(meta.get("labels") or {}),
            annotations=our_annotations(meta.get("annotations") or {}),
            running=status.get("phase") == "Running",
            ready=ready,
            deleting=meta.get("deletionTimestamp") is not None,
            resource_version=str(meta.get("resourceVersion") or ""),
        )


def choose_holder(candidates: Iterable[PodInfo], current: str | None) -> PodInfo | None:
    """Keep a healthy current holder (no flapping); otherwise the oldest eligible Pod.

    Ties on creation time are broken by name, so every replica makes the same choice.
    """
    eligible = [p for p in candidates if p.eligible]
    for pod in eligible:
        if pod.name == current:
            return pod
    if not eligible:
        return None
    return min(eligible, key=lambda p: (p.created, p.name))


def holds_any(pod: PodInfo) -> bool:
    """``pod`` reads ``held`` for some lease (its downward-API files say so)."""
    prefix = f"{ANNOTATION_STATE}/"
    return any(k.startswith(prefix) and v == "held" for k, v in pod.annotations.items())


DEPARTED_LIMIT = 4096
"""At most this many departed holders are remembered (the oldest are dropped first)."""


def leases_annotated(pod: PodInfo) -> set[str]:
    """The names of the leases ``pod`` carries any of our annotations for."""
    return {
        key[len(prefix) :]
        for key in pod.annotations
        for prefix in OUR_ANNOTATIONS
        if key.startswith(prefix)
    }


class PodCache:
    """Pods by namespace, filled from the Pod watch (no relists), with an index of the Pods
    that carry a lease's annotations: a renewal asks which Pods still read ``held`` for its
    lease, and a scan of the namespace for that cost every renewal O(Pods in the namespace).

    It also remembers **departed holders**: a Pod that left the cache (a ``DELETED`` event,
    or missing from a relist) while it read ``held`` and was not being deleted. With a scoped
    watch that is a holder whose label was removed: it still exists, the controller no
    longer sees it, and its downward-API files would say ``held`` until ``valid-until``
    passed. :meth:`annotated` keeps returning it, so the pass that hands its lease over marks
    it ``lost`` first (:meth:`~.podwrites.PodWrites.mark_lost`). It is forgotten once it
    reads ``held`` for no lease (:meth:`refresh`), is gone (:meth:`gone`), comes back into the watch
    (:meth:`upsert`), or when more than :data:`DEPARTED_LIMIT` are remembered."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, PodInfo]] = {}
        self._annotated: dict[tuple[str, str], dict[str, None]] = {}
        """(namespace, lease) -> names of the Pods with an annotation of that lease (ordered)."""
        self._departed: dict[tuple[str, str], PodInfo] = {}
        self._departed_annotated: dict[tuple[str, str], dict[str, None]] = {}

    def _index(
        self, pod: PodInfo, index: dict[tuple[str, str], dict[str, None]] | None = None
    ) -> None:
        index = self._annotated if index is None else index
        for lease in leases_annotated(pod):
            index.setdefault((pod.namespace, lease), {})[pod.name] = None

    def _unindex(
        self, pod: PodInfo, index: dict[tuple[str, str], dict[str, None]] | None = None
    ) -> None:
        index = self._annotated if index is None else index
        for lease in leases_annotated(pod):
            names = index.get((pod.namespace, lease))
            if names is not None:
                names.pop(pod.name, None)
                if not names:
                    del index[(pod.namespace, lease)]

    def _depart(self, pod: PodInfo) -> None:
        self._forget_departed(pod.namespace, pod.name)
        if pod.deleting or not holds_any(pod):
            return
        while len(self._departed) >= DEPARTED_LIMIT:
            self._forget_departed(*next(iter(self._departed)))
        self._departed[(pod.namespace, pod.name)] = pod
        self._index(pod, self._departed_annotated)

    def _forget_departed(self, namespace: str, name: str) -> None:
        known = self._departed.pop((namespace, name), None)
        if known is not None:
            self._unindex(known, self._departed_annotated)

    def _store(self, ns: dict[str, PodInfo], pod: PodInfo) -> PodInfo | None:
        previous = ns.get(pod.name)
        if previous is not None:
            if previous.annotations == pod.annotations:
                ns[pod.name] = pod
                return previous
            self._unindex(previous)
        ns[pod.name] = pod
        self._index(pod)
        return previous

    def upsert(self, pod: PodInfo) -> PodInfo | None:
        """Store ``pod``; return the previous version, if any."""
        self._forget_departed(pod.namespace, pod.name)  # back in view (or a new Pod)
        return self._store(self._pods.setdefault(pod.namespace, {}), pod)

    def refresh(self, pod: PodInfo) -> bool:
        """Replace the cached version of ``pod`` (same uid) with what a write of ours returned;
        never add one. A Pod the watch removed meanwhile (deleted, or out of a scoped watch)
        stays removed: no event would ever take it out again. A departed holder's copy is
        updated the same way, and forgotten once it reads ``held`` for no lease; a Pod that
        left the watch while this write made it read ``held`` (a pass chose it, then a relist
        or a ``DELETED`` event took it out before the write landed) becomes one."""
        ns = self._pods.get(pod.namespace, {})
        known = ns.get(pod.name)
        if known is None:
            # Written, but the watch no longer shows it: it left while we wrote (or before).
            # If our write left it reading held, it is a departed holder from now on.
            departed = self._departed.get((pod.namespace, pod.name))
            if departed is None or departed.uid == pod.uid:
                self._depart(pod)
            return False
        if known.uid != pod.uid:
            return False
        self._store(ns, pod)
        return True

    def remove(self, namespace: str, name: str) -> PodInfo | None:
        """Take a Pod out of the cache (deleted, or out of the watch's scope); a holder that
        was not being deleted is remembered as departed."""
        removed = self._pods.get(namespace, {}).pop(name, None)
        if removed is not None:
            self._unindex(removed)
            self._depart(removed)
        return removed

    def gone(self, namespace: str, name: str, uid: str) -> None:
        """The API server has no Pod ``name`` of this ``uid`` any more: forget it as a
        departed holder."""
        departed = self._departed.get((namespace, name))
        if departed is not None and (not uid or departed.uid == uid):
            self._forget_departed(namespace, name)

    def departed(self) -> int:
        return len(self._departed)

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> list[PodInfo]:
        return list(self._pods.get(namespace, {}).values())

    def annotated(self, namespace: str, lease: str) -> list[PodInfo]:
        """The Pods in ``namespace`` that carry any annotation of lease ``lease``, departed
        holders included (:class:`PodCache`)."""
        names = self._annotated.get((namespace, lease))
        ns = self._pods.get(namespace, {})
        found = [pod for name in names or () if (pod := ns.get(name)) is not None]
        for name in self._departed_annotated.get((namespace, lease), ()):
            found.append(self._departed[(namespace, name)])
        return found

    def not_listed(self, namespace: str | None, listed: set[tuple[str, str]]) -> list[PodInfo]:
        """Cached Pods (in ``namespace``, or all) missing from a complete list ``listed``."""
        scopes = self._pods.values() if namespace is None else [self._pods.get(namespace, {})]
        return [p for ns in scopes for p in ns.values() if (p.namespace, p.name) not in listed]

    def __len__(self) -> int:
        return sum(len(ns) for ns in self._pods.values())

    def candidates(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        return [p for p in self._pods.get(namespace, {}).values() if selector.matches(p.labels)]
