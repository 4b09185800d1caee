"""``lease_lookup`` implementations: the FencedLease's ``spec.fencingPolicy`` or ``None``.

* :class:`ApiLeaseLookup` GETs the lease on every call (the tests' in-process harness);
* :class:`CachedLeaseLookup` reads the controller's cache first (``role=all``);
* :class:`WatchedLeaseLookup` keeps its own table of policies from a list + watch of
  FencedLeases (``role=webhook``: no Kopf, no controller cache).  Before this, the webhook
  process made an API GET per admission; the profile showed it as 40% of the webhook's CPU
  (docs/performance.md, "The fenced write: nearly free").

Every lookup answers ``None`` for a lease that is being deleted (``metadata.deletionTimestamp``
set, another finalizer still holding it): its tokens and mark are on their way into the
retention window, so it fences no new write (docs/tokens.md, "Retention").

A cache **hit** answers at once; a **miss is never trusted** (the watch may lag behind a lease
created a moment ago): it falls back to the GET, which is authoritative.  A lease deleted a
moment ago may still hit for as long as the watch lags (milliseconds), which is the same window
``role=all`` has always had with the controller's cache: the write is then checked against the
token's grant and the high-water mark in etcd as usual (the policy only chooses ``>=`` or
``>``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fencedlease.authority.types import FencingPolicy, LeaseKey
from fencedlease.kube import KubeApi
from fencedlease.models import GROUP, LEASES, VERSION, FencedLeaseSpec
from fencedlease.watching import ListWatch, Watched

log = logging.getLogger(__name__)


def policy_of(body: dict[str, Any]) -> FencingPolicy:
    """``spec.fencingPolicy`` of a FencedLease body (the CRD's default when absent). Pure."""
    spec = body.get("spec") or {}
    value = spec.get("fencingPolicy") if isinstance(spec, dict) else None
    try:
        return FencingPolicy(str(value or FencingPolicy.ALLOW_EQUAL.value))
    except ValueError:  # the CRD's enum refuses it; the strictest reading if it gets through
        return FencingPolicy.STRICTLY_GREATER


def deleting(body: dict[str, Any]) -> bool:
    """The FencedLease is being deleted (or its metadata cannot be read: the strictest
    reading). Pure."""
    meta = body.get("metadata")
    return not isinstance(meta, dict) or meta.get("deletionTimestamp") is not None


def key_of(body: dict[str, Any]) -> LeaseKey | None:
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return LeaseKey(namespace, name)


class ApiLeaseLookup:
    """GETs the FencedLease from the API server on every call (one round trip)."""

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        body = await self.kube.get_lease(namespace, name)
        if body is None or deleting(body):
            return None
        return policy_of(body)


class _Cache(Protocol):
    """Any cache of FencedLeases by key (the controller's, in a combined process)."""

    def get(self, key: LeaseKey) -> Any: ...


class CachedLeaseLookup:
    """A cache first (no round trip), the API server on a miss.

    A miss is not trusted: the watch may lag behind a lease created a moment ago.
    """

    def __init__(self, cache: _Cache, fallback: ApiLeaseLookup) -> None:
        self.cache = cache
        self.fallback = fallback

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        lease = self.cache.get(LeaseKey(namespace, name))
        spec = getattr(lease, "spec", None)
        if isinstance(spec, FencedLeaseSpec) and getattr(lease, "deleting", True) is False:
            return FencingPolicy(spec.fencing_policy.value)
        return await self.fallback(namespace, name)


@dataclass
class PolicyTable:
    """FencedLease policies by key, kept from list + watch events (pure: no I/O).

    ``synced`` is false until the first list is in and after a watch broke: a table that may
    have missed a deletion is not consulted until it is relisted.
    """

    policies: dict[LeaseKey, FencingPolicy] = field(default_factory=dict)
    synced: bool = False

    def replace(self, items: list[dict[str, Any]]) -> None:
        """A fresh list: everything else is gone."""
        self.policies = {}
        for body in items:
            self.apply(None, body)
        self.synced = True

    def listed(self, keys: set[tuple[str, str]]) -> None:
        """A list is complete (its objects were applied): what it did not show is gone."""
        self.policies = {k: p for k, p in self.policies.items() if tuple(k) in keys}
        self.synced = True

    def apply(self, kind: str | None, body: dict[str, Any]) -> None:
        """One event (``None``: listed, ``ADDED``, ``MODIFIED``, ``DELETED``; others are
        ignored)."""
        key = key_of(body)
        if key is None:
            return
        if kind == "DELETED" or deleting(body):
            # A lease being deleted fences nothing new: ask the API server (authoritative).
            self.policies.pop(key, None)
        elif kind in (None, "ADDED", "MODIFIED"):
            self.policies[key] = policy_of(body)

    def get(self, key: LeaseKey) -> FencingPolicy | None:
        """The cached policy, or ``None`` (a miss, or not synced: ask the API server)."""
        return self.policies.get(key) if self.synced else None


class WatchedLeaseLookup:
    """Policies from a list + watch of FencedLeases (:class:`PolicyTable`), the API server
    on a miss.  :meth:`run` keeps the table; cancel it to stop."""

    def __init__(
        self,
        kube: KubeApi,
        fallback: ApiLeaseLookup,
        namespace: str | None = None,
        *,
        watch_seconds: int = 300,
    ) -> None:
        self.kube = kube
        self.fallback = fallback
        self.namespace = namespace
        self.watch_seconds = watch_seconds
        self.table = PolicyTable()
        self.hits = 0
        self.misses = 0

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        found = self.table.get(LeaseKey(namespace, name))
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        return await self.fallback(namespace, name)

    def _event(self, event: Mapping[str, Any]) -> None:
        self.table.apply(event["type"], event["object"])

    def _broken(self) -> None:
        self.table.synced = False  # it may have missed a deletion: relisted before trusted

    async def run(self) -> None:
        """List, then watch from the list's version (:class:`~fencedlease.watching.ListWatch`);
        after a failure the table is not consulted until relisted.  Runs until cancelled."""
        what = Watched(GROUP, VERSION, LEASES, self.namespace)
        await ListWatch(
            self.kube.api,
            what,
            self._event,
            on_listed=lambda _, keys: self.table.listed(keys),
            on_failure=self._broken,
            server_timeout=self.watch_seconds,
        ).run()
