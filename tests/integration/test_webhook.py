"""The fence webhook through the real API server, over real TLS (SPEC §3.5-3.6, issue 5).

The :class:`AdmissionServer` runs in this test process (the session event loop); the real
kube-apiserver calls it on 127.0.0.1 through a MutatingWebhookConfiguration registered by
``registration.ensure_registered``.  Tokens come from the real :class:`EtcdStore` (same etcd as
the API server, own key prefix).  No controller runs: tests create FencedLeases for their
policy and take tokens straight from the store.

The configuration only selects namespaces labelled for this module, so the rest of the session
(other test modules) never depends on this in-process server.  Every kubectl call runs in a
thread: the webhook shares this event loop and must stay free to answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.authority.types import Acquired, HighWaterMark
from fencedlease.controller.artifacts import ArtifactObject, ArtifactRecorder
from fencedlease.controller.kube import KubeClient
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import ARTIFACTS, GROUP, VERSION
from fencedlease.settings import Settings
from fencedlease.store.etcd import EtcdStore
from fencedlease.webhook.events import KubeEvents
from fencedlease.webhook.leases import ApiLeaseLookup
from fencedlease.webhook.registration import Registration, ensure_registered
from fencedlease.webhook.server import AdmissionServer

pytestmark = pytest.mark.timeout(90)

LABEL = "fencedlease.io/fence-test"


@dataclass
class FakeClock:
    """The store's monotonic clock (its time authority): tests expire leases by advancing it."""

    now: float = 10_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FenceHarness:
    """An in-process webhook registered with the session's API server, plus helpers."""

    cluster: LocalCluster
    settings: Settings
    store: EtcdStore
    api: client.ApiClient
    server: AdmissionServer
    registration: Registration
    selector_value: str
    clock: FakeClock
    namespaces: list[str] = field(default_factory=list)
    recorder_task: asyncio.Task[None] | None = None

    async def record_commits(self) -> None:
        """The controller's part in this harness: an :class:`ArtifactRecorder` fed by a
        watch of the harness's namespaces (the mark follows committed writes only)."""
        recorder = ArtifactRecorder(self.store, KubeClient(self.api))
        while True:
            stream = watch.Watch().stream(
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                ARTIFACTS,
                timeout_seconds=60,
            )
            async for event in stream:
                obj = event["object"]
                if obj.get("metadata", {}).get("namespace") not in self.namespaces:
                    continue
                art = ArtifactObject.from_body(obj)
                if event["type"] == "DELETED":
                    recorder.remove(art.key)
                    continue
                recorder.upsert(art)
                await recorder.reconcile(art.key)

    async def marked(self, ns: str, lease: str, token: int) -> None:
        """Wait until the recorder has advanced ``lease``'s mark to ``token`` (bounded)."""

        async def done() -> bool:
            mark = await self.hwm(ns, lease)
            return mark is not None and mark.token >= token

        await self._settle(done, f"mark of {ns}/{lease} at {token}")

    async def accepted(self, ns: str, name: str, token: int) -> None:
        """Wait until the recorder wrote ``status.acceptedFence == token`` on ``name`` (its
        writes make the API server re-run admission for a concurrent write, so tests that
        count admissions let it settle first)."""

        async def done() -> bool:
            obj = await self.get(ns, name) or {}
            return bool(obj.get("status", {}).get("acceptedFence") == token)

        await self._settle(done, f"acceptedFence {token} on {ns}/{name}")

    async def gone(self, ns: str, name: str) -> None:
        """Wait until artifact ``name`` is deleted (its finalizer removed by the recorder)."""

        async def done() -> bool:
            return await self.get(ns, name) is None

        await self._settle(done, f"{ns}/{name} deleted")

    async def _settle(self, done: Callable[[], Awaitable[bool]], what: str) -> None:
        for _ in range(200):  # 10 s
            if await done():
                return
            if self.recorder_task is not None and self.recorder_task.done():
                self.recorder_task.result()  # the recorder died: show why
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.cluster.kubectl, *args, input=input, check=check)

    async def namespace(self) -> str:
        name = f"fw-{uuid.uuid4().hex[:10]}"
        await self.kubectl("create", "namespace", name)
        await self.kubectl("label", "namespace", name, f"{LABEL}={self.selector_value}")
        self.namespaces.append(name)
        return name

    async def lease(self, ns: str, name: str, policy: str = "AllowEqual") -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FencedLease",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "leaseDurationSeconds": 30,
                "fencingPolicy": policy,
                "holderSelector": {"matchLabels": {"app": name}},
            },
        }
        await self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "fencedleases", body)

    async def grant(self, ns: str, lease: str, holder: str) -> Acquired:
        """A new generation for ``holder``: the current one (if any) is let expire first."""
        result = await self.store.acquire(ns, lease, holder, 30)
        if not isinstance(result, Acquired):
            self.clock.now += 31  # the lease expires on the store's clock
            result = await self.store.acquire(ns, lease, holder, 30)
        assert isinstance(result, Acquired), result
        return result

    async def hwm(self, ns: str, lease: str) -> HighWaterMark | None:
        return await self.store.high_water_mark(ns, lease)

    async def get(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, ns, ARTIFACTS, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def events_for(self, ns: str, name: str) -> list[dict[str, Any]]:
        core = client.CoreV1Api(self.api)
        found = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        return [self.api.sanitize_for_serialization(e) for e in found.items]


def artifact(
    ns: str, name: str, lease: str, token: int, object_ref: str, op: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "leaseRef": {"name": lease},
        "fencingToken": token,
        "objectRef": object_ref,
    }
    if op is not None:
        spec["operationId"] = op
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FencedArtifact",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


@dataclass
class Outcome:
    ok: bool
    status: int
    message: str
    obj: dict[str, Any] | None = None


async def publish(
    custom: client.CustomObjectsApi,
    body: dict[str, Any],
    *,
    resource_version: str | None = None,
    dry_run: bool = False,
) -> Outcome:
    """Create the artifact, or update its spec: a PUT with ``resource_version`` (the
    precondition), else a merge patch (no precondition: the API server retries a lost race
    itself, calling the webhook again with the new stored object)."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    try:
        if resource_version is not None:
            new = json.loads(json.dumps(body))
            new["metadata"]["resourceVersion"] = resource_version
            obj = await custom.replace_namespaced_custom_object(
                GROUP, VERSION, ns, ARTIFACTS, name, new, **kwargs
            )
            return Outcome(True, 200, "", obj)
        # Read first: a CREATE of an existing name is admitted (or refused) before the API
        # server finds the name taken, so "create, then update on AlreadyExists" would spend
        # a StrictlyGreater grant on a write that cannot commit.
        try:
            await custom.get_namespaced_custom_object(GROUP, VERSION, ns, ARTIFACTS, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            obj = await custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, ARTIFACTS, body, **kwargs
            )
            return Outcome(True, 200, "", obj)
        spec = dict(body["spec"])
        spec.setdefault("operationId", None)
        obj = await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            ARTIFACTS,
            name,
            {"spec": spec},
            _content_type="application/merge-patch+json",
            **kwargs,
        )
    except ApiException as exc:
        message = exc.body if isinstance(exc.body, str) else str(exc.body)
        with contextlib.suppress(ValueError):
            message = json.loads(message).get("message", message)
        return Outcome(False, int(exc.status or 0), message)
    return Outcome(True, 200, "", obj)


def fence_count(result: str, operation: str) -> float:
    return metrics.fence_results_total(result, operation)


async def api_client(kubeconfig: Path) -> client.ApiClient:
    return await config.new_client_from_config(config_file=str(kubeconfig))


async def start_harness(
    cluster: LocalCluster, cert_dir: Path, *, allowed_writers: tuple[str, ...] = ("admin",)
) -> FenceHarness:
    """``allowed_writers``: the session's admin kubeconfig (user ``admin``) may write."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        webhook_host="127.0.0.1",
        webhook_port=0,
        webhook_cert_dir=cert_dir,
        webhook_registration="url",
        webhook_configuration_name=f"fencedlease-test-{tag}",
        etcd_endpoints=[cluster.etcd_endpoint],
        etcd_prefix=f"/fencedlease-test-{tag}",
        allowed_writers=list(allowed_writers),
    )
    clock = FakeClock()
    store = EtcdStore.from_settings(settings, clock=clock)
    await store.connect()
    api = await api_client(cluster.kubeconfig)
    server = AdmissionServer(settings, store, ApiLeaseLookup(api), KubeEvents(api))
    await server.start()
    registration = await ensure_registered(
        settings,
        server.port,
        api,
        events=KubeEvents(api),
        namespace_selector={"matchLabels": {LABEL: tag}},
    )
    harness = FenceHarness(cluster, settings, store, api, server, registration, tag, clock)
    harness.recorder_task = asyncio.create_task(harness.record_commits())
    return harness


