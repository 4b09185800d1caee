"""fencedlease.client's publish and CLI through the real webhook and kube-apiserver.

Every explicit result (Applied, Duplicate, StaleFence, Rejected(code), Unavailable) of the SDK
(sync and asyncio) and of ``fencedlease publish`` (its exit codes) is produced by the real
fence.  Writers publish as Pod-bound service-account identities (``kubectl create token
--bound-object-kind=Pod``), so the webhook's holder check applies to every write whatever its
setting for non-Pod writers.  Tokens come from the store as in test_webhook.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fencedlease.client import (
    Applied,
    AsyncKubeClient,
    AsyncPublisher,
    Duplicate,
    KubeClient,
    Publisher,
    Rejected,
    RetryPolicy,
    StaleFence,
    Unavailable,
)
from fencedlease.client.cli_common import (
    EXIT_ABSENT,
    EXIT_DUPLICATE,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_STALE_FENCE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from fencedlease.client.validation import InvalidInput
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import ARTIFACTS, GROUP

from .fence_harness import FenceHarness, fence_count, start_harness, stop_harness
from .test_webhook import _pod_identity
from .workers import pod_config, write_kubeconfig

pytestmark = pytest.mark.timeout(120)

FAST = RetryPolicy(attempts=3, base_delay=0.05, max_delay=0.2)


@pytest.fixture(scope="module")
async def fence(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FenceHarness]:
    harness = await start_harness(cluster, tmp_path_factory.mktemp("client-tls"))
    try:
        yield harness
    finally:
        await stop_harness(harness)


def write_grant(directory: Path, token: int, lease_id: str = "l-1", state: str = "held") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    (directory / "token").write_text(str(token))
    (directory / "lease-id").write_text(lease_id)
    (directory / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (directory / "state").write_text(state)
    return directory


async def settle(fence: FenceHarness, ns: str, name: str) -> None:
    """Wait until the artifact's resourceVersion stops moving.  The operator may follow a
    publish with writes of its own (status, finalizers); the API server re-runs admission for a
    write that races with one, which would count a refusal twice."""
    last = None
    for _ in range(20):
        obj = await fence.get(ns, name) or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version is not None and version == last:
            return
        last = version
        await asyncio.sleep(0.3)


async def cli(*args: str, kubeconfig: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    env.pop("POD_NAMESPACE", None)
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fencedlease", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def test_every_sdk_result_through_the_webhook(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    await fence.lease(ns, "report-august")
    tokens = await _pod_identity(fence, ns, "publisher", ["worker-a", "worker-b"])
    a = await fence.grant(ns, "report-july", "worker-a")
    with KubeClient(pod_config(fence.cluster, tokens["worker-a"], ns)) as kube:
        pub = Publisher(kube, retry=FAST)

        def publish(**kw: Any) -> Any:
            return pub.publish("catalog", lease="report-july", **kw)

        first = await asyncio.to_thread(
            publish, token=a.token, object_ref="reports/july/a7.tmp", operation_id="a7-1"
        )
        assert isinstance(first, Applied), first
        assert first.obj is not None and first.obj["spec"]["objectRef"] == "reports/july/a7.tmp"
        # A retry of the same operation: the webhook says duplicate.
        dup = await asyncio.to_thread(
            publish, token=a.token, object_ref="reports/july/a7.tmp", operation_id="a7-1"
        )
        assert isinstance(dup, Duplicate), dup
        # A second publish under the same grant (AllowEqual): applied.
        second = await asyncio.to_thread(
            publish, token=a.token, object_ref="reports/july/a7-2.tmp", operation_id="a7-2"
        )
        assert isinstance(second, Applied), second
        # Prepared against the first version, delivered after the second: conflict.
        late = await asyncio.to_thread(
            publish,
            token=a.token,
            object_ref="reports/july/a7-3.tmp",
            operation_id="a7-3",
            expected_version=first.version,
        )
        assert isinstance(late, Rejected) and late.code == "conflict", late
        # A forged token, and another lease's token.
        forged = (await fence.store.current_revision()) + 1_000_000
        unknown = await asyncio.to_thread(publish, token=forged, object_ref="x")
        assert isinstance(unknown, Rejected) and unknown.code == "unknown_token", unknown
        august = await fence.grant(ns, "report-august", "worker-a")
        foreign = await asyncio.to_thread(publish, token=august.token, object_ref="x")
        assert isinstance(foreign, Rejected) and foreign.code == "lease_mismatch", foreign
        # An objectRef the webhook refuses as malformed.
        invalid = await asyncio.to_thread(publish, token=a.token, object_ref="x" * 2000)
        assert isinstance(invalid, Rejected) and invalid.code == "invalid", invalid

    # worker-b's identity may not write worker-a's token.
    with KubeClient(pod_config(fence.cluster, tokens["worker-b"], ns)) as kube:
        other = await asyncio.to_thread(  # sync calls in a thread: the webhook shares our loop
            Publisher(kube, retry=FAST).publish,
            "catalog",
            lease="report-july",
            token=a.token,
            object_ref="b.tmp",
        )
        assert isinstance(other, Rejected) and other.code == "holder_mismatch", other

    # B takes over (A's lease expires on the store's clock) and publishes; A is stale.
    b = await fence.grant(ns, "report-july", "worker-b")
    assert b.token > a.token
    with KubeClient(pod_config(fence.cluster, tokens["worker-b"], ns)) as kube:
        ok = await asyncio.to_thread(
            Publisher(kube, retry=FAST).publish,
            "catalog",
            lease="report-july",
            token=b.token,
            object_ref="reports/july/b9.tmp",
        )
        assert isinstance(ok, Applied), ok

    await settle(fence, ns, "catalog")
    stale_before = fence_count("stale_fence", "update")
    with KubeClient(pod_config(fence.cluster, tokens["worker-a"], ns)) as kube:
        pub = Publisher(kube, retry=RetryPolicy(attempts=5, base_delay=0.01))
        stale = await asyncio.to_thread(
            pub.publish,
            "catalog",
            lease="report-july",
            token=a.token,
            object_ref="reports/july/a7-4.tmp",
        )
        assert isinstance(stale, StaleFence), stale
        # Never retried: one read and one write, and the webhook counted exactly one refusal.
        assert [c.method for c in pub.calls] == ["GET", "PUT"]
    assert fence_count("stale_fence", "update") == stale_before + 1
    obj = await fence.get(ns, "catalog")
    assert obj is not None and obj["spec"]["objectRef"] == "reports/july/b9.tmp"


async def test_rbac_refusal_is_rejected_forbidden(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "l")
    await fence.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    token = (await fence.kubectl("create", "token", "nobody", "-n", ns)).stdout.strip()
    g = await fence.grant(ns, "l", "worker-a")
    with KubeClient(pod_config(fence.cluster, token, ns)) as kube:
        result = await asyncio.to_thread(
            Publisher(kube, retry=FAST).publish, "cat", lease="l", token=g.token, object_ref="x"
        )
    assert isinstance(result, Rejected) and result.code == "forbidden", result
    assert result.status_code == 403


async def test_async_publisher_and_stale_fence_is_never_retried(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "multi", policy="StrictlyGreater")
    tokens = await _pod_identity(fence, ns, "publisher", ["worker-a"])
    g = await fence.grant(ns, "multi", "worker-a")
    async with AsyncKubeClient(pod_config(fence.cluster, tokens["worker-a"], ns)) as kube:
        sleeps: list[float] = []

        async def no_sleep(seconds: float) -> None:
            sleeps.append(seconds)

        pub = AsyncPublisher(kube, retry=RetryPolicy(attempts=5), sleep=no_sleep)
        first = await pub.publish("cat", lease="multi", token=g.token, object_ref="one")
        assert isinstance(first, Applied), first
        pub.calls.clear()
        await settle(fence, ns, "cat")
        before = fence_count("stale_fence", "update")
        # StrictlyGreater: a second write under the same grant is stale_fence, definitively.
        second = await pub.publish("cat", lease="multi", token=g.token, object_ref="two")
        assert isinstance(second, StaleFence), second
        assert [c.method for c in pub.calls] == ["GET", "PUT"] and sleeps == []
        assert fence_count("stale_fence", "update") == before + 1
        with pytest.raises(Exception, match="stale_fence"):
            second.raise_for_result()


async def test_unavailable_after_bounded_retries(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    own = await start_harness(cluster, tmp_path_factory.mktemp("client-down-tls"))
    try:
        ns = await own.namespace()
        await own.lease(ns, "down")
        tokens = await _pod_identity(own, ns, "publisher", ["worker-a"])
        g = await own.grant(ns, "down", "worker-a")
        config = pod_config(cluster, tokens["worker-a"], ns)
        kubeconfig = write_kubeconfig(tmp_path / "kc", cluster, tokens["worker-a"], ns)
        grant_dir = write_grant(tmp_path / "grant", g.token)
        with KubeClient(config) as kube:
            up = await asyncio.to_thread(
                Publisher(kube, retry=FAST).publish,
                "cat",
                lease="down",
                token=g.token,
                object_ref="up",
            )
            assert isinstance(up, Applied), up
        await own.server.stop()  # the fence is down: failurePolicy Fail refuses every write
        sleeps: list[float] = []
        with KubeClient(config) as kube:
            pub = Publisher(kube, retry=RetryPolicy(attempts=3), sleep=sleeps.append)
            result = await asyncio.to_thread(
                pub.publish, "cat", lease="down", token=g.token, object_ref="down"
            )
        assert isinstance(result, Unavailable), result
        assert result.attempts == 3 and len(sleeps) == 2
        assert [c.method for c in pub.calls] == ["GET", "PUT"] * 3
        out = await cli(
            "publish", "cat", "--lease", "down", "--object-ref", "down", "--dir", str(grant_dir),
            "--attempts", "2", kubeconfig=kubeconfig,
        )  # fmt: skip
        assert out.returncode == EXIT_UNAVAILABLE, out.stderr
        obj = await own.get(ns, "cat")
        assert obj is not None and obj["spec"]["objectRef"] == "up"
    finally:
        await stop_harness(own)


async def test_cli_publish_exit_codes(fence: FenceHarness, tmp_path: Path) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    tokens = await _pod_identity(fence, ns, "publisher", ["worker-a", "worker-b"])
    a = await fence.grant(ns, "report-july", "worker-a")
    kc_a = write_kubeconfig(tmp_path / "a.kubeconfig", fence.cluster, tokens["worker-a"], ns)
    kc_b = write_kubeconfig(tmp_path / "b.kubeconfig", fence.cluster, tokens["worker-b"], ns)
    dir_a = write_grant(tmp_path / "a", a.token, a.lease_id)

    def args(directory: Path, ref: str, *extra: str) -> list[str]:
        return ["publish", "report-july-catalog", "--lease", "report-july", "--object-ref", ref,
                "--dir", str(directory), *extra]  # fmt: skip

    out = await cli(*args(dir_a, "reports/july/a7.tmp", "--operation-id", "a7", "--json"),
                    kubeconfig=kc_a)  # fmt: skip
    assert out.returncode == EXIT_OK, out.stderr
    assert json.loads(out.stdout)["result"] == "applied"
    assert out.stderr.startswith("applied:")
    out = await cli(*args(dir_a, "reports/july/a7.tmp", "--operation-id", "a7"), kubeconfig=kc_a)
    assert out.returncode == EXIT_DUPLICATE, out.stderr
    assert out.stderr.split("denied the request: ")[-1].startswith("duplicate:")
    # worker-b publishing with worker-a's grant files: holder_mismatch -> rejected.
    out = await cli(*args(dir_a, "reports/july/x.tmp"), kubeconfig=kc_b)
    assert out.returncode == EXIT_REJECTED and "holder_mismatch" in out.stderr, out.stderr
    # No grant files at all (an empty directory): absent. No directory: an error, said.
    (tmp_path / "none").mkdir()
    out = await cli(*args(tmp_path / "none", "reports/july/x.tmp"), kubeconfig=kc_a)
    assert out.returncode == EXIT_ABSENT, out.stderr
    out = await cli(*args(tmp_path / "typo", "reports/july/x.tmp"), kubeconfig=kc_a)
    assert out.returncode == EXIT_ERROR and "does not exist" in out.stderr, out.stderr

    b = await fence.grant(ns, "report-july", "worker-b")
    dir_b = write_grant(tmp_path / "b", b.token, b.lease_id)
    out = await cli(*args(dir_b, "reports/july/b9.tmp"), kubeconfig=kc_b)
    assert out.returncode == EXIT_OK, out.stderr
    await settle(fence, ns, "report-july-catalog")
    stale_before = fence_count("stale_fence", "update")
    out = await cli(*args(dir_a, "reports/july/a7-late.tmp", "--attempts", "5"), kubeconfig=kc_a)
    assert out.returncode == EXIT_STALE_FENCE, out.stderr
    assert "stale_fence" in out.stderr
    assert fence_count("stale_fence", "update") == stale_before + 1  # not retried
    obj = await fence.get(ns, "report-july-catalog")
    assert obj is not None and obj["spec"]["objectRef"] == "reports/july/b9.tmp"
    kinds = await fence.kubectl("get", f"{ARTIFACTS}.{GROUP}", "-n", ns, "-o", "name")
    assert kinds.stdout.split() == [f"fencedartifact.{GROUP}/report-july-catalog"]


async def test_a_name_that_is_not_a_dns_subdomain_never_reaches_the_url(
    fence: FenceHarness, tmp_path: Path
) -> None:
    """Issue 31, defect 3: ``publish cart/status --token 5`` used to PUT the status subresource
    (the webhook does not fence it), wipe the artifact's status and exit 0 "applied"."""
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    tokens = await _pod_identity(fence, ns, "publisher", ["worker-a"])
    a = await fence.grant(ns, "report-july", "worker-a")
    kc = write_kubeconfig(tmp_path / "a.kubeconfig", fence.cluster, tokens["worker-a"], ns)
    with KubeClient(pod_config(fence.cluster, tokens["worker-a"], ns)) as kube:
        pub = Publisher(kube, retry=FAST)
        first = await asyncio.to_thread(
            pub.publish, "cart", lease="report-july", token=a.token, object_ref="v1"
        )
        assert isinstance(first, Applied), first
        await settle(fence, ns, "cart")
        before = await fence.get(ns, "cart")
        sent = len(pub.calls)
        for name in ("cart/status", "cart/../other", "Cart", "cart?dryRun=All", ""):
            with pytest.raises(InvalidInput):
                await asyncio.to_thread(
                    pub.publish, name, lease="report-july", token=a.token, object_ref="v2"
                )
        with pytest.raises(InvalidInput):
            await asyncio.to_thread(
                pub.publish, "cart", lease="x/status", token=a.token, object_ref="v2"
            )
        with pytest.raises(InvalidInput):
            await asyncio.to_thread(
                pub.publish,
                "cart",
                lease="report-july",
                token=a.token,
                object_ref="v2",
                namespace="a/b",
            )
        assert len(pub.calls) == sent  # nothing was sent
    for bad in (["cart/status"], ["cart", "-n", "x/y"]):
        out = await cli(
            "publish", *bad, "--lease", "report-july", "--token", "5", "--object-ref", "v2",
            kubeconfig=kc,
        )  # fmt: skip
        assert out.returncode == EXIT_USAGE, (out.returncode, out.stderr)
        assert out.stderr.startswith("fencedlease publish: error: argument"), out.stderr
        assert "invalid" in out.stderr and out.stderr.count("\n") == 1, out.stderr
        assert "Traceback" not in out.stderr
    after = await fence.get(ns, "cart")
    assert after is not None and before is not None
    assert after["spec"] == before["spec"] and after.get("status") == before.get("status")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
