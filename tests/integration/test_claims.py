"""Per-item work from code, through the real API server, webhook and etcd: worker Pods (API
objects whose Ready condition the test sets) claim items under a template lease with their own
Pod-bound tokens (a Role allowing only ``fencedclaims`` create/get/delete and
``fencedartifacts`` writes), publish each item through the fence, and withdraw the claim.

- several workers process many items concurrently: every item is published exactly once
  (one applied write per item, its artifact written once), under the token of its item lease;
- a worker that stops mid-item: its item is re-claimed by another worker with a greater token
  once its lease lapses, and its late write is refused (``stale_fence``);
- only the Pod a claim names may make or withdraw it (the webhook), and finished items' leases
  are deleted.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from fencedlease.client import (
    Applied,
    AsyncClaimer,
    AsyncKubeClient,
    AsyncPublisher,
    ClaimBusy,
    Claimed,
    ClaimRefused,
    RetryPolicy,
    StaleFence,
)
from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import apply, set_ready, wait_for
from .workers import claim_template, pod_config, worker_pods

pytestmark = pytest.mark.timeout(300)

TEMPLATE = "items"
ROLES = {
    "claimer": ("create,get,delete", "fencedclaims.fencedlease.io"),
    "publisher": ("get,create,update,patch", "fencedartifacts.fencedlease.io"),
}


FAST = RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.2)


async def work(
    cluster: LocalCluster, ns: str, pod: str, uid: str, token: str, items: list[str]
) -> Counter[str]:
    """One worker: claim each unfinished item, publish it if nobody did, withdraw the claim;
    go round again until every item has its artifact. Returns its results by code."""
    seen: Counter[str] = Counter()
    async with AsyncKubeClient(pod_config(cluster, token, ns)) as kube:
        claimer = AsyncClaimer(kube, pod=pod, pod_uid=uid)
        publisher = AsyncPublisher(kube, retry=FAST)
        left = list(items)
        random.Random(pod).shuffle(left)
        while left:
            for item in list(left):
                claimed = await claimer.claim(TEMPLATE, item, wait=15)
                seen[claimed.code] += 1
                if isinstance(claimed, ClaimBusy):
                    continue  # another worker has it: maybe later
                assert isinstance(claimed, Claimed), claimed
                path = f"/apis/fencedlease.io/v1alpha1/namespaces/{ns}/fencedartifacts/out-{item}"
                if (await kube.request("GET", path)).status_code == 404:
                    result = await publisher.publish(
                        f"out-{item}",
                        object_ref=f"{item}@{pod}",
                        lease=claimed.lease,
                        token=claimed.token,
                        operation_id=item,
                    )
                    seen[result.code] += 1
                    assert isinstance(result, Applied), result
                await claimer.done(TEMPLATE, item)
                left.remove(item)
            await asyncio.sleep(0.05)
    return seen


async def test_workers_publish_every_item_exactly_once_under_the_fence(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess
) -> None:
    ns = namespace
    names = [f"w-{i}" for i in range(4)]
    pods = await asyncio.to_thread(worker_pods, cluster, ns, ROLES, *names)
    await asyncio.to_thread(apply, cluster, claim_template(ns, TEMPLATE, duration=10))
    items = [f"item-{i:03d}" for i in range(40)]
    results = await asyncio.wait_for(
        asyncio.gather(*(work(cluster, ns, n, *pods[n], items) for n in names)), 240
    )
    total: Counter[str] = sum(results, Counter())
    assert total["applied"] == len(items), total  # each item applied once, by one worker
    out = await asyncio.to_thread(cluster.kubectl, "get", "fencedartifacts", "-n", ns, "-o", "json")
    import json

    artifacts = {a["metadata"]["name"]: a for a in json.loads(out.stdout)["items"]}
    assert sorted(artifacts) == sorted(f"out-{i}" for i in items)
    for item in items:
        art = artifacts[f"out-{item}"]
        assert art["metadata"]["generation"] == 1, art  # written once
        assert art["spec"]["leaseRef"]["name"] == f"{TEMPLATE}-{item}"
    # Finished items' leases are deleted once unclaimed (their tokens stay refused in etcd).
    await asyncio.to_thread(
        wait_for,
        lambda: (
            cluster.kubectl("get", "fl", "-n", ns, "-o", "name").stdout.split()
            == [f"fencedlease.fencedlease.io/{TEMPLATE}"]
        ),
        30.0,
        "item leases deleted",
    )


async def test_a_stopped_workers_item_is_reclaimed_and_its_late_write_refused(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess
) -> None:
    ns = namespace
    pods = await asyncio.to_thread(worker_pods, cluster, ns, ROLES, "stuck", "live", "other")
    await asyncio.to_thread(apply, cluster, claim_template(ns, TEMPLATE, duration=2))
    (s_uid, s_token), (l_uid, l_token) = pods["stuck"], pods["live"]
    async with (
        AsyncKubeClient(pod_config(cluster, s_token, ns)) as stuck_kube,
        AsyncKubeClient(pod_config(cluster, l_token, ns)) as live_kube,
    ):
        stuck = AsyncClaimer(stuck_kube, pod="stuck", pod_uid=s_uid)
        live = AsyncClaimer(live_kube, pod="live", pod_uid=l_uid)
        first = await stuck.claim(TEMPLATE, "x", wait=15)
        assert isinstance(first, Claimed), first
        # A claim another Pod names is refused by the webhook; so is withdrawing someone
        # else's claim.
        forged = await AsyncClaimer(live_kube, pod="stuck", pod_uid=s_uid).claim(TEMPLATE, "y")
        assert isinstance(forged, ClaimRefused) and forged.reason == "holder_mismatch", forged
        path = f"/apis/fencedlease.io/v1alpha1/namespaces/{ns}/fencedclaims/{first.name}"
        denied = await live_kube.request("DELETE", path)
        assert denied.status_code == 403 and "holder_mismatch" in str(denied.body)
        busy = await live.claim(TEMPLATE, "x", wait=15)
        assert isinstance(busy, ClaimBusy) and busy.holder == "stuck", busy

        # "stuck" stops mid-item (its kubelet would mark it NotReady): its lease lapses.
        await asyncio.to_thread(set_ready, cluster, "stuck", ns, False)
        second = None
        for _ in range(100):
            second = await live.claim(TEMPLATE, "x", wait=15)
            if isinstance(second, Claimed):
                break
            await asyncio.sleep(0.2)
        assert isinstance(second, Claimed) and second.token > first.token, (first, second)
        applied = await AsyncPublisher(live_kube, retry=FAST).publish(
            "out-x", object_ref="x@live", lease=second.lease, token=second.token, operation_id="x"
        )
        assert isinstance(applied, Applied), applied
        late = await AsyncPublisher(stuck_kube, retry=FAST).publish(
            "out-x", object_ref="x@stuck", lease=first.lease, token=first.token, operation_id="x"
        )
        assert isinstance(late, StaleFence), late
        assert await live.done(TEMPLATE, "x")