async def stop_harness(h: FenceHarness) -> None:
    if h.recorder_task is not None:
        h.recorder_task.cancel()
        await asyncio.gather(h.recorder_task, return_exceptions=True)
    await h.registration.remove()
    await h.server.stop()
    await h.store.close()
    await h.api.close()


@pytest.fixture(scope="module")
async def fence(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FenceHarness]:
    harness = await start_harness(cluster, tmp_path_factory.mktemp("webhook-tls"))
    try:
        yield harness
    finally:
        await stop_harness(harness)


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
    b = await fence.grant(ns, "dry", "worker-b")
    first = await publish(fence.custom, artifact(ns, "cat", "dry", a.token, "a.tmp", op="1"))
    assert first.ok, first.message

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
    # Still at a: a same-token write with a new operation id is applied.
    again = await publish(fence.custom, artifact(ns, "cat", "dry", a.token, "a2.tmp", op="4"))
    assert again.ok, again.message
    await fence.server.checker.events.drain()
    assert [e for e in await fence.events_for(ns, "cat") if e["type"] == "Warning"] == []


async def test_status_writes_record_only_the_stored_token(fence: FenceHarness) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "st", policy="StrictlyGreater")
    g = await fence.grant(ns, "st", "worker-a")
    assert (await publish(fence.custom, artifact(ns, "cat", "st", g.token, "o"))).ok

    async def set_status(accepted: int) -> Outcome:
        try:
            obj = await fence.custom.patch_namespaced_custom_object_status(
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
    grants = [await fence.grant(ns, "busy", f"worker-{i}") for i in range(4)]
    tokens = [g.token for g in grants for _ in range(5)]
    random.Random(7).shuffle(tokens)
    go = asyncio.Event()
    admitted: list[tuple[int, int]] = []  # (resourceVersion, token) of every admitted write
    refused: list[str] = []
    first = await publish(fence.custom, artifact(ns, "cat", "busy", grants[0].token, "w-init"))
    assert first.ok and first.obj is not None
    admitted.append((int(first.obj["metadata"]["resourceVersion"]), grants[0].token))

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
        g2 = await own.grant(ns, "down", "worker-b")
        ok = await publish(own.custom, artifact(ns, "cat", "down", g.token, "up.tmp"))
        assert ok.ok, ok.message
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
    deleted = metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("deleted")._value.get()
    altered = metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("altered")._value.get()
    await guard.ensure()
    task = asyncio.create_task(guard.watch(resync_seconds=10))
    try:
        guard.restored.clear()
        await admission.delete_mutating_webhook_configuration(guard.name)
        await asyncio.wait_for(guard.restored.wait(), 15)
        current = await guard.current()
        assert current is not None
        assert metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("deleted")._value.get() == (
            deleted + 1
        )
        current["webhooks"][0]["failurePolicy"] = "Ignore"
        guard.restored.clear()
        await admission.replace_mutating_webhook_configuration(guard.name, current)
        await asyncio.wait_for(guard.restored.wait(), 15)
        assert guard.restores == 2
        restored = await guard.current()
        assert restored is not None and restored["webhooks"][0]["failurePolicy"] == "Fail"
        assert metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("altered")._value.get() == (
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
