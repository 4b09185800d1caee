"""role=webhook's lease policy table follows FencedLeases through a real API server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from fencedlease.authority.types import FencingPolicy, LeaseKey
from fencedlease.kube import KubeApi
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import GROUP, LEASES, VERSION
from fencedlease.webhook.leases import ApiLeaseLookup, WatchedLeaseLookup

from .fence_harness import api_client

pytestmark = pytest.mark.timeout(90)


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):  # 10 s
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def body(ns: str, name: str, policy: str) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FencedLease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "leaseDurationSeconds": 30,
            "fencingPolicy": policy,
            "holderSelector": {"matchLabels": {"app": name}},
        },
    }


async def test_the_table_follows_create_change_and_delete(
    cluster: LocalCluster, namespace: str
) -> None:
    api = await api_client(cluster.kubeconfig)
    kube = KubeApi(api)
    lookup = WatchedLeaseLookup(kube, ApiLeaseLookup(kube), namespace)
    task = asyncio.create_task(lookup.run())
    key = LeaseKey(namespace, "policy")
    try:
        await until(lambda: lookup.table.synced, "the first list")
        assert await lookup(namespace, "policy") is None  # a miss asks the API server: 404
        await kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, LEASES, body(namespace, "policy", "AllowEqual")
        )
        await until(lambda: lookup.table.get(key) is FencingPolicy.ALLOW_EQUAL, "the lease")
        await kube.custom.patch_namespaced_custom_object(  # type: ignore[call-arg]
            GROUP,
            VERSION,
            namespace,
            LEASES,
            "policy",
            {"spec": {"fencingPolicy": "StrictlyGreater"}},
            _content_type="application/merge-patch+json",
        )
        await until(
            lambda: lookup.table.get(key) is FencingPolicy.STRICTLY_GREATER, "the new policy"
        )
        misses = lookup.misses
        assert await lookup(namespace, "policy") is FencingPolicy.STRICTLY_GREATER
        assert lookup.misses == misses  # answered from the table
        await kube.custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, LEASES, "policy"
        )
        await until(lambda: lookup.table.get(key) is None, "the deletion")
        assert await lookup(namespace, "policy") is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()
