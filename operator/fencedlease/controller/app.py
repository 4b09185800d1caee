"""Process wiring: Kopf handlers (thin), the scheduler, health and metrics endpoints.

Kopf watches FencedLeases, Pods and FencedArtifacts and only feeds in-memory caches and pokes
the scheduler; the scheduler runs :class:`LeaseReconciler` passes. A finalizer (Kopf
``on.delete``) releases a deleted lease and cleans its Pod annotations.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf
from aiohttp import web
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fencedlease import metrics
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactKey, ArtifactObject, ArtifactRecorder
from fencedlease.controller.kube import KubeClient
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.controller.reconciler import LeaseCache, LeaseObject, LeaseReconciler
from fencedlease.controller.scheduler import Scheduler
from fencedlease.models import ARTIFACTS, GROUP, LEASES, VERSION, FencedLeaseSpec
from fencedlease.settings import Role, Settings, StartupError, WebhookRegistration
from fencedlease.store.etcd import EtcdStore
from fencedlease.webhook.guard import ChartRegistrationGuard

log = logging.getLogger(__name__)
registry = kopf.OperatorRegistry()


@dataclass
class Runtime:
    """Everything the handlers need, passed to them through Kopf's ``memo``."""

    settings: Settings
    store: EtcdStore
    kube: KubeClient
    pods: PodCache
    leases: LeaseCache
    reconciler: LeaseReconciler
    scheduler: Scheduler[LeaseKey]
    artifacts: ArtifactRecorder
    artifact_scheduler: Scheduler[ArtifactKey]
    ready: asyncio.Event


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.runtime
    return runtime


# ------------------------------------------------------------------------------ handlers


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (no client library needed)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.event(GROUP, VERSION, LEASES, registry=registry)
async def lease_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    body = event.get("object") or {}
    lease = LeaseObject.from_body(body)
    if event.get("type") == "DELETED":
        rt.leases.remove(lease.key)
        rt.scheduler.forget(lease.key)
        return
    known = rt.leases.get(lease.key)
    rt.leases.upsert(lease)
    if (
        known is not None
        and _same_for_reconcile(known, lease)
        and rt.leases.unverified(lease.key) is None
    ):
        return  # e.g. our own status write coming back: the scheduler already has it
    rt.scheduler.poke(lease.key)


def _same_for_reconcile(a: LeaseObject, b: LeaseObject) -> bool:
    """Only spec (generation), annotations (force release) and deletion can move a lease."""
    return (a.uid, a.generation, a.annotations, a.deleting) == (
        b.uid,
        b.generation,
        b.annotations,
        b.deleting,
    )


@kopf.on.delete(GROUP, VERSION, LEASES, registry=registry, optional=False)
async def lease_deleted(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    namespace = namespace or ""
    rt.scheduler.forget(LeaseKey(namespace, name))
    await rt.reconciler.finalize(namespace, name)


@kopf.on.event("", "v1", "pods", registry=registry)
async def pod_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    rt = _runtime(memo)
    pod = PodInfo.from_body(event.get("object") or {})
    if event.get("type") == "DELETED":
        previous = rt.pods.remove(pod.namespace, pod.name)
    else:
        previous = rt.pods.upsert(pod)
    if previous is not None and _same_for_leases(previous, pod) and event.get("type") != "DELETED":
        return
    for lease in rt.leases.in_namespace(pod.namespace):
        if isinstance(lease.spec, FencedLeaseSpec) and (
            lease.spec.holder_selector.matches(pod.labels)
            or (previous is not None and lease.spec.holder_selector.matches(previous.labels))
            or lease.status.holder == pod.name
        ):
            rt.scheduler.poke(lease.key)


def _same_for_leases(a: PodInfo, b: PodInfo) -> bool:
    """Only changes that can move a lease matter (annotations are ours)."""
    return (a.labels, a.eligible, a.uid) == (b.labels, b.eligible, b.uid)


@kopf.on.event(GROUP, VERSION, ARTIFACTS, registry=registry)
async def artifact_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """Committed artifact states feed the recorder (high-water mark, finalizer, status)."""
    rt = _runtime(memo)
    artifact = ArtifactObject.from_body(event.get("object") or {})
    if event.get("type") == "DELETED":
        rt.artifacts.remove(artifact.key)
        rt.artifact_scheduler.forget(artifact.key)
        return
    rt.artifacts.upsert(artifact)
    rt.artifact_scheduler.poke(artifact.key)


# --------------------------------------------------------------------------- endpoints


async def _start_http(
    port: int, routes: list[web.RouteDef], host: str = "0.0.0.0"
) -> web.AppRunner | None:
    if port == 0:
        return None
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _health_routes(ready: asyncio.Event) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        if ready.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="starting")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]


async def _phase_gauge(leases: LeaseCache, every: float = 5.0) -> None:
    while True:
        for phase, count in leases.phases().items():
            metrics.LEASES_BY_PHASE.labels(phase).set(count)
        await asyncio.sleep(every)


def kopf_settings(settings: Settings) -> kopf.OperatorSettings:
    """Kopf settings: watch timeouts against silent streams, our own finalizer and storage."""
    ks = kopf.OperatorSettings()
    ks.watching.server_timeout = 300
    ks.watching.client_timeout = 330
    ks.watching.connect_timeout = 30
    ks.watching.inactivity_timeout = 600
    ks.persistence.finalizer = "fencedlease.io/finalizer"
    ks.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="fencedlease.io")
    ks.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="fencedlease.io", key="last-handled-configuration"
    )
    ks.posting.level = logging.WARNING
    ks.networking.request_timeout = 30
    return ks


