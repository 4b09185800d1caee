"""Operator scale and cost: N FencedLeases on one operator, on the real local control plane.

Measures, in one run:

- grant end to end: from the POST of a new FencedLease until the API server's watch delivers
  its holder Pod annotated ``held`` (``--grants`` samples, one at a time, each lease with its
  own candidate Pod, which holds nothing else), interleaved with the
  baseline a client-go controller pays to take a ``coordination.k8s.io`` Lease: GET + PUT of
  an existing Lease (``leaderelection.tryAcquireOrRenew``), through the same HTTP client;
- grant throughput: from the first create of N leases until every lease is Held;
- steady state: renewals per second while all N are held, against the ideal N / (duration / 3),
  and the **CPU per renewal**: the CPU time (utime + stime from ``/proc/<pid>/stat``) of the
  operator, kube-apiserver and etcd over the window, divided by the renewals it made.

- memory: the operator's ``VmRSS`` and ``VmHWM`` (peak) from ``/proc/<pid>/status`` when it is
  ready, when every lease is Held and settled, and after the steady window;
- soak (``--soak-seconds S``): N leases stay held while leases are handed over continuously
  (``--handovers-per-second``): alternately a force release (the ``fencedlease.io/force-release``
  annotation with the lease's ``status.leaseId``; each group has a second Pod, so the lease moves
  to it) and the delete of a lease and the create of a new one under a new name in the same group
  (a release, the Pod annotations cleaned, the finalizer removed, a grant). Every
  ``--sample-seconds`` the RSS, the renewals rate and the Held count are sampled. It fails
  (exit status 1, a line saying why) when RSS growth (mean of the last quarter of the samples
  against the mean of the second quarter) is over 5 %, RSS is over ``--max-rss-mib``, a lease
  is not Held at the end, or renewals over the soak are below 0.95x the ideal.

Usage: ``.venv/bin/python bench/operator_scale.py --leases 300`` (a few minutes on 2 cores);
``--leases 2500 --duration 60 --pod-selector --soak-seconds 1800`` for item 4's soak.
Run it with another checkout's interpreter (``<checkout>/.venv/bin/python bench/...``) to
measure that checkout's operator against the same harness: the operator process and the CRDs
come from the interpreter's ``fencedlease``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import wait_ready  # bench/benchlib.py
from kubernetes_asyncio import client, config

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port, operator_process

LEASES_PER_POD = 40  # default: a Pod's annotations stay far below the 256 KiB limit
CANDIDATE = {"fencedlease.io/candidate": "true"}  # the label of --pod-selector
MIB = 1024 * 1024
TICKS = os.sysconf("SC_CLK_TCK")
JSON = "application/json"
MERGE = "application/merge-patch+json"


def kubectl(cluster: LocalCluster, *args: str, stdin: str | None = None) -> str:
    return cluster.kubectl(*args, input=stdin, timeout=600).stdout


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def memory_mib(pid: int) -> tuple[float, float]:
    """``VmRSS`` and ``VmHWM`` (the peak RSS) of ``pid``, in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024  # kB
    return found["VmRSS"], found["VmHWM"]


def snapshot(pid: int, where: Path) -> Path:
    """Ask the operator (``--tracemalloc``) for a tracemalloc snapshot; wait for its file."""
    taken = len(list(where.glob("*.snapshot")))
    os.kill(pid, signal.SIGUSR2)
    path = where / f"{taken + 1}.snapshot"
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no tracemalloc snapshot from the operator in {where}")
        time.sleep(0.5)
    return path


def allocation_growth(where: Path, top: int = 25) -> None:
    """What grew between the first and the last snapshot, by allocating traceback."""
    first, last = (tracemalloc.Snapshot.load(str(where / f"{n}.snapshot")) for n in (1, 2))
    keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = last.filter_traces(keep).compare_to(first.filter_traces(keep), "traceback")
    total = sum(d.size_diff for d in diff)
    print(f"  traced allocations grew {total / MIB:+.2f} MiB between the snapshots; the top:")
    for d in diff[:top]:
        print(f"    {d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks")
        for line in d.traceback.format(limit=6, most_recent_first=True):
            print(f"      {line}")


