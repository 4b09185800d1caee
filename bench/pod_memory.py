"""Operator memory and CPU on a cluster full of Pods that can never hold a lease.

Starts etcd and kube-apiserver (the local control plane of the tests), creates ``--noise``
non-candidate Pods (no kubelet: they sit Pending, each with a ``--annotation-bytes``
annotation standing in for ``last-applied-configuration``) and a few candidate Pods
(labelled ``fencedlease.io/candidate=true``, marked Ready) each holding one FencedLease, then
runs the operator (``--role controller``) twice, without and with ``--pod-selector``:

- **ready**: seconds from start until /readyz and every lease Held;
- **RSS**: ``VmRSS`` and peak ``VmHWM`` from ``/proc/<pid>/status`` once settled;
- **CPU**: user + system seconds (``/proc/<pid>/stat``) from start until settled, and during a
  churn of ``--churn`` label patches on non-candidate Pods (events the operator does not need);
- **bytes**: what the API server sends for the operator's Pod list and for its Pod watch
  during the churn, measured by the bench itself making the same requests (Kopf's: a list,
  then ``watch=true&allowWatchBookmarks=true`` from its version, with the same
  ``labelSelector``) beside the operator. (The API server's ``apiserver_watch_events_*``
  metrics count events whether or not a watcher receives them, so they cannot tell.)

Usage: ``.venv/bin/python bench/pod_memory.py`` (10,000 Pods: a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import wait_ready  # bench/benchlib.py
from kubernetes_asyncio import client, config

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, free_port, operator_process

SELECTOR = "fencedlease.io/candidate=true"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    rss_kib: int
    hwm_kib: int
    cpu_s: float


def sample(pid: int) -> Sample:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return Sample(
        rss_kib=int(status["VmRSS"].split()[0]),
        hwm_kib=int(status["VmHWM"].split()[0]),
        cpu_s=(int(stat[11]) + int(stat[12])) / TICKS,  # utime, stime (fields 14, 15)
    )


def pod(name: str, namespace: str, labels: dict[str, str], annotation: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": annotation},
        },
        "spec": {"containers": [{"name": "main", "image": "example.invalid/app:1"}]},
    }


async def gather_bounded(jobs: list[Any], concurrency: int) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(job: Any) -> None:
        async with semaphore:
            await job

    await asyncio.gather(*(one(j) for j in jobs))


async def populate(
    cluster: LocalCluster, noise: int, candidates: int, annotation_bytes: int, concurrency: int
) -> None:
    await config.load_kube_config(config_file=str(cluster.kubeconfig))
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        for ns in ("noise", "work"):
            await core.create_namespace({"metadata": {"name": ns}}, _preload_content=False)
        filler = "x" * annotation_bytes
        t0 = time.perf_counter()
        await gather_bounded(
            [
                core.create_namespaced_pod(
                    "noise",
                    pod(f"noise-{i}", "noise", {"app": f"noise-{i % 100}"}, filler),
                    _preload_content=False,
                )
                for i in range(noise)
            ],
            concurrency,
        )
        print(f"created {noise} non-candidate Pods in {time.perf_counter() - t0:.1f} s")
        ready = {
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }
        for i in range(candidates):
            labels = {"app": f"worker-{i}", "fencedlease.io/candidate": "true"}
            await core.create_namespaced_pod(
                "work", pod(f"worker-{i}", "work", labels, filler), _preload_content=False
            )
            await core.patch_namespaced_pod_status(
                f"worker-{i}", "work", ready, _preload_content=False
            )
            await custom.create_namespaced_custom_object(
                "fencedlease.io",
                "v1alpha1",
                "work",
                "fencedleases",
                {
                    "apiVersion": "fencedlease.io/v1alpha1",
                    "kind": "FencedLease",
                    "metadata": {"name": f"lease-{i}"},
                    "spec": {
                        "leaseDurationSeconds": 30,
                        "holderSelector": {"matchLabels": {"app": f"worker-{i}"}},
                    },
                },
                _preload_content=False,
            )


async def churn(
    cluster: LocalCluster, count: int, round_: int, concurrency: int, selector: str | None
) -> tuple[float, int, int]:
    """Relabel ``count`` non-candidate Pods (events only an unscoped watch receives) while a
    Pod list and watch like the operator's (same ``labelSelector``) count their bytes.

    Returns the churn's seconds, the list's and the watch's body bytes (uncompressed)."""
    await config.load_kube_config(config_file=str(cluster.kubeconfig))
    scope = {"label_selector": selector} if selector else {}
    async with client.ApiClient() as api:
        core = client.CoreV1Api(api)
        listing = await core.list_pod_for_all_namespaces(_preload_content=False, **scope)
        body = await listing.read()
        version = json.loads(body)["metadata"]["resourceVersion"]
        watch = await core.list_pod_for_all_namespaces(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=version,
            timeout_seconds=300,
            _preload_content=False,
            **scope,
        )
        received = 0

        async def read() -> None:
            nonlocal received
            async for chunk in watch.content.iter_any():
                received += len(chunk)

        reader = asyncio.create_task(read())
        t0 = time.perf_counter()
        await gather_bounded(
            [
                core.patch_namespaced_pod(
                    f"noise-{i}",
                    "noise",
                    {"metadata": {"labels": {"churn": str(round_)}}},
                    _preload_content=False,
                )
                for i in range(count)
            ],
            concurrency,
        )
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(2)  # the last events reach the watcher
        reader.cancel()
        watch.close()
        return elapsed, len(body), received


