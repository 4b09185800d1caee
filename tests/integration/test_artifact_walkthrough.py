"""The article's walkthrough end to end, through the real API server and the fence webhook.

1. A acquires report-july (token 41 in the article), renders ``reports/july/a7.tmp``, pauses.
2. A's lease expires (the store's clock is advanced: no sleeping).  B acquires (token 42).
3. B renders ``reports/july/b9.tmp`` and publishes it with its token (kubectl, as a user would).
4. A resumes and publishes ``reports/july/a7.tmp`` with its older token: ``stale_fence``.
5. B's pointer stays visible; the rejection is counted and evented on the artifact.

A's pause is a barrier: A's publish task waits on an event the test sets only after B published.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fencedlease import metrics
from fencedlease.authority.types import Acquired, Busy

from .fence_harness import FenceHarness, artifact

pytestmark = pytest.mark.timeout(90)


async def test_paused_report_writer_is_fenced(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    stale_before = metrics.fence_results_total("stale_fence", "update")

    a = await fence.store.acquire(ns, "report-july", "worker-a", 30)
    assert isinstance(a, Acquired)
    assert isinstance(await fence.store.acquire(ns, "report-july", "worker-b", 30), Busy)

    resume_a = asyncio.Event()
    a_staged = asyncio.Event()

    async def worker_a() -> str:
        staged = "reports/july/a7.tmp"  # immutable, not visible until published
        a_staged.set()
        await resume_a.wait()  # the "GC pause": A still believes it holds the lease
        manifest = artifact(ns, "report-july-catalog", "report-july", a.token, staged, op="a7")
        result = await fence.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)
        assert result.returncode != 0
        return result.stderr

    task_a = asyncio.create_task(worker_a())
    await asyncio.wait_for(a_staged.wait(), 5)

    fence.clock.now += 31  # A's lease expires on the grant authority's clock
    b = await fence.store.acquire(ns, "report-july", "worker-b", 30)
    assert isinstance(b, Acquired) and b.took_over_expired and b.token > a.token
    manifest = artifact(
        ns, "report-july-catalog", "report-july", b.token, "reports/july/b9.tmp", op="b9"
    )
    await fence.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    resume_a.set()
    stderr = await asyncio.wait_for(task_a, 30)
    assert "denied the request: stale_fence:" in stderr, stderr
    assert f"token {a.token} is below the high-water mark {b.token}" in stderr
    assert f"lease {ns}/report-july" in stderr

    visible = json.loads(
        (await fence.kubectl("get", "fa", "report-july-catalog", "-n", ns, "-o", "json")).stdout
    )
    assert visible["spec"]["objectRef"] == "reports/july/b9.tmp"
    assert visible["spec"]["fencingToken"] == b.token
    # Every stale write is counted (the webhook runs before the CRD's CEL rule) and evented.
    assert metrics.fence_results_total("stale_fence", "update") == stale_before + 1
    await fence.server.checker.events.drain()
    events = await fence.events_for(ns, "report-july-catalog")
    assert any(
        e["reason"] == "FenceStaleFence" and e["type"] == "Warning" and str(a.token) in e["message"]
        for e in events
    ), events
