"""The store's fence paths as the webhook and the controller use them: one read
(``grant_and_mark``) decided by the pure rule, and ``record_commit`` for committed writes."""

from __future__ import annotations

from fencedlease.authority import fence as fencing
from fencedlease.authority.types import (
    FenceCode,
    FenceResult,
    FencingPolicy,
    LeaseKey,
    TokenGrant,
)
from fencedlease.store.etcd import EtcdStore

NS = "default"


async def check(
    store: EtcdStore,
    name: str,
    token: int,
    policy: FencingPolicy = FencingPolicy.ALLOW_EQUAL,
    *,
    holder: str | None = None,
    namespace: str = NS,
) -> FenceResult:
    """The webhook's verdict on a spec write of ``token`` to an artifact of lease ``name``."""
    read = await store.grant_and_mark(namespace, name, token)
    result, _ = fencing.evaluate(
        LeaseKey(namespace, name),
        read.grant,
        read.mark,
        token,
        policy,
        holder=holder,
        generation=read.generation,
    )
    return result


async def publish(store: EtcdStore, name: str, token: int, **kwargs: object) -> FenceCode:
    """:func:`check`, then what the controller does once such a write is stored."""
    result = await check(store, name, token, **kwargs)  # type: ignore[arg-type]
    if result.code is FenceCode.APPLIED:
        assert (await store.record_commit(NS, name, token)).verified
    return result.code


async def granted(store: EtcdStore, token: int) -> TokenGrant | None:
    """What ``token`` was issued for, in any lease (``None``: no record, no grant version)."""
    return (await store.grant_and_mark(NS, "any", token)).grant


def cached_leases(store: EtcdStore) -> int:
    """Leases the store holds anything about in memory (its caches' largest key set)."""
    return len(store._known.keys() | store._observations.keys() | store._lease_keys.keys())
