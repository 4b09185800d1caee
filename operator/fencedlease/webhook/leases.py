"""``lease_lookup`` implementations: the FencedLease's ``spec.fencingPolicy`` or ``None``."""

from __future__ import annotations

from typing import Any, Protocol

from fencedlease.authority.types import FencingPolicy, LeaseKey
from fencedlease.kube import KubeClient
from fencedlease.models import FencedLeaseSpec


class ApiLeaseLookup:
    """GETs the FencedLease from the API server on every call (one round trip)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        body = await self.kube.get_lease(namespace, name)
        if body is None:
            return None
        spec = body.get("spec") or {}
        return FencingPolicy(str(spec.get("fencingPolicy") or FencingPolicy.ALLOW_EQUAL.value))


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
        if isinstance(spec, FencedLeaseSpec):
            return FencingPolicy(spec.fencing_policy.value)
        return await self.fallback(namespace, name)