def growth(samples: list[float]) -> float:
    """Mean of the last quarter of ``samples`` against the mean of the second quarter (the
    first quarter is warm-up), as a fraction (0.05: 5 % more)."""
    q = len(samples) // 4
    if q == 0:
        return 0.0
    second, last = samples[q : 2 * q], samples[len(samples) - q :]
    return statistics.mean(last) / statistics.mean(second) - 1


def pid_of(process: ManagedProcess | None) -> int:
    assert process is not None and process.proc is not None
    return process.proc.pid


def held(cluster: LocalCluster, namespace: str) -> int:
    out = kubectl(cluster, "get", "fl", "-n", namespace, "-o", "jsonpath={.items[*].status.phase}")
    return out.split().count("Held")


def api_requests(cluster: LocalCluster) -> dict[str, float]:
    """``apiserver_request_total`` by "VERB resource[/subresource]" (the API server's count of
    every request it served)."""
    text = kubectl(cluster, "get", "--raw", "/metrics")
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
        )
        labels = {k: v.strip('"') for k, v in labels.items()}
        what = labels.get("resource", "")
        if labels.get("subresource"):
            what += "/" + labels["subresource"]
        key = f"{labels.get('verb', '')} {what}"
        counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ready_pods(
    cluster: LocalCluster, ns: str, names: list[str], labels: list[dict[str, str]]
) -> None:
    items = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": label},
            "spec": {"containers": [{"name": "w", "image": "example.invalid/w:1"}]},
        }
        for name, label in zip(names, labels, strict=True)
    ]
    body = json.dumps({"kind": "List", "apiVersion": "v1", "items": items})
    kubectl(cluster, "create", "-f", "-", stdin=body)
    ready = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    async def mark_ready() -> None:
        await config.load_kube_config(config_file=str(cluster.kubeconfig))
        async with client.ApiClient() as api:
            raw, gate = Raw(api), asyncio.Semaphore(8)

            async def one(name: str) -> None:
                async with gate:
                    path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
                    await raw.json("PATCH", path, ready, content_type=MERGE)

            await asyncio.gather(*(one(name) for name in names))

    asyncio.run(mark_ready())


def fenced_lease(name: str, ns: str, duration: int, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedLease",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "leaseDurationSeconds": duration,
            "holderSelector": {"matchLabels": {"group": group}},
        },
    }


