"""A Go controller's fenced write against its plain write through the same API server
(docs/go.md, docs/performance.md). Run by ``make bench``; alone:
``.venv/bin/python bench/go_client.py -n 300``.

Starts what the integration tests start (:class:`fencedlease.local.cluster.LocalCluster`: etcd
and kube-apiserver, the fence webhook with the FencePolicies' object webhooks and the commit
recorder in this process, :mod:`tests.integration.objects_harness`), grants the lease ``ctl``
and writes its downward-API files, then runs ``go/integration``'s ``TestAPIWriteCost`` (built
with ``go test -c``, Go's own caches): the controller-runtime client's ``Update`` of an
unlabelled ConfigMap against the fenced client's ``Update`` of a labelled one (token read and
stamped, the webhook called), interleaved in a shuffled order each round. Prints the table
(p50, p99, the fenced p50 over the plain one) and writes it to ``--out``/go_client.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.objects_harness import declared, running_objects  # noqa: E402
from tests.integration.test_go_client import build, grant_dir  # noqa: E402

from fencedlease.local.cluster import LocalCluster  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
MARK = "GO-API-BENCH "


async def measure(writes: int, tmp: Path) -> dict[str, dict[str, float]]:
    with LocalCluster(tmp / "cluster") as cluster:
        async with running_objects(cluster, tmp / "tls") as objects:
            await declared(objects)
            fence = objects.fence
            ns = await fence.namespace()
            await fence.lease(ns, "ctl")
            got = await fence.grant(ns, "ctl", "bench")
            grants = grant_dir(tmp / "grant", got.token, got.lease_id)
            binary = await build(tmp)
            env = dict(
                os.environ,
                FENCEDLEASE_GO_IT="bench",
                KUBECONFIG=str(cluster.kubeconfig),
                FENCEDLEASE_GO_IT_NAMESPACE=ns,
                FENCEDLEASE_GO_IT_GRANT_DIR=str(grants),
                FENCEDLEASE_GO_IT_WRITES=str(writes),
            )
            proc = await asyncio.create_subprocess_exec(
                str(binary), "-test.run", "^TestAPIWriteCost$", "-test.v", "-test.count=1",
                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            async with asyncio.timeout(600):
                output, _ = await proc.communicate()
            text = output.decode()
            lines = [ln for ln in text.splitlines() if ln.startswith(MARK)]
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"TestAPIWriteCost failed:\n{text}")
            result: dict[str, dict[str, float]] = json.loads(lines[-1].removeprefix(MARK))
            return result


def markdown(rows: dict[str, dict[str, float]], meta: str) -> str:
    base = rows["plain"]["p50"]
    out = [
        f"Go controller writes through the API server ({meta})",
        "",
        "| write (controller-runtime `Update` of a ConfigMap) | n | p50 | p99 | p50 / plain |",
        "|---|---|---|---|---|",
    ]
    names = {
        "plain": "plain client, unlabelled object",
        "fenced": "fenced client, labelled object (token stamped, fence webhook)",
    }
    for key in ("plain", "fenced"):
        r = rows[key]
        out.append(
            f"| {names[key]} | {int(r['n'])} | {r['p50'] / 1000:.2f} ms | {r['p99'] / 1000:.2f} ms "
            f"| {r['p50'] / base:.2f}x |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300, help="measured rounds (each writes both)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fencedlease-go-bench-") as tmp:
        rows = asyncio.run(measure(args.n, Path(tmp)))
    load = os.getloadavg()[0]
    meta = f"{datetime.now(UTC):%Y-%m-%d}, {os.cpu_count()} cores, load {load:.1f}"
    table = markdown(rows, meta)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "go_client.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