def renewed_since(cluster: LocalCluster, since: str) -> int:
    """Leases Held with a renewal (or grant) at or after ``since`` (RFC 3339): served by the
    operator started then, not adopted from the previous run's status."""
    out = cluster.kubectl("get", "fl", "-n", "work", "-o", "json").stdout
    return sum(
        1
        for item in json.loads(out)["items"]
        if (item.get("status") or {}).get("phase") == "Held"
        and ((item.get("status") or {}).get("renewTime") or "") >= since
    )


def run_operator(
    cluster: LocalCluster,
    workdir: Path,
    selector: str | None,
    args: argparse.Namespace,
    round_: int,
    tree: Path | None = None,
) -> dict[str, Any]:
    health_port = free_port()
    extra = ["--role", "controller", "--no-leader-election", "--metrics-port", "0"]
    extra += ["--health-port", str(health_port)]
    if selector:
        extra += ["--pod-selector", selector]
    name = "scoped" if selector else "all-pods" if tree is None else f"all-pods, {tree}"
    env = {"PYTHONPATH": str(tree)} if tree else None
    log = workdir / f"operator-{round_}.log"
    op = operator_process(cluster.kubeconfig, cluster.etcd_endpoint, log, extra, env=env)
    since = datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.perf_counter()
    op.start()
    try:
        wait_ready(op, health_port, 120)
        ready_s = time.perf_counter() - t0
        deadline = time.monotonic() + 180
        while renewed_since(cluster, since) < args.candidates:
            if time.monotonic() > deadline or not op.alive():
                raise SystemExit(f"leases not Held:\n{op.log_tail()}")
            time.sleep(0.5)
        served_s = time.perf_counter() - t0
        time.sleep(args.settle)
        assert op.proc is not None
        pid = op.proc.pid
        settled = sample(pid)
        churn_s, list_bytes, watch_bytes = asyncio.run(
            churn(cluster, args.churn, round_, args.concurrency, selector)
        )
        time.sleep(args.settle)
        after = sample(pid)
        return {
            "run": name,
            "ready_s": ready_s,
            "served_s": served_s,
            "rss_mib": settled.rss_kib / 1024,
            "hwm_mib": max(settled.hwm_kib, after.hwm_kib) / 1024,
            "cpu_start_s": settled.cpu_s,
            "list_mib": list_bytes / 2**20,
            "churn_s": churn_s,
            "cpu_churn_s": after.cpu_s - settled.cpu_s,
            "watch_churn_mib": watch_bytes / 2**20,
            "rss_after_churn_mib": after.rss_kib / 1024,
        }
    finally:
        op.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--noise", type=int, default=10_000, help="non-candidate Pods")
    parser.add_argument("--candidates", type=int, default=5, help="candidate Pods (one lease each)")
    parser.add_argument("--annotation-bytes", type=int, default=1024)
    parser.add_argument("--churn", type=int, default=2_000, help="label patches on noise Pods")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before sampling")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep its logs")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run the unscoped operator from this source tree (its operator/ directory, "
        "e.g. another git worktree: the code before a change)",
    )
    args = parser.parse_args()
    binary_path("kube-apiserver")
    started = datetime.now(UTC)
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalCluster(Path(args.keep or scratch) / "cluster") as cluster,
    ):
        workdir = Path(args.keep or scratch)
        asyncio.run(
            populate(cluster, args.noise, args.candidates, args.annotation_bytes, args.concurrency)
        )
        results = [
            run_operator(cluster, workdir, None, args, 1),
            run_operator(cluster, workdir, SELECTOR, args, 2),
        ]
        if args.baseline_tree:
            results.append(run_operator(cluster, workdir, None, args, 3, args.baseline_tree))
    print(json.dumps(results, indent=1))
    print(
        f"\n{started:%Y-%m-%d %H:%M} UTC: {args.noise:,} non-candidate Pods "
        f"({args.annotation_bytes} B annotation each), {args.candidates} candidate Pods and "
        f"leases, churn of {args.churn:,} label patches\n"
    )
    print(
        "| Pod watch | ready | every lease renewed | RSS settled | RSS peak | CPU to settled "
        "| Pod list body | CPU during churn | Pod watch bytes during churn | RSS after churn |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        run = str(r["run"])
        label = {"all-pods": "every Pod (default)", "scoped": f"`{SELECTOR}`"}.get(run)
        label = label or f"every Pod ({run.removeprefix('all-pods, ')})"
        print(
            f"| {label} | {r['ready_s']:.1f} s | {r['served_s']:.1f} s | {r['rss_mib']:.0f} MiB "
            f"| {r['hwm_mib']:.0f} MiB | {r['cpu_start_s']:.1f} s | {r['list_mib']:.2f} MiB "
            f"| {r['cpu_churn_s']:.2f} s | {r['watch_churn_mib']:.2f} MiB "
            f"| {r['rss_after_churn_mib']:.0f} MiB |"
        )


if __name__ == "__main__":
    main()