# ----------------------------------------------------------------------------- run


async def run_operator(
    settings: Settings,
    *,
    stop_flag: asyncio.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or forever)."""
    stop = stop_flag or asyncio.Event()
    ready = asyncio.Event()
    store = EtcdStore.from_settings(settings)
    await store.connect()
    home = settings.namespace or os.environ.get("POD_NAMESPACE") or "default"
    kube = await KubeClient.create(home_namespace=home)
    key = (
        secrets.token_bytes(32)  # a webhook-only process never signs statuses
        if settings.role is Role.WEBHOOK
        else await _token_key(settings, kube, home)
    )
    pods, leases = PodCache(), LeaseCache(TokenProofs(key))
    reconciler = LeaseReconciler(store, kube, pods, leases)
    scheduler: Scheduler[LeaseKey] = Scheduler(
        reconciler.reconcile, concurrency=32, priority=reconciler.priority
    )
    artifacts = ArtifactRecorder(store, kube)
    artifact_scheduler: Scheduler[ArtifactKey] = Scheduler(artifacts.reconcile, concurrency=16)
    runtime = Runtime(
        settings,
        store,
        kube,
        pods,
        leases,
        reconciler,
        scheduler,
        artifacts,
        artifact_scheduler,
        ready,
    )
    runners: list[web.AppRunner] = []
    tasks: list[asyncio.Task[Any]] = []
    try:
        for port, routes in (
            (settings.metrics_port, [web.get("/metrics", _metrics)]),
            (settings.health_port, _health_routes(ready)),
        ):
            runner = await _start_http(port, routes)
            if runner is not None:
                runners.append(runner)
        extra = await _start_webhook(settings, runtime)
        tasks.extend(extra)
        if settings.role is Role.WEBHOOK:
            ready.set()
            if on_ready:
                on_ready()
            await stop.wait()
            return
        if settings.webhook_guard and settings.webhook_registration is WebhookRegistration.NONE:
            guard = ChartRegistrationGuard(settings, kube.api, kube)
            tasks.append(asyncio.create_task(guard.watch(), name="webhook-guard"))
        tasks.append(asyncio.create_task(scheduler.run(), name="scheduler"))
        tasks.append(asyncio.create_task(artifact_scheduler.run(), name="artifact-scheduler"))
        tasks.append(asyncio.create_task(_phase_gauge(leases), name="phase-gauge"))
        kopf_ready = asyncio.Event()

        async def announce() -> None:
            await kopf_ready.wait()
            while True:  # ready once the API answers our credentials; say why not, and retry
                try:
                    await kube.list_leases_probe(settings.namespace)
                    break
                except Exception as exc:
                    log.warning("not ready: listing FencedLeases failed (%s); retrying", exc)
                    await asyncio.sleep(5)
            ready.set()
            log.info("fencedlease operator ready (role=%s)", settings.role.value)
            if on_ready:
                on_ready()

        tasks.append(asyncio.create_task(announce(), name="announce"))
        memo = kopf.Memo(runtime=runtime)
        namespaced = settings.namespace is not None
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(settings),
            standalone=True,
            clusterwide=not namespaced,
            namespaces=[settings.namespace] if settings.namespace else (),
            memo=memo,
            stop_flag=stop,
            ready_flag=kopf_ready,
        )
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runner in runners:
            await runner.cleanup()
        await kube.close()
        await store.close()


async def _token_key(settings: Settings, kube: KubeClient, namespace: str) -> bytes:
    """The key that signs lease statuses: a file (chart) or a Secret created on first start."""
    if settings.token_key_file is not None:
        try:
            key = settings.token_key_file.read_bytes().strip()
        except OSError as exc:
            raise StartupError(
                f"cannot read the token proof key FENCEDLEASE_TOKEN_KEY_FILE="
                f"{settings.token_key_file}: {exc.strerror or exc}"
            ) from exc
        if len(key) < 16:
            raise StartupError(
                f"the token proof key in {settings.token_key_file} is shorter than 16 bytes"
            )
        return key
    try:
        return await kube.secret_value(
            namespace, settings.authority_secret, "token-key", secrets.token_bytes(32)
        )
    except ApiException as exc:
        log.error(
            "cannot read or create Secret %s/%s (%s %s): lease statuses are signed with a key "
            "that ends with this process, so after a restart the restore guard cannot trust "
            "them. Set FENCEDLEASE_TOKEN_KEY_FILE or grant get/create on that Secret.",
            namespace,
            settings.authority_secret,
            exc.status,
            exc.reason,
        )
        return secrets.token_bytes(32)


async def _start_webhook(settings: Settings, runtime: Runtime) -> list[asyncio.Task[Any]]:
    """Start the admission webhook when this process serves it (role all or webhook)."""
    if settings.role is Role.CONTROLLER:
        return []
    try:
        wiring = importlib.import_module("fencedlease.webhook.wiring")
    except ImportError:  # pragma: no cover - the webhook package is optional during bring-up
        log.warning("admission webhook not available in this build")
        return []
    tasks: list[asyncio.Task[Any]] = await wiring.start_webhook(settings, runtime)
    return tasks
