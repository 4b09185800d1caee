"""The Go module's fenced clients against the real API server and fence webhook (docs/go.md).

The webhook, the policy watch and the commit recorder run in this test process
(:mod:`.objects_harness`); the Go side is ``go/integration`` (built here with ``go test -c``,
the module's own build cache) and run once per step with the session's admin kubeconfig (an
allowed writer: its token is checked, not its identity) and a fake downward-API directory.
The Go binary runs as an asyncio subprocess: the webhook shares this event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster

from .objects_harness import Objects, data_of, declared

pytestmark = pytest.mark.timeout(900)  # a cold module cache compiles controller-runtime once

ROOT = Path(__file__).resolve().parents[2]


async def build(out: Path) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.fail("the 'go' toolchain is not on PATH (Go >= 1.26; docs/go.md)")
    binary = out / "go-integration.test"
    env = dict(os.environ, GOFLAGS="-mod=readonly -buildvcs=false")
    proc = await asyncio.create_subprocess_exec(
        go, "test", "-c", "-o", str(binary), "./integration",
        cwd=ROOT / "go", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await proc.communicate()
    assert proc.returncode == 0, output.decode()
    return binary


def grant_dir(path: Path, token: int, lease_id: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)
    (path / "token").write_text(f"{token}\n")
    (path / "lease-id").write_text(lease_id)
    (path / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (path / "state").write_text("held")
    return path


async def run_step(
    binary: Path, step: str, test: str, cluster: LocalCluster, ns: str, grants: Path
) -> str:
    env = dict(
        os.environ,
        FENCEDLEASE_GO_IT=step,
        KUBECONFIG=str(cluster.kubeconfig),
        FENCEDLEASE_GO_IT_NAMESPACE=ns,
        FENCEDLEASE_GO_IT_GRANT_DIR=str(grants),
    )
    proc = await asyncio.create_subprocess_exec(
        str(binary), "-test.run", f"^{test}$", "-test.v", "-test.count=1",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(120):
        output, _ = await proc.communicate()
    text = output.decode()
    assert proc.returncode == 0, text
    assert f"--- PASS: {test}" in text, text  # ran, not skipped
    return text


async def test_a_go_holder_writes_and_a_superseded_one_is_refused_typed(
    objects: Objects, tmp_path: Path
) -> None:
    binary = await build(tmp_path)
    fence = objects.fence
    await declared(objects)
    ns = await fence.namespace()
    await fence.lease(ns, "ctl")

    old = await fence.grant(ns, "ctl", "replica-a")
    grants = grant_dir(tmp_path / "grant-a", old.token, old.lease_id)
    await run_step(binary, "holder", "TestHolder", fence.cluster, ns, grants)
    assert await data_of(fence, ns, "cfg") == "go-a"
    await fence.marked(ns, "ctl", old.token)

    new = await fence.grant(ns, "ctl", "replica-b")  # the new holder writes
    stamp = {"annotations": {"fencedlease.io/token": str(new.token)}}
    body = {"metadata": stamp, "data": {"owner": "b"}}
    await fence.kubectl("patch", "configmap", "-n", ns, "cfg", "-p", json.dumps(body))
    await fence.marked(ns, "ctl", new.token)

    out = await run_step(binary, "superseded", "TestSuperseded", fence.cluster, ns, grants)
    assert "update: refused stale_fence by objects-" in out, out
    assert await data_of(fence, ns, "cfg") == "b"
