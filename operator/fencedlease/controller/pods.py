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
    lease, and a scan of the namespace for that cost every renewal O(Pods in the namespace)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, PodInfo]] = {}
        self._annotated: dict[tuple[str, str], dict[str, None]] = {}
        """(namespace, lease) -> names of the Pods with an annotation of that lease (ordered)."""

    def _index(self, pod: PodInfo) -> None:
        for lease in leases_annotated(pod):
            self._annotated.setdefault((pod.namespace, lease), {})[pod.name] = None

    def _unindex(self, pod: PodInfo) -> None:
        for lease in leases_annotated(pod):
            names = self._annotated.get((pod.namespace, lease))
            if names is not None:
                names.pop(pod.name, None)
                if not names:
                    del self._annotated[(pod.namespace, lease)]

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
        return self._store(self._pods.setdefault(pod.namespace, {}), pod)

    def refresh(self, pod: PodInfo) -> bool:
        """Replace the cached version of ``pod`` (same uid) with what a write of ours returned;
        never add one. A Pod the watch removed meanwhile (deleted, or out of a scoped watch)
        stays removed: no event would ever take it out again."""
        ns = self._pods.get(pod.namespace, {})
        known = ns.get(pod.name)
        if known is None or known.uid != pod.uid:
            return False
        self._store(ns, pod)
        return True

    def remove(self, namespace: str, name: str) -> PodInfo | None:
        removed = self._pods.get(namespace, {}).pop(name, None)
        if removed is not None:
            self._unindex(removed)
        return removed

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(namespace, {}).get(name)

    def in_namespace(self, namespace: str) -> list[PodInfo]:
        return list(self._pods.get(namespace, {}).values())

    def annotated(self, namespace: str, lease: str) -> list[PodInfo]:
        """The Pods in ``namespace`` that carry any annotation of lease ``lease``."""
        names = self._annotated.get((namespace, lease))
        if not names:
            return []
        ns = self._pods.get(namespace, {})
        return [pod for name in names if (pod := ns.get(name)) is not None]

    def not_listed(self, namespace: str | None, listed: set[tuple[str, str]]) -> list[PodInfo]:
        """Cached Pods (in ``namespace``, or all) missing from a complete list ``listed``."""
        scopes = self._pods.values() if namespace is None else [self._pods.get(namespace, {})]
        return [p for ns in scopes for p in ns.values() if (p.namespace, p.name) not in listed]

    def __len__(self) -> int:
        return sum(len(ns) for ns in self._pods.values())

    def candidates(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        return [p for p in self._pods.get(namespace, {}).values() if selector.matches(p.labels)]
