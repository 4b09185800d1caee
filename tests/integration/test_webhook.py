"""The fence webhook through the real API server, over real TLS (docs/fenced-publish.md).

The webhook runs in this test process (``fence`` fixture, :mod:`.fence_harness`); no operator
runs: tests create FencedLeases for their policy and take tokens straight from the store.
Every kubectl call runs in a thread: the webhook shares this event loop and must stay free to
answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.events import KubeEvents
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import ARTIFACTS, GROUP, VERSION
from fencedlease.registration.selfregistration import Registration

from .fence_harness import (
    LABEL,
    FenceHarness,
    Outcome,
    artifact,
    fence_count,
    publish,
    start_harness,
    stop_harness,
)

pytestmark = pytest.mark.timeout(90)


# ------------------------------------------------------------------------------ tests


async def test_delete_and_recreate_never_resets_the_high_water_mark(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    a = await fence.grant(ns, "report-july", "worker-a")
    b = await fence.grant(ns, "report-july", "worker-b")
    assert b.token > a.token
    ok = await publish(fence.custom, artifact(ns, "catalog", "report-july", b.token, "b9.tmp"))
    assert ok.ok, ok.message
    await fence.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, ARTIFACTS, "catalog")
    await fence.gone(ns, "catalog")  # the finalizer came off once the mark covered b

    denied = await publish(fence.custom, artifact(ns, "catalog", "report-july", a.token, "a7.tmp"))
    assert not denied.ok and denied.status == 403
    assert f"stale_fence: token {a.token} is below the high-water mark {b.token}" in (
        denied.message
    )
    assert f"{ns}/report-july" in denied.message
    assert await fence.get(ns, "catalog") is None
    mark = await fence.hwm(ns, "report-july")
    assert mark is not None and mark.token == b.token


async def test_forged_and_foreign_tokens(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "report-july")
    await fence.lease(ns, "report-august")
    july = await fence.grant(ns, "report-july", "worker-a")
    august = await fence.grant(ns, "report-august", "worker-b")
    forged = (await fence.store.current_revision()) + 1_000_000  # above every issued token

    denied = await publish(fence.custom, artifact(ns, "cat", "report-july", forged, "x.tmp"))
    assert not denied.ok and denied.status == 403
    assert f"unknown_token: token {forged}" in denied.message

    denied = await publish(fence.custom, artifact(ns, "cat", "report-july", august.token, "x"))
    assert not denied.ok and denied.status == 403
    assert f"lease_mismatch: token {august.token} was issued for lease {ns}/report-august" in (
        denied.message
    )
    assert await fence.get(ns, "cat") is None
    assert await fence.hwm(ns, "report-july") is None  # nothing was accepted
    ok = await publish(fence.custom, artifact(ns, "cat", "report-july", july.token, "j.tmp"))
    assert ok.ok, ok.message
    # leaseRef is immutable: moving the pointer to another domain is a lease_mismatch.
    moved = await publish(fence.custom, artifact(ns, "cat", "report-august", august.token, "x"))
    assert not moved.ok and "lease_mismatch" in moved.message


async def test_strictly_greater_allows_one_write_per_grant(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "strict", policy="StrictlyGreater")
    g = await fence.grant(ns, "strict", "worker-a")
    before = fence_count("stale_fence", "update")
    first = await publish(fence.custom, artifact(ns, "cat", "strict", g.token, "one.tmp"))
    assert first.ok, first.message
    await fence.accepted(ns, "cat", g.token)
    second = await publish(fence.custom, artifact(ns, "cat", "strict", g.token, "two.tmp"))
    assert not second.ok and second.status == 403
    assert f"stale_fence: token {g.token} is not above the high-water mark {g.token}" in (
        second.message
    )
    assert fence_count("stale_fence", "update") == before + 1
    obj = await fence.get(ns, "cat")
    assert obj is not None and obj["spec"]["objectRef"] == "one.tmp"
    # A metadata-only update publishes nothing and is not a second write.
    await fence.kubectl("label", "fa", "cat", "-n", ns, "team=reports")
    # The next grant may write again.
    g2 = await fence.grant(ns, "strict", "worker-b")
    third = await publish(fence.custom, artifact(ns, "cat", "strict", g2.token, "three.tmp"))
    assert third.ok, third.message


async def test_allow_equal_duplicates_and_reordered_same_token_writes(
    fence: FenceHarness,
) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "multi")
    g = await fence.grant(ns, "multi", "worker-a")
    step1 = await publish(fence.custom, artifact(ns, "cat", "multi", g.token, "p1", op="op-1"))
    assert step1.ok and step1.obj is not None, step1.message
    rv1 = step1.obj["metadata"]["resourceVersion"]

    # A retry of op-1 (same token, same operation id) is a duplicate, not a second apply.
    retry = await publish(fence.custom, artifact(ns, "cat", "multi", g.token, "p1", op="op-1"))
    assert not retry.ok and retry.status == 403
    assert retry.message.split("denied the request: ")[-1].startswith("duplicate:")
    assert "op-1 was already applied" in retry.message

    step2 = await publish(fence.custom, artifact(ns, "cat", "multi", g.token, "p2", op="op-2"))
    assert step2.ok, step2.message

    # op-3 was prepared against rv1 and arrives after op-2: the resourceVersion precondition
    # refuses it (409 Conflict from the API server itself), the pointer stays at p2.
    late = await publish(
        fence.custom,
        artifact(ns, "cat", "multi", g.token, "p3", op="op-3"),
        resource_version=rv1,
    )
    assert not late.ok and late.status == 409
    assert "the object has been modified" in late.message, late.message
    obj = await fence.get(ns, "cat")
    assert obj is not None and obj["spec"]["objectRef"] == "p2"
    # Re-read and retry op-3 with the current resourceVersion: applied (not a phantom dup).
    fresh = obj["metadata"]["resourceVersion"]
    again = await publish(
        fence.custom,
        artifact(ns, "cat", "multi", g.token, "p3", op="op-3"),
        resource_version=fresh,
    )
    assert again.ok, again.message


async def test_dry_run_does_not_move_the_high_water_mark(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "dry")
    a = await fence.grant(ns, "dry", "worker-a")
    first = await publish(fence.custom, artifact(ns, "cat", "dry", a.token, "a.tmp", op="1"))
    assert first.ok, first.message
    b = await fence.grant(ns, "dry", "worker-b")

    dry = await publish(
        fence.custom, artifact(ns, "cat", "dry", b.token, "b.tmp", op="2"), dry_run=True
    )
    assert dry.ok, dry.message
    assert dry.obj is not None and dry.obj["spec"]["fencingToken"] == b.token
    await fence.marked(ns, "dry", a.token)
    mark = await fence.hwm(ns, "dry")
    assert mark is not None and mark.token == a.token
    obj = await fence.get(ns, "cat")
    assert obj is not None and obj["spec"]["fencingToken"] == a.token
    # A dry-run stale write is refused but leaves no Event.
    stale = await publish(
        fence.custom, artifact(ns, "cat", "dry", a.token - 1, "x", op="3"), dry_run=True
    )
    assert not stale.ok
    # Still at a: a's write is refused because b's grant superseded it, not for being below
    # a mark the dry run moved (the message states the mark).
    again = await publish(
        fence.custom, artifact(ns, "cat", "dry", a.token, "a2.tmp", op="4"), dry_run=True
    )
    assert (
        not again.ok
        and (
            f"token {a.token} was superseded by the newer grant {b.token} of lease {ns}/dry "
            f"(high-water mark {a.token})"
        )
        in again.message
    ), again.message
    await fence.server.checker.events.drain()
    assert [e for e in await fence.events_for(ns, "cat") if e["type"] == "Warning"] == []


async def test_status_writes_record_only_the_stored_token(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "st", policy="StrictlyGreater")
    g = await fence.grant(ns, "st", "worker-a")
    assert (await publish(fence.custom, artifact(ns, "cat", "st", g.token, "o"))).ok

    async def set_status(accepted: int) -> Outcome:
        try:
            obj = await fence.custom.patch_namespaced_custom_object_status(  # type: ignore[call-arg]
                GROUP,
                VERSION,
                ns,
                ARTIFACTS,
                "cat",
                {"status": {"acceptedFence": accepted, "acceptedAt": "2026-07-01T00:00:00Z"}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            return Outcome(False, int(exc.status or 0), str(exc.body))
        return Outcome(True, 200, "", obj)

    wrong = await set_status(g.token + 1)
    assert not wrong.ok and "unknown_token: status.acceptedFence" in wrong.message
    right = await set_status(g.token)  # equal to the mark under StrictlyGreater: allowed
    assert right.ok, right.message
    await fence.marked(ns, "st", g.token)
    mark = await fence.hwm(ns, "st")
    assert mark is not None and mark.token == g.token
    lower = await set_status(g.token - 1)
    assert not lower.ok and "stale_fence: status.acceptedFence" in lower.message


async def test_cel_rule_refuses_a_lower_token_without_the_webhook(
    fence: FenceHarness, cluster: LocalCluster
) -> None:
    """Defence in depth: in a namespace the webhook does not select, CEL still refuses."""
    ns = f"nofence-{uuid.uuid4().hex[:8]}"
    await fence.kubectl("create", "namespace", ns)
    assert (await publish(fence.custom, artifact(ns, "cat", "l", 42, "b9"))).ok
    denied = await publish(fence.custom, artifact(ns, "cat", "l", 41, "a7"))
    assert not denied.ok and "stale_fence: spec.fencingToken may not decrease" in denied.message


async def test_twenty_concurrent_writers_never_go_backwards(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "busy")
    grants = [await fence.grant(ns, "busy", "worker-0")]
    admitted: list[tuple[int, int]] = []  # (resourceVersion, token) of every admitted write
    refused: list[str] = []
    first = await publish(fence.custom, artifact(ns, "cat", "busy", grants[0].token, "w-init"))
    assert first.ok and first.obj is not None
    admitted.append((int(first.obj["metadata"]["resourceVersion"]), grants[0].token))
    grants += [await fence.grant(ns, "busy", f"worker-{i}") for i in range(1, 4)]
    tokens = [g.token for g in grants for _ in range(5)]
    random.Random(7).shuffle(tokens)
    go = asyncio.Event()

    async def writer(i: int, token: int) -> None:
        await go.wait()
        out = await publish(fence.custom, artifact(ns, "cat", "busy", token, f"w{i}", op=f"op-{i}"))
        if out.ok:
            assert out.obj is not None
            admitted.append((int(out.obj["metadata"]["resourceVersion"]), token))
        else:
            refused.append(out.message)

    tasks = [asyncio.create_task(writer(i, t)) for i, t in enumerate(tokens)]
    await asyncio.sleep(0)
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)

    assert all("stale_fence" in m for m in refused), refused
    history = [token for _, token in sorted(admitted)]
    assert history == sorted(history), history  # no admitted write below an earlier one
    assert set(history[1:]) == {max(tokens)}  # the superseded generations: none admitted
    obj = await fence.get(ns, "cat")
    assert obj is not None
    assert obj["spec"]["fencingToken"] == max(history) == max(tokens)
    await fence.marked(ns, "busy", max(tokens))
    mark = await fence.hwm(ns, "busy")
    assert mark is not None and mark.token == max(tokens)


async def test_webhook_down_means_writes_are_refused(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    own = await start_harness(cluster, tmp_path_factory.mktemp("down-tls"))
    try:
        ns = await own.namespace()
        await own.lease(ns, "down")
        g = await own.grant(ns, "down", "worker-a")
        ok = await publish(own.custom, artifact(ns, "cat", "down", g.token, "up.tmp"))
        assert ok.ok, ok.message
        g2 = await own.grant(ns, "down", "worker-b")
        await own.server.stop()
        refused = await publish(own.custom, artifact(ns, "cat", "down", g2.token, "down.tmp"))
        assert not refused.ok
        assert "failed calling webhook" in refused.message, refused.message
        created = await publish(own.custom, artifact(ns, "other", "down", g2.token, "x"))
        assert not created.ok and "failed calling webhook" in created.message
        obj = await own.get(ns, "cat")
        assert obj is not None and obj["spec"]["objectRef"] == "up.tmp"
        assert await own.get(ns, "other") is None
    finally:
        await stop_harness(own)


async def test_registration_is_restored_and_alerted(fence: FenceHarness) -> None:
    """Delete or alter the configuration: the watchdog restores it, with Event and metric."""
    settings = fence.settings.model_copy(
        update={"webhook_configuration_name": f"fencedlease-guard-{fence.selector_value}"}
    )
    guard = Registration(
        settings,
        fence.server.port,
        fence.api,
        KubeEvents(fence.api),
        namespace_selector={"matchLabels": {LABEL: "nothing-selected"}},
    )
    admission = client.AdmissionregistrationV1Api(fence.api)
    deleted = metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("deleted", "fence")._value.get()
    altered = metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("altered", "fence")._value.get()
    await guard.ensure()
    task = asyncio.create_task(guard.watch(resync_seconds=10))
    try:
        guard.restored.clear()
        await admission.delete_mutating_webhook_configuration(guard.name)
        await asyncio.wait_for(guard.restored.wait(), 15)
        current = await guard.current()
        assert current is not None
        assert metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("deleted", "fence")._value.get() == (
            deleted + 1
        )
        current["webhooks"][0]["failurePolicy"] = "Ignore"
        guard.restored.clear()
        await admission.replace_mutating_webhook_configuration(guard.name, current)  # type: ignore[arg-type]
        await asyncio.wait_for(guard.restored.wait(), 15)
        assert guard.restores == 2
        restored = await guard.current()
        assert restored is not None and restored["webhooks"][0]["failurePolicy"] == "Fail"
        assert metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("altered", "fence")._value.get() == (
            altered + 1
        )
        core = client.CoreV1Api(fence.api)
        found = await core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={guard.name}"
        )
        reasons = {(e.type, e.reason) for e in found.items}
        assert ("Warning", "WebhookConfigurationRestored") in reasons
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await guard.remove()


async def _pod_identity(fence: FenceHarness, ns: str, sa: str, pods: list[str]) -> dict[str, str]:
    """A ServiceAccount allowed to write artifacts, Pods using it, and a Pod-bound token each
    (the API server then puts the Pod name in ``userInfo.extra``)."""
    await fence.kubectl("create", "serviceaccount", sa, "-n", ns)
    await fence.kubectl(
        "create",
        "role",
        "publisher",
        "-n",
        ns,
        "--verb=get,create,update,patch",
        f"--resource={ARTIFACTS}.{GROUP}",
    )
    await fence.kubectl(
        "create",
        "rolebinding",
        "publisher",
        "-n",
        ns,
        "--role=publisher",
        f"--serviceaccount={ns}:{sa}",
    )
    tokens = {}
    for pod in pods:
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {
                "serviceAccountName": sa,
                "containers": [{"name": "main", "image": "example.invalid/worker:1"}],
            },
        }
        await fence.kubectl("create", "-f", "-", input=json.dumps(manifest))
        out = await fence.kubectl(
            "create",
            "token",
            sa,
            "-n",
            ns,
            "--bound-object-kind=Pod",
            f"--bound-object-name={pod}",
            "--duration=10m",
        )
        tokens[pod] = out.stdout.strip()
    return tokens


def _token_client(cluster: LocalCluster, token: str) -> client.ApiClient:
    cfg = client.Configuration(host=cluster.api_url)
    cfg.ssl_ca_cert = str(cluster.ca_file)
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(cfg)


async def test_holder_binding_with_pod_bound_tokens(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "bound")
    tokens = await _pod_identity(fence, ns, "publisher", ["worker-a", "worker-b"])
    grant = await fence.grant(ns, "bound", "worker-a")  # the grant belongs to Pod worker-a
    for pod, expect_ok in (("worker-b", False), ("worker-a", True)):
        api = _token_client(fence.cluster, tokens[pod])
        try:
            out = await publish(
                client.CustomObjectsApi(api),
                artifact(ns, "cat", "bound", grant.token, f"{pod}.tmp"),
            )
        finally:
            await api.close()
        if expect_ok:
            assert out.ok, out.message
        else:
            assert not out.ok and out.status == 403, out.message
            assert f"holder_mismatch: token {grant.token} of lease {ns}/bound was issued to " in (
                out.message
            )
            assert "worker-a, not worker-b" in out.message
    obj = await fence.get(ns, "cat")
    assert obj is not None and obj["spec"]["objectRef"] == "worker-a.tmp"
