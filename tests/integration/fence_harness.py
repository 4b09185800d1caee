"""An in-process fence webhook registered with the session's API server, plus helpers.

The :class:`AdmissionServer` runs in the test process (the session event loop); the real
kube-apiserver calls it on 127.0.0.1 through a MutatingWebhookConfiguration registered by
``Registration.registered``.  Tokens come from the real :class:`EtcdStore` (same etcd as
the API server, own key prefix).  An :class:`ArtifactRecorder` fed by a watch plays the
controller's part (the high-water mark follows committed writes only).  The configuration only
selects namespaces labelled for the harness, so nothing else in the session depends on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.authority.types import Acquired, HighWaterMark
from fencedlease.controller.artifacts import ArtifactObject, ArtifactRecorder
from fencedlease.events import KubeEvents
from fencedlease.kube import KubeApi
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import ARTIFACTS, GROUP, VERSION
from fencedlease.registration.selfregistration import Registration
from fencedlease.settings import Settings
from fencedlease.store.etcd import EtcdStore
from fencedlease.webhook.leases import ApiLeaseLookup
from fencedlease.webhook.parents import ApiParents
from fencedlease.webhook.server import AdmissionServer
from tests.fakes import FakeClock

LABEL = "fencedlease.io/fence-test"


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
        recorder = ArtifactRecorder(self.store, KubeApi(self.api))
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
        obj = await custom.patch_namespaced_custom_object(  # type: ignore[call-arg]
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
    cluster: LocalCluster,
    cert_dir: Path,
    *,
    allowed_writers: tuple[str, ...] = ("admin",),
    etcd_endpoint: str | None = None,
) -> FenceHarness:
    """``allowed_writers``: the session's admin kubeconfig (user ``admin``) may write;
    ``etcd_endpoint``: the store's etcd (default: the API server's)."""
    tag = f"t{uuid.uuid4().hex[:8]}"  # never a number to kubectl's YAML (01835740, 12e45678)
    settings = Settings(
        webhook_host="127.0.0.1",
        webhook_port=0,
        webhook_cert_dir=cert_dir,
        webhook_registration="url",
        webhook_configuration_name=f"fencedlease-test-{tag}",
        etcd_endpoints=[etcd_endpoint or cluster.etcd_endpoint],
        etcd_prefix=f"/fencedlease-test-{tag}",
        allowed_writers=list(allowed_writers),
        # Races hand out up to 30 grants of one lease before any is used; with the default
        # retention (16) the first ones would be pruned and answer unknown_token. Retention
        # has its own tests (test_store_retention.py, test_authority_retention.py).
        token_retention_generations=64,
    )
    clock = FakeClock()
    store = EtcdStore.from_settings(settings, clock=clock)
    await store.connect()
    api = await api_client(cluster.kubeconfig)
    server = AdmissionServer(
        settings, store, ApiLeaseLookup(KubeApi(api)), KubeEvents(api), parents=ApiParents(api)
    )
    await server.start()
    registration = await Registration(
        settings,
        server.port,
        api,
        KubeEvents(api),
        namespace_selector={"matchLabels": {LABEL: tag}},
    ).registered()
    harness = FenceHarness(cluster, settings, store, api, server, registration, tag, clock)
    harness.recorder_task = asyncio.create_task(harness.record_commits())
    return harness


STOP_BOUND = 30.0
"""Seconds each teardown step may take: a step past it is named in the failure instead of
the whole module's teardown hanging until the test timeout."""


async def stop_harness(h: FenceHarness) -> None:
    """Stop everything the harness started, each step bounded; every step runs, and the
    steps that overran (or failed) are reported together."""
    problems: list[str] = []

    async def step(what: str, action: Awaitable[object]) -> None:
        try:
            async with asyncio.timeout(STOP_BOUND):
                await action
        except TimeoutError:
            problems.append(f"{what} did not finish within {STOP_BOUND}s")
        except Exception as exc:
            problems.append(f"{what} failed: {exc!r}")

    if h.recorder_task is not None:
        h.recorder_task.cancel()
        await step("the recorder", asyncio.gather(h.recorder_task, return_exceptions=True))
    await step("registration.remove", h.registration.remove())
    await step("server.stop", h.server.stop())
    await step("store.close", h.store.close())
    await step("api.close", h.api.close())
    if problems:
        raise AssertionError("fence harness teardown: " + "; ".join(problems))
