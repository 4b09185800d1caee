"""``lease_lookup`` implementations: the FencedLease's ``spec.fencingPolicy`` or ``None``."""

from __future__ import annotations

from typing import Any, Protocol

from kubernetes_asyncio import client

from fencedlease.authority.types import FencingPolicy, LeaseKey
from fencedlease.controller.kube import KubeClient
from fencedlease.models import FencedLeaseSpec


def policy_of(body: dict[str, Any] | None) -> FencingPolicy | None:
    """The policy of a FencedLease object (the CRD default AllowEqual when unset)."""
    if body is None:
        return None
    spec = body.get("spec") or {}
    return FencingPolicy(str(spec.get("fencingPolicy") or FencingPolicy.ALLOW_EQUAL.value))


class ApiLeaseLookup:
    """GETs the FencedLease from the API server on every call (one round trip)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.kube = KubeClient(api)

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        return policy_of(await self.kube.get_lease(namespace, name))


class _LeaseLike(Protocol):
    spec: FencedLeaseSpec | str


class _Cache(Protocol):
    def get(self, key: LeaseKey) -> Any: ...


class CachedLeaseLookup:
    """The controller's watch cache first (no round trip), the API server on a miss.

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
