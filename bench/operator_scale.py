"""Operator scale: N FencedLeases on one operator, on the real local control plane.

Measures, in one run:
- baseline: creating N FencedLeases through the API (what the cluster itself costs);
- grant: from the first create until every lease is Held (the operator's scheduler, etcd grants,
  Pod annotations, status writes), as a ratio to the baseline;
- steady state: renewals per second while all N are held (each lease renews every third of its
  duration), against the ideal N / (duration / 3).

Usage: ``.venv/bin/python bench/operator_scale.py --leases 1000`` (10,000 works; it takes a few
minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, free_port, operator_process

LEASES_PER_POD = 40  # a Pod's annotations stay far below the 256 KiB limit


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


def held(cluster: LocalCluster, namespace: str) -> int:
    out = kubectl(cluster, "get", "fl", "-n", namespace, "-o", "jsonpath={.items[*].status.phase}")
    return out.split().count("Held")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--duration", type=int, default=30, help="leaseDurationSeconds")
    parser.add_argument("--steady-seconds", type=float, default=30.0)
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
        pods = (args.leases + LEASES_PER_POD - 1) // LEASES_PER_POD
        items = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"worker-{i}", "namespace": ns, "labels": {"group": str(i)}},
                "spec": {"containers": [{"name": "w", "image": "example.invalid/w:1"}]},
            }
            for i in range(pods)
        ]
        kubectl(
            cluster,
            "create",
            "-f",
            "-",
            stdin=json.dumps({"kind": "List", "apiVersion": "v1", "items": items}),
        )
        ready = json.dumps(
            {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        )
        for i in range(pods):
            kubectl(cluster, "patch", "pod", f"worker-{i}", "-n", ns, "--subresource=status",
                    "--type=merge", "-p", ready)  # fmt: skip

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

            leases = [
                {
                    "apiVersion": "fencedlease.io/v1alpha1",
                    "kind": "FencedLease",
                    "metadata": {"name": f"lease-{i}", "namespace": ns},
                    "spec": {
                        "leaseDurationSeconds": args.duration,
                        "holderSelector": {"matchLabels": {"group": str(i // LEASES_PER_POD)}},
                    },
                }
                for i in range(args.leases)
            ]
            body = json.dumps({"kind": "List", "apiVersion": "v1", "items": leases})
            t0 = time.perf_counter()
            kubectl(cluster, "create", "-f", "-", stdin=body)
            created = time.perf_counter() - t0
            count = 0
            while (count := held(cluster, ns)) < args.leases:
                if time.perf_counter() - t0 > args.grant_timeout or not op.alive():
                    break
                time.sleep(2)
            granted = time.perf_counter() - t0
            print(f"{args.leases} leases, {pods} holder Pods, duration {args.duration}s")
            print(f"  baseline: create {args.leases} FencedLeases     {created:8.1f} s")
            if count < args.leases:
                print(
                    f"  only {count}/{args.leases} Held after {granted:.0f} s: over capacity "
                    "(renewals of live grants go first; new grants wait for spare capacity)"
                )
            else:
                print(
                    f"  all Held (grant + annotate + status) {granted:8.1f} s  "
                    f"{granted / created:6.2f}x baseline  ({args.leases / granted:,.0f} grants/s)"
                )
            args.leases = count  # the steady state concerns the leases actually held

            r0 = metric(metrics_port, 'fencedlease_renewals_total{result="renewed"}')
            time.sleep(args.steady_seconds)
            r1 = metric(metrics_port, 'fencedlease_renewals_total{result="renewed"}')
            rate = (r1 - r0) / args.steady_seconds
            ideal = args.leases / (args.duration / 3)
            print(
                f"  steady state: {rate:,.1f} renewals/s  ({rate / ideal:5.2f}x the ideal "
                f"{ideal:,.1f}/s: every lease renewed each third of its duration)"
            )
            still = held(cluster, ns)
            print(f"  still Held after {args.steady_seconds:.0f}s: {still}/{args.leases}")
        finally:
            op.stop()


if __name__ == "__main__":
    main()
