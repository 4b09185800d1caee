"""The Go module's fenced clients against the real API server and fence webhook (docs/go.md).

The webhook, the policy watch and the commit recorder run in this test process
(:mod:`.objects_harness`); the Go side is ``go/integration`` (built here with ``go test -c``,
the module's own build cache) and run once per step with the session's admin kubeconfig (an
allowed writer: its token is checked, not its identity) and a fake downward-API directory; the
subresource step impersonates a Pod (:func:`as_pod`), since the fence decides its status and
scale writes by who writes.
The Go binary runs as an asyncio subprocess: the webhook shares this event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster

from .fence_harness import FenceHarness
from .objects_harness import Objects, data_of, declared
from .pod_writers import impersonating, send
from .test_fenced_object_matrix import BY_NAME, body
from .test_fenced_objects import leased

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
    binary: Path,
    step: str,
    test: str,
    cluster: LocalCluster,
    ns: str,
    grants: Path,
    extra: dict[str, str] | None = None,
) -> str:
    env = dict(
        os.environ,
        FENCEDLEASE_GO_IT=step,
        KUBECONFIG=str(cluster.kubeconfig),
        FENCEDLEASE_GO_IT_NAMESPACE=ns,
        FENCEDLEASE_GO_IT_GRANT_DIR=str(grants),
        **(extra or {}),
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


def as_pod(ns: str, pod: str) -> str:
    """A ``rest.ImpersonationConfig`` (JSON) acting as Pod ``pod`` of ``ns``, as
    :func:`.pod_writers.as_pod` does: its service account, bound to the Pod's name and UID."""
    extra = {"pod-name": [pod], "pod-uid": [f"uid-{pod}"]}
    return json.dumps(
        {
            "UserName": f"system:serviceaccount:{ns}:ctl",
            "Groups": ["system:masters"],
            "Extra": {f"authentication.kubernetes.io/{k}": v for k, v in extra.items()},
        }
    )


async def replicas(fence: FenceHarness, ns: str) -> tuple[object, object]:
    """The Deployment "web"'s ``(spec.replicas, status.replicas)``."""
    out = await fence.kubectl("get", "deployment", "-n", ns, "web", "-o", "json")
    web = json.loads(out.stdout)
    return web["spec"].get("replicas"), web.get("status", {}).get("replicas")


async def test_a_go_pod_writes_status_and_scale_only_while_it_holds_the_grant(
    objects: Objects, tmp_path: Path
) -> None:
    """docs/fenced-objects.md, "Status writes" and "Scale writes", through the Go fenced
    client acting as a Pod (impersonated): the superseded ex-holder's status and scale writes
    of the Deployment it last wrote are a typed ``stale_fence``, another Pod's a typed
    ``holder_mismatch``, the holder's are admitted; each one's DeleteAllOf sends nothing."""
    binary = await build(tmp_path)
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    kind = BY_NAME["deployment"]
    async with impersonating(fence.cluster.kubeconfig, None) as admin:
        web = body(kind, ns, "web", old.token, "go")
        status, text = await send(admin, "POST", kind.collection(ns), web, "application/json")
        assert status == 200, text
    holder = await fence.grant(ns, "ctl", "replica-b")

    found: dict[str, dict[str, str]] = {}
    after: dict[str, tuple[object, object]] = {}
    for pod, got, expect in (
        ("replica-a", old, "stale_fence"),
        ("replica-c", holder, "holder_mismatch"),  # a Pod of the namespace, never the holder
        ("replica-b", holder, "allowed"),
    ):
        grants = grant_dir(tmp_path / pod, got.token, got.lease_id)
        extra = {
            "FENCEDLEASE_GO_IT_IMPERSONATE": as_pod(ns, pod),
            "FENCEDLEASE_GO_IT_EXPECT": expect,
        }
        out = await run_step(
            binary, "subresources", "TestSubresourcesAsPod", fence.cluster, ns, grants, extra
        )
        found[pod] = dict(re.findall(r"subresource_test\.go:\d+: (status|scale): (\w+)", out))
        after[pod] = await replicas(fence, ns)
    assert found == {
        "replica-a": {"status": "stale_fence", "scale": "stale_fence"},
        "replica-c": {"status": "holder_mismatch", "scale": "holder_mismatch"},
        "replica-b": {"status": "allowed", "scale": "allowed"},
    }, found
    assert after == {"replica-a": (1, None), "replica-c": (1, None), "replica-b": (2, 3)}, after
