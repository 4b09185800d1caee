"""Per-item claims on the real local control plane: claim latency and items per second.

W simulated worker Pods (API objects marked Ready; each works with its own Pod-bound
service-account token, through the real webhook) take items from a queue; for each item a
worker claims it under a template lease (``AsyncClaimer.claim``: FencedClaim create, the
operator creates the item's FencedLease and grants it from etcd, the claim's status carries
the grant), publishes a FencedArtifact under the item lease's token (through the fence), and
withdraws the claim (``done``: the generation ends at once, the item lease is deleted later).

Printed: claim latency p50/p99 (create until the SDK read the grant), the whole item
(claim + publish + done) p50/p99, items/s, and in the same run the baseline a Kubernetes-native
named lock costs: creating (= acquiring) a ``coordination.k8s.io`` Lease per item and deleting
it, through the same HTTP client, with the ratio. Every item must end published exactly once.

Usage: ``.venv/bin/python bench/claims.py`` (about a minute on 2 cores);
``--workers 10 --items 1000`` for the real-node scenario's shape on the local control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import pct, wait_ready  # noqa: E402  (bench/benchlib.py)
from tests.integration.k8s import apply  # noqa: E402
from tests.integration.workers import claim_template, pod_config, worker_pods  # noqa: E402

from fencedlease.client import (  # noqa: E402
    Applied,
    AsyncClaimer,
    AsyncKubeClient,
    AsyncPublisher,
    Claimed,
    RetryPolicy,
)
from fencedlease.local.binaries import binary_path  # noqa: E402
from fencedlease.local.cluster import LocalCluster, free_port, operator_process  # noqa: E402

TEMPLATE = "items"


def setup(cluster: LocalCluster, ns: str, workers: int) -> dict[str, tuple[str, str]]:
    """The workers' least-privilege Role, W Ready Pods and their tokens, the template lease."""
    role = (
        "get,create,update,patch,delete",
        "fencedclaims.fencedlease.io,fencedartifacts.fencedlease.io,leases.coordination.k8s.io",
    )
    names = [f"worker-{i}" for i in range(workers)]
    out = worker_pods(cluster, ns, {"worker": role}, *names, token_duration="1h")
    apply(cluster, claim_template(ns, TEMPLATE, duration=15))
    return out


async def worker(
    cluster: LocalCluster,
    ns: str,
    pod: str,
    identity: tuple[str, str],
    queue: asyncio.Queue[str],
    claims: list[float],
    whole: list[float],
    applied: list[str],
) -> None:
    uid, token = identity
    async with AsyncKubeClient(pod_config(cluster, token, ns)) as kube:
        claimer = AsyncClaimer(kube, pod=pod, pod_uid=uid)
        publisher = AsyncPublisher(kube, retry=RetryPolicy(attempts=5, base_delay=0.05))
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            claimed = await claimer.claim(TEMPLATE, item, wait=60)
            granted = time.perf_counter()
            if not isinstance(claimed, Claimed):
                raise SystemExit(f"{pod}: {item}: {claimed.message}")
            result = await publisher.publish(
                f"out-{item}",
                object_ref=f"{item}@{pod}",
                lease=claimed.lease,
                token=claimed.token,
                operation_id=item,
            )
            if not isinstance(result, Applied):
                raise SystemExit(f"{pod}: {item}: {result.message}")
            applied.append(item)
            await claimer.done(TEMPLATE, item)
            claims.append((granted - started) * 1000)
            whole.append((time.perf_counter() - started) * 1000)


async def baseline(
    cluster: LocalCluster, ns: str, identity: tuple[str, str], items: int
) -> list[float]:
    """A named lock the Kubernetes way: create (acquire) a coordination Lease, delete it."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    out = []
    async with AsyncKubeClient(pod_config(cluster, identity[1], ns)) as kube:
        for i in range(items):
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": f"lock-{i}"},
                "spec": {"holderIdentity": "worker-0", "leaseDurationSeconds": 15},
            }
            started = time.perf_counter()
            (await kube.request("POST", path, body=body)).raise_for_status()
            out.append((time.perf_counter() - started) * 1000)
            (await kube.request("DELETE", f"{path}/lock-{i}")).raise_for_status()
    return out


async def run(cluster: LocalCluster, ns: str, args: argparse.Namespace) -> int:
    identities = await asyncio.to_thread(setup, cluster, ns, args.workers)
    items = [f"item-{i:05d}" for i in range(args.items)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    claims: list[float] = []
    whole: list[float] = []
    applied: list[str] = []
    started = time.perf_counter()
    await asyncio.gather(
        *(
            worker(cluster, ns, pod, identity, queue, claims, whole, applied)
            for pod, identity in identities.items()
        )
    )
    elapsed = time.perf_counter() - started
    base = await baseline(cluster, ns, identities["worker-0"], min(args.items, 200))
    c50, c99 = statistics.median(claims), pct(claims, 0.99)
    b50, b99 = statistics.median(base), pct(base, 0.99)
    print(f"{args.items} items, {args.workers} workers: {args.items / elapsed:.1f} items/s")
    print(f"  claim (create -> grant read)      p50 {c50:7.1f} ms  p99 {c99:7.1f} ms")
    print(
        f"  item (claim + publish + done)     p50 {statistics.median(whole):7.1f} ms  "
        f"p99 {pct(whole, 0.99):7.1f} ms"
    )
    print(f"  baseline: coordination Lease POST p50 {b50:7.1f} ms  p99 {b99:7.1f} ms")
    print(f"  ratio claim / Lease POST          p50 {c50 / b50:7.1f}x    p99 {c99 / b99:7.1f}x")
    if sorted(applied) != items:
        print("FAIL: items not published exactly once", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep its logs")
    args = parser.parse_args()
    binary_path("kubectl")
    ns = "claims"
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalCluster(Path(args.keep or scratch) / "cluster") as cluster,
    ):
        tmp = Path(args.keep or scratch)
        cluster.kubectl("create", "namespace", ns)
        health, port = free_port(), free_port()
        op = operator_process(
            cluster.kubeconfig,
            cluster.etcd_endpoint,
            tmp / "operator.log",
            ["--role", "all", "--namespace", ns, "--webhook-registration", "url",
             "--webhook-port", str(port), "--webhook-cert-dir", str(tmp / "webhook-pki"),
             "--health-port", str(health), "--metrics-port", "0"],
            env={"FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME": f"{ns}.fencedlease.io"},
        )  # fmt: skip
        op.start()
        try:
            wait_ready(op, health)
            code = asyncio.run(run(cluster, ns, args))
        finally:
            op.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()