class Raw:
    """Plain JSON requests through kubernetes_asyncio's HTTP stack (no model objects)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = JSON, **query: str
    ) -> Any:
        response = await self.api.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _return_http_data_only=True,
        )
        return response

    async def json(
        self, method: str, path: str, body: Any = None, content_type: str = JSON
    ) -> dict[str, Any]:
        response = await self.call(method, path, body, content_type)
        try:
            data = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
        found: dict[str, Any] = json.loads(data)
        return found


async def grant_latency(
    cluster: LocalCluster, ns: str, samples: int
) -> tuple[list[float], list[float]]:
    """Interleaved: (FencedLease create → holder Pod annotated held) and client-go's Lease
    acquisition (GET + PUT), in ms."""
    await config.load_kube_config(config_file=str(cluster.kubeconfig))
    async with client.ApiClient() as api:
        raw = Raw(api)
        pods = await raw.json("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=role%3Dgrantee")
        seen: dict[str, float] = {}
        arrived = asyncio.Event()

        async def watch() -> None:
            version = pods["metadata"]["resourceVersion"]
            response = await raw.call(
                "GET",
                f"/api/v1/namespaces/{ns}/pods",
                watch="1",
                labelSelector="role=grantee",
                resourceVersion=version,
                timeoutSeconds="600",
            )
            async for line in response.content:
                at = time.perf_counter()
                obj = json.loads(line)["object"]
                for key, value in ((obj.get("metadata") or {}).get("annotations") or {}).items():
                    if key.startswith("state.fencedlease.io/") and value == "held":
                        seen.setdefault(key.split("/", 1)[1], at)
                arrived.set()

        watcher = asyncio.create_task(watch())
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        await raw.json(
            "POST",
            lease_path,
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "client-go"},
                "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": now,
                         "renewTime": now, "leaseTransitions": 0},
            },
        )  # fmt: skip
        grants: list[float] = []
        acquisitions: list[float] = []
        await asyncio.sleep(1.0)
        for i in range(samples):
            # client-go's tryAcquireOrRenew: GET the Lease, PUT it back with the new holder.
            t0 = time.perf_counter()
            current = await raw.json("GET", f"{lease_path}/client-go")
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            spec = current["spec"]
            spec.update(
                holderIdentity=f"holder-{i}",
                acquireTime=stamp,
                renewTime=stamp,
                leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
            )
            await raw.json("PUT", f"{lease_path}/client-go", current)
            acquisitions.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.3)

            name = f"grant-{i}"
            t0 = time.perf_counter()
            await raw.json(
                "POST",
                f"/apis/fencedlease.io/v1alpha1/namespaces/{ns}/fencedleases",
                fenced_lease(name, ns, 60, f"grantee-{i}"),
            )
            deadline = t0 + 30
            while name not in seen and time.perf_counter() < deadline:
                arrived.clear()
                try:
                    await asyncio.wait_for(arrived.wait(), deadline - time.perf_counter())
                except TimeoutError:
                    break
            if name not in seen:
                raise SystemExit(f"{name} was not granted within 30 s")
            grants.append((seen[name] - t0) * 1000)
            await asyncio.sleep(0.3)
        watcher.cancel()
        return grants, acquisitions


@dataclass
class Sample:
    at: float  # seconds since the soak started
    rss: float  # MiB
    hwm: float  # MiB
    renewals: float  # per second since the previous sample
    held: float  # the operator's fencedlease_leases{phase="Held"}
    handovers: int  # so far
    cpu: float  # operator CPU seconds per second since the previous sample


async def soak(
    cluster: LocalCluster,
    ns: str,
    live: list[tuple[str, str]],
    args: argparse.Namespace,
    pid: int,
    metrics_port: int,
) -> tuple[list[Sample], dict[str, int]]:
    """Hand leases over at ``args.handovers_per_second`` for ``args.soak_seconds`` while
    sampling the operator every ``args.sample_seconds``. ``live``: (lease, group), updated in
    place as leases are replaced."""
    renewed = 'fencedlease_renewals_total{result="renewed"}'
    counts = {"force_release": 0, "replace": 0, "errors": 0}
    await config.load_kube_config(config_file=str(cluster.kubeconfig))
    async with client.ApiClient() as api:
        raw = Raw(api)
        path = f"/apis/fencedlease.io/v1alpha1/namespaces/{ns}/fencedleases"
        stop = asyncio.Event()

        async def hand_over() -> None:
            step, made = 0, 0
            interval = 1.0 / args.handovers_per_second
            next_at = time.monotonic()
            while not stop.is_set():
                index = (step * 7919) % len(live)  # a stride that visits every lease
                name, group = live[index]
                try:
                    if step % 2 == 0:
                        lease = await raw.json("GET", f"{path}/{name}")
                        status = lease.get("status") or {}
                        if status.get("phase") == "Held" and status.get("leaseId"):
                            patch = {
                                "metadata": {
                                    "annotations": {
                                        "fencedlease.io/force-release": status["leaseId"]
                                    }
                                }
                            }
                            await raw.json("PATCH", f"{path}/{name}", patch, MERGE)
                            counts["force_release"] += 1
                    else:
                        await raw.json("DELETE", f"{path}/{name}")
                        fresh = f"soak-{made}"
                        made += 1
                        await raw.json("POST", path, fenced_lease(fresh, ns, args.duration, group))
                        live[index] = (fresh, group)
                        counts["replace"] += 1
                except RuntimeError as failed:
                    counts["errors"] += 1
                    print(f"    handover of {name}: {failed}")
                step += 1
                next_at += interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

        def read() -> tuple[float, float, float, float, float]:
            rss, hwm = memory_mib(pid)
            return (
                rss,
                hwm,
                metric(metrics_port, renewed),
                metric(metrics_port, 'fencedlease_leases{phase="Held"}'),
                cpu_seconds(pid),
            )

        worker = asyncio.create_task(hand_over())
        samples: list[Sample] = []
        t0 = time.monotonic()
        _, _, r_prev, _, c_prev = await asyncio.to_thread(read)
        t_prev = t0
        print(f"  soak: {args.soak_seconds:.0f} s, {args.handovers_per_second}/s handovers")
        print("      t (s)   RSS MiB  peak MiB  renewals/s   Held  handovers  operator CPU")
        k = 0
        while (k := k + 1) * args.sample_seconds <= args.soak_seconds:
            await asyncio.sleep(max(0.0, t0 + k * args.sample_seconds - time.monotonic()))
            if worker.done():
                worker.result()  # raises what stopped it
            if args.tracemalloc and k in (2, int(args.soak_seconds / args.sample_seconds)):
                await asyncio.to_thread(snapshot, pid, args.snapshots)
            rss, hwm, r, held_now, c = await asyncio.to_thread(read)
            now = time.monotonic()
            sample = Sample(
                now - t0,
                rss,
                hwm,
                (r - r_prev) / (now - t_prev),
                held_now,
                counts["force_release"] + counts["replace"],
                (c - c_prev) / (now - t_prev),
            )
            samples.append(sample)
            print(
                f"    {sample.at:7.0f}  {rss:8.1f}  {hwm:8.1f}  {sample.renewals:10.1f}  "
                f"{held_now:5.0f}  {sample.handovers:9d}  {sample.cpu * 100:10.0f} %",
                flush=True,
            )
            r_prev, c_prev, t_prev = r, c, now
        stop.set()
        await worker
        return samples, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leases", type=int, default=300)
    parser.add_argument("--duration", type=int, default=30, help="leaseDurationSeconds")
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    parser.add_argument("--grants", type=int, default=40, help="grant latency samples (0: none)")
    parser.add_argument(
        "--leases-per-pod",
        type=int,
        default=LEASES_PER_POD,
        help="leases held by one Pod (its size: 4 annotations per lease)",
    )
    parser.add_argument(
        "--pod-selector",
        action="store_true",
        help="label the Pods fencedlease.io/candidate=true and run the operator with "
        "--pod-selector (the chart's controller.podSelector)",
    )
    parser.add_argument(
        "--create-over",
        type=float,
        default=0.0,
        help="create the leases in batches spread over this many seconds (0: all at once)",
    )
    parser.add_argument("--grant-timeout", type=float, default=300.0)
    parser.add_argument(
        "--soak-seconds", type=float, default=0.0, help="after the steady window: soak (0: none)"
    )
    parser.add_argument("--handovers-per-second", type=float, default=4.0)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--max-rss-mib", type=float, default=300.0)
    parser.add_argument("--max-growth", type=float, default=0.05)
    parser.add_argument("--min-renewals", type=float, default=0.95, help="x the ideal rate")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the operator's allocations; print what grew between the soak's first "
        "and last sample (diagnosis: slows the operator, RSS figures do not count)",
    )
    parser.add_argument("--keep", type=Path, help="work in this directory and keep its logs")
    args = parser.parse_args()
    binary_path("kubectl")
    args.snapshots = None
    if args.create_over < 0:
        parser.error("--create-over must be 0 or more seconds")
    failures: list[str] = []
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalCluster(Path(args.keep or scratch) / "cluster") as cluster,
    ):
        tmp = str(args.keep or scratch)
        ns = "scale"
        kubectl(cluster, "create", "namespace", ns)
        per_pod = args.leases_per_pod
        pods = (args.leases + per_pod - 1) // per_pod
        extra = CANDIDATE if args.pod_selector else {}
        # One Pod per grant sample: a grant to a Pod that holds nothing else yet.
        grantees = [f"grantee-{i}" for i in range(args.grants)]
        names = [f"worker-{i}" for i in range(pods)] + grantees
        labels = [{"group": str(i), **extra} for i in range(pods)]
        labels += [{"group": g, "role": "grantee", **extra} for g in grantees]
        if args.soak_seconds:
            # A second candidate in each group: a force release moves the lease to it.
            names += [f"worker-{i}-b" for i in range(pods)]
            labels += [{"group": str(i), **extra} for i in range(pods)]
        t0 = time.perf_counter()
        ready_pods(cluster, ns, names, labels)
        print(f"{len(names)} Pods created and Ready in {time.perf_counter() - t0:.1f} s")

        metrics_port, health_port = free_port(), free_port()
        selector = ["--pod-selector", "fencedlease.io/candidate=true"] if args.pod_selector else []
        env: dict[str, str] = {}
        snapshots = Path(tmp) / "snapshots"
        if args.tracemalloc:
            snapshots.mkdir(exist_ok=True)
            args.snapshots = snapshots
            env = {
                "PYTHONTRACEMALLOC": "6",
                "PYTHONPATH": str(Path(__file__).parent / "tracemalloc_hook"),
                "FENCEDLEASE_BENCH_SNAPSHOTS": str(snapshots),
            }
        op = operator_process(
            cluster.kubeconfig,
            cluster.etcd_endpoint,
            Path(tmp) / "operator.log",
            ["--role", "controller", "--metrics-port", str(metrics_port),
             "--health-port", str(health_port), *selector],
            env=env,
        )  # fmt: skip
        op.start()
        try:
            wait_ready(op, health_port)
            time.sleep(3)  # the operator's first lists and its election settle
            op_pid = pid_of(op)
            rss_ready, _ = memory_mib(op_pid)

            grants: list[float] = []
            if args.grants:
                grants, acquisitions = asyncio.run(grant_latency(cluster, ns, args.grants))
                g50, g99 = statistics.median(grants), pct(grants, 0.99)
                a50, a99 = statistics.median(acquisitions), pct(acquisitions, 0.99)
                print(f"grant end to end, n={len(grants)} (create -> holder Pod annotated held)")
                print(f"  fencedlease grant            p50 {g50:7.2f} ms  p99 {g99:7.2f} ms")
                print(f"  client-go Lease GET+PUT      p50 {a50:7.2f} ms  p99 {a99:7.2f} ms")
                print(
                    f"  ratio                        p50 {g50 / a50:7.2f}x    p99 {g99 / a99:7.2f}x"
                )

            groups = [str(i // per_pod) for i in range(args.leases)]
            items = [
                fenced_lease(f"lease-{i}", ns, args.duration, groups[i]) for i in range(args.leases)
            ]
            # --create-over: in batches spread evenly over that many seconds, so the grants
            # (and so the renewals) spread over it as leases created one by one would.
            batches = max(1, round(args.create_over / 0.3)) if args.create_over else 1
            t0 = time.perf_counter()
            for b in range(batches):
                wait = t0 + b * args.create_over / batches - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                batch = items[b * len(items) // batches : (b + 1) * len(items) // batches]
                if not batch:
                    continue  # fewer leases than batches
                body = json.dumps({"kind": "List", "apiVersion": "v1", "items": batch})
                kubectl(cluster, "create", "-f", "-", stdin=body)
            created = time.perf_counter() - t0
            count = 0
            target = args.leases + len(grants)
            while (count := held(cluster, ns)) < target:
                if time.perf_counter() - t0 > args.grant_timeout or not op.alive():
                    break
                time.sleep(2)
            granted = time.perf_counter() - t0
            shape = f"{per_pod} per Pod" + (", Pod watch scoped" if args.pod_selector else "")
            print(f"{args.leases} leases, {pods} holder Pods ({shape}), duration {args.duration}s")
            spread = f", spread over {args.create_over:g} s" if args.create_over else ""
            print(f"  baseline: create {args.leases} FencedLeases{spread}  {created:8.1f} s")
            if count < target:
                print(f"  only {count}/{target} Held after {granted:.0f} s: over capacity")
                failures.append(f"only {count}/{target} leases Held after {granted:.0f} s")
            else:
                print(
                    f"  all Held (grant + annotate + status) {granted:8.1f} s  "
                    f"{granted / created:6.2f}x baseline  ({args.leases / granted:,.0f} grants/s)"
                )
            rss_held, _ = memory_mib(op_pid)
            # Settle: every lease past its grant and first renewal (status writes of a new
            # grant are not steady state).
            time.sleep(args.duration / 3 + 2)
            rss_settled, _ = memory_mib(op_pid)

            assert cluster.apiserver is not None and cluster.etcd is not None
            pids = {
                "operator": op_pid,
                "kube-apiserver": pid_of(cluster.apiserver.process),
                "etcd": pid_of(cluster.etcd.process),
            }
            name = 'fencedlease_renewals_total{result="renewed"}'
            q0 = api_requests(cluster)
            c0 = {k: cpu_seconds(p) for k, p in pids.items()}
            r0 = metric(metrics_port, name)
            time.sleep(args.steady_seconds)
            r1 = metric(metrics_port, name)
            c1 = {k: cpu_seconds(p) for k, p in pids.items()}
            q1 = api_requests(cluster)
            renewals = r1 - r0
            rate = renewals / args.steady_seconds
            ideal = target / (args.duration / 3)
            print(
                f"  steady state: {rate:,.1f} renewals/s  ({rate / ideal:5.2f}x the ideal "
                f"{ideal:,.1f}/s: every lease renewed each third of its duration)"
            )
            if rate < args.min_renewals * ideal:
                failures.append(f"steady renewals {rate / ideal:.2f}x the ideal")
            print(f"  CPU per renewal over {args.steady_seconds:.0f}s, {renewals:.0f} renewals:")
            total = 0.0
            for k in pids:
                per = (c1[k] - c0[k]) * 1000 / max(renewals, 1)
                total += per
                print(f"    {k:16s} {per:6.2f} ms  ({c1[k] - c0[k]:6.2f} s CPU)")
            print(f"    {'total':16s} {total:6.2f} ms")
            print("  API requests per renewal over the window (apiserver_request_total):")
            for key in sorted(q1):
                moved = q1[key] - q0.get(key, 0.0)
                if moved and not key.startswith(("WATCH", "CONNECT")):
                    print(f"    {key:40s} {moved / max(renewals, 1):6.3f}  ({moved:.0f})")
            still = held(cluster, ns)
            print(f"  still Held after the window: {still}/{target}")
            rss_steady, hwm = memory_mib(op_pid)
            print(
                f"  operator RSS (MiB): ready {rss_ready:.1f}, all Held {rss_held:.1f}, "
                f"settled {rss_settled:.1f}, after the window {rss_steady:.1f}, peak {hwm:.1f}"
            )
            if hwm > args.max_rss_mib:
                failures.append(f"peak RSS {hwm:.1f} MiB > {args.max_rss_mib:.0f} MiB")

            if args.soak_seconds:
                live = [(f"lease-{i}", groups[i]) for i in range(args.leases)]
                samples, counts = asyncio.run(soak(cluster, ns, live, args, op_pid, metrics_port))
                if args.tracemalloc:
                    allocation_growth(snapshots)
                # Handovers stopped: every lease Held again within a bounded wait.
                t1 = time.perf_counter()
                while (still := held(cluster, ns)) < target and time.perf_counter() - t1 < 120:
                    time.sleep(2)
                total_leases = len(kubectl(cluster, "get", "fl", "-n", ns, "-o", "name").split())
                rss_end, hwm = memory_mib(op_pid)
                rss = [x.rss for x in samples]
                grown = growth(rss)
                soak_rate = statistics.mean(x.renewals for x in samples) if samples else 0.0
                print(
                    f"  soak: {counts['force_release']} force releases, {counts['replace']} "
                    f"leases replaced, {counts['errors']} errors"
                )
                print(
                    f"  RSS over the soak: first {rss[0]:.1f}, last {rss[-1]:.1f}, max "
                    f"{max(rss):.1f}, peak {hwm:.1f} MiB; growth {grown * 100:+.1f} % "
                    f"(mean of the last quarter vs the second quarter of {len(rss)} samples)"
                )
                print(
                    f"  renewals over the soak {soak_rate:,.1f}/s ({soak_rate / ideal:.2f}x the "
                    f"ideal {ideal:,.1f}/s; min sample {min(x.renewals for x in samples):,.1f}/s)"
                )
                print(f"  Held at the end: {still}/{target} ({total_leases} leases exist)")
                if grown > args.max_growth:
                    failures.append(f"RSS grew {grown * 100:.1f} % over the soak")
                if hwm > args.max_rss_mib:
                    failures.append(f"peak RSS {hwm:.1f} MiB > {args.max_rss_mib:.0f} MiB")
                if still < target or total_leases != target:
                    failures.append(f"{still}/{target} Held at the end of the soak")
                if soak_rate < args.min_renewals * ideal:
                    failures.append(f"soak renewals {soak_rate / ideal:.2f}x the ideal")
                if counts["errors"]:
                    failures.append(f"{counts['errors']} handovers failed")
                del rss_end
        finally:
            op.stop()
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("OK: every target met")


if __name__ == "__main__":
    main()
