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

Usage: ``.venv/bin/python bench/operator_scale.py --leases 300`` (a few minutes on 2 cores).
Run it with another checkout's interpreter (``<checkout>/.venv/bin/python bench/...``) to
measure that checkout's operator against the same harness: the operator process and the CRDs
come from the interpreter's ``fencedlease``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port, operator_process

LEASES_PER_POD = 40  # default: a Pod's annotations stay far below the 256 KiB limit
TICKS = os.sysconf("SC_CLK_TCK")
JSON = "application/json"


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
    ready = json.dumps(
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    )
    for name in names:
        kubectl(cluster, "patch", "pod", name, "-n", ns, "--subresource=status",
                "--type=merge", "-p", ready)  # fmt: skip


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

    async def call(self, method: str, path: str, body: Any = None, **query: str) -> Any:
        response = await self.api.call_api(
            path,
            method,
            query_params=list(query.items()),
            header_params={"Accept": JSON, "Content-Type": JSON},
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _return_http_data_only=True,
        )
        return response

    async def json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        response = await self.call(method, path, body)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leases", type=int, default=300)
    parser.add_argument("--duration", type=int, default=30, help="leaseDurationSeconds")
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    parser.add_argument("--grants", type=int, default=40, help="grant latency samples")
    parser.add_argument(
        "--leases-per-pod",
        type=int,
        default=LEASES_PER_POD,
        help="leases held by one Pod (its size: 4 annotations per lease)",
    )
    parser.add_argument("--grant-timeout", type=float, default=300.0)
    parser.add_argument("--keep", type=Path, help="work in this directory and keep its logs")
    args = parser.parse_args()
    binary_path("kubectl")
    with (
        tempfile.TemporaryDirectory() as scratch,
        LocalCluster(Path(args.keep or scratch) / "cluster") as cluster,
    ):
        tmp = str(args.keep or scratch)
        ns = "scale"
        kubectl(cluster, "create", "namespace", ns)
        per_pod = args.leases_per_pod
        pods = (args.leases + per_pod - 1) // per_pod
        # One Pod per grant sample: a grant to a Pod that holds nothing else yet.
        grantees = [f"grantee-{i}" for i in range(args.grants)]
        names = [f"worker-{i}" for i in range(pods)] + grantees
        labels = [{"group": str(i)} for i in range(pods)]
        labels += [{"group": g, "role": "grantee"} for g in grantees]
        ready_pods(cluster, ns, names, labels)

        metrics_port, health_port = free_port(), free_port()
        op = operator_process(
            cluster.kubeconfig,
            cluster.etcd_endpoint,
            Path(tmp) / "operator.log",
            ["--role", "controller", "--metrics-port", str(metrics_port),
             "--health-port", str(health_port)],
        )  # fmt: skip
        op.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=1)
                    break
                except OSError:
                    if time.monotonic() > deadline or not op.alive():
                        raise SystemExit("operator did not start:\n" + op.log_tail()) from None
                    time.sleep(0.2)
            time.sleep(3)  # the operator's first lists and its election settle

            grants, acquisitions = asyncio.run(grant_latency(cluster, ns, args.grants))
            g50, g99 = statistics.median(grants), pct(grants, 0.99)
            a50, a99 = statistics.median(acquisitions), pct(acquisitions, 0.99)
            print(f"grant end to end, n={len(grants)} (create -> holder Pod annotated held)")
            print(f"  fencedlease grant            p50 {g50:7.2f} ms  p99 {g99:7.2f} ms")
            print(f"  client-go Lease GET+PUT      p50 {a50:7.2f} ms  p99 {a99:7.2f} ms")
            print(f"  ratio                        p50 {g50 / a50:7.2f}x    p99 {g99 / a99:7.2f}x")

            body = json.dumps(
                {
                    "kind": "List",
                    "apiVersion": "v1",
                    "items": [
                        fenced_lease(f"lease-{i}", ns, args.duration, str(i // per_pod))
                        for i in range(args.leases)
                    ],
                }
            )
            t0 = time.perf_counter()
            kubectl(cluster, "create", "-f", "-", stdin=body)
            created = time.perf_counter() - t0
            count = 0
            target = args.leases + len(grants)
            while (count := held(cluster, ns)) < target:
                if time.perf_counter() - t0 > args.grant_timeout or not op.alive():
                    break
                time.sleep(2)
            granted = time.perf_counter() - t0
            print(f"{args.leases} leases, {pods} holder Pods, duration {args.duration}s")
            print(f"  baseline: create {args.leases} FencedLeases     {created:8.1f} s")
            if count < target:
                print(f"  only {count}/{target} Held after {granted:.0f} s: over capacity")
            else:
                print(
                    f"  all Held (grant + annotate + status) {granted:8.1f} s  "
                    f"{granted / created:6.2f}x baseline  ({args.leases / granted:,.0f} grants/s)"
                )
            # Settle: every lease past its grant and first renewal (status writes of a new
            # grant are not steady state).
            time.sleep(args.duration / 3 + 2)

            assert cluster.apiserver is not None and cluster.etcd is not None
            pids = {
                "operator": pid_of(op),
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
        finally:
            op.stop()


if __name__ == "__main__":
    main()
