"""The composition root: builds the process for its role and hands each part what it needs.

``role``:

* ``controller`` — the lease store, the Kubernetes client, the token proof key, the leader
  election (:mod:`fencedlease.election`) and the
  :class:`~fencedlease.controller.runtime.Controller` (watches, caches, schedulers; it writes only
  while the election says this replica leads); with ``webhook_guard`` also the guard of the
  chart's webhook configuration;
* ``webhook`` — the lease store (read only) and the admission server; no watches, no caches;
* ``all`` — both in one process (local mode, small installs); the webhook then reads lease
  policies from the controller's cache.

A process with a controller, or one that registers its webhook by URL, has one FencePolicy
watch (:mod:`fencedlease.registration`): it feeds the controller's fenced-object watches and
the configuration's keeper (local mode's registration, chart mode's guard).

:func:`start` builds and starts it, :meth:`Process.close` stops it; Kopf hosts a process with
a controller (``fencedlease/kopfapp.py`` calls them from its startup and cleanup handlers).
This is the only module that imports the parts (:mod:`fencedlease.controller`,
:mod:`fencedlease.webhook`, :mod:`fencedlease.registration`; ``docs/design.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from fencedlease import health, metrics
from fencedlease.authority.proof import TokenProofs
from fencedlease.controller.leadership import Leadership
from fencedlease.controller.objects import DeclaredKinds, ObjectCommits
from fencedlease.controller.runtime import Controller
from fencedlease.controller.sweep import LegacySweep
from fencedlease.election.decisions import ElectionTiming
from fencedlease.election.lease_api import LeaseElection
from fencedlease.kube import ApiError, KubeApi
from fencedlease.registration.fencepolicies import PolicyWatch
from fencedlease.registration.wiring import needs_policies, start_registration
from fencedlease.settings import Role, Settings, StartupError
from fencedlease.store.etcd import EtcdStore
from fencedlease.webhook.checker import LeaseLookup
from fencedlease.webhook.leases import ApiLeaseLookup, CachedLeaseLookup, WatchedLeaseLookup
from fencedlease.webhook.server import AdmissionServer
from fencedlease.webhook.wiring import LoopFactory, event_loop_factory, settle_heap, start_webhook

log = logging.getLogger(__name__)


def loop_factory(settings: Settings) -> LoopFactory | None:
    """The event loop ``settings.role`` runs on (``None``: asyncio's default loop).

    A webhook-only process runs on ``settings.webhook_event_loop`` (uvloop by default: its TLS
    and sockets are most of a review's cost). Processes with a controller stay on asyncio: the
    renewal path is measured and tested there, and it gains little (its work is Python, not
    sockets)."""
    if settings.role is Role.WEBHOOK:
        return event_loop_factory(settings.webhook_event_loop)
    return None


@dataclass
class Process:
    """What :func:`start` built and started for one role; :meth:`close` stops it all.

    Kopf hosts a process with a controller (``fencedlease.kopfapp``: its startup handler
    calls :func:`start`, its cleanup handler :meth:`close`); a webhook-only process is
    :func:`serve_webhook`."""

    settings: Settings
    store: EtcdStore
    kube: KubeApi
    probes: Probes
    runners: list[web.AppRunner] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    controller: Controller | None = None
    election_task: asyncio.Task[None] | None = None
    closed: bool = False

    async def close(self) -> None:
        """Stop the controller's watches and passes and every task, release the election
        last (the controller has stopped writing), close the servers and clients. Once."""
        if self.closed:
            return
        self.closed = True
        if self.controller is not None:
            await self.controller.stop()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.election_task is not None:
            self.election_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.election_task
        for runner in self.runners:
            await runner.cleanup()
        await self.kube.close()
        await self.store.close()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def start(
    settings: Settings,
    *,
    stop: Callable[[], None],
    on_ready: Callable[[], None] | None = None,
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
) -> Process:
    """Build and start the process for ``settings.role``; ``stop`` ends it (called once
    ``signals`` came: a controller resigns its election first, a webhook drains first)."""
    ready = asyncio.Event()
    home = settings.namespace or os.environ.get("POD_NAMESPACE") or "default"
    store = EtcdStore.from_settings(settings)
    await store.connect()
    try:
        kube = await KubeApi.create(home_namespace=home)
    except BaseException:
        await store.close()
        raise
    process = Process(settings, store, kube, Probes(bounds(settings), ready, store.contact))
    try:
        await _start_parts(process, home, ready, stop, on_ready, signals)
    except BaseException:
        await process.close()
        raise
    return process


async def _start_parts(
    process: Process,
    home: str,
    ready: asyncio.Event,
    stop: Callable[[], None],
    on_ready: Callable[[], None] | None,
    signals: tuple[signal.Signals, ...],
) -> None:
    settings, store, kube, probes = process.settings, process.store, process.kube, process.probes
    tasks = process.tasks
    tasks.append(
        asyncio.create_task(
            probe_etcd(store, settings.health_etcd_probe_seconds, settings.etcd_timeout_seconds),
            name="etcd-probe",
        )
    )
    for port, routes in (
        (settings.metrics_port, [web.get("/metrics", _metrics)]),
        (settings.health_port, _health_routes(probes)),
    ):
        runner = await _start_http(port, routes)
        if runner is not None:
            process.runners.append(runner)
    controller: Controller | None = None
    election: LeaseElection | None = None
    policies = PolicyWatch(kube.api)  # the one FencePolicy watch, if the parts need it
    if settings.role is not Role.WEBHOOK:
        election = leader_election(settings, kube, home)
        controller = await _build_controller(settings, store, kube, home, election, tasks, policies)
        probes.controller = controller
        if election is not None:
            process.election_task = asyncio.create_task(election.run(), name="leader-election")
    if settings.role is not Role.CONTROLLER:
        probes.webhook = await _start_webhook_part(settings, store, kube, controller, tasks)
    if needs_policies(
        settings, controller=controller is not None, webhook=probes.webhook is not None
    ):
        tasks.extend(
            await start_registration(
                settings,
                kube,
                policies,
                port=probes.webhook.port if probes.webhook is not None else None,
                leader=controller.leadership.is_leader if controller is not None else None,
                on_leading=election.on_started_leading if election is not None else None,
            )
        )
    if controller is None:
        _serve_webhook_only(settings, probes, stop, ready, on_ready, tasks, signals)
        return
    listed = asyncio.Event()
    await controller.start(
        kube.api, namespace=settings.namespace, listed=listed, pod_selector=settings.pod_selector
    )
    process.controller = controller
    tasks.append(
        asyncio.create_task(
            _ready_when_listing(kube, settings, listed, ready, on_ready), name="announce"
        )
    )
    tasks.append(
        asyncio.create_task(
            _resign_on_signal(election, stop, signals)
            if election is not None
            else _on_signals(stop, signals),
            name="signals",
        )
    )


async def serve_webhook(
    settings: Settings,
    *,
    stop_flag: asyncio.Event | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Run a webhook-only process (``role=webhook``: no controller, no Kopf) until
    ``stop_flag`` is set (or forever)."""
    stop = stop_flag or asyncio.Event()
    process = await start(settings, stop=stop.set, on_ready=on_ready)
    try:
        await stop.wait()
    finally:
        await process.close()


def _serve_webhook_only(
    settings: Settings,
    probes: Probes,
    stop: Callable[[], None],
    ready: asyncio.Event,
    on_ready: Callable[[], None] | None,
    tasks: list[asyncio.Task[Any]],
    signals: tuple[signal.Signals, ...],
) -> None:
    """A process without a controller: ready at once, drained on a signal."""
    tasks.append(
        asyncio.create_task(
            _drain_on_signal(probes, stop, settings.webhook_drain_seconds, signals), name="drain"
        )
    )
    if settings.role is Role.WEBHOOK:  # no controller: the heap of startup is the heap
        frozen = settle_heap()
        log.info(
            "webhook: %d objects of startup frozen out of the GC's walks; event loop %s",
            frozen,
            type(asyncio.get_running_loop()).__module__,
        )
    _announce(ready, settings, on_ready)


async def _build_controller(
    settings: Settings,
    store: EtcdStore,
    kube: KubeApi,
    home: str,
    election: LeaseElection | None,
    tasks: list[asyncio.Task[Any]],
    policies: PolicyWatch,
) -> Controller:
    """The controller part, its token sweep and the fenced objects' commit recorder, each
    writing only while ``election`` says this replica leads (always, without one); the
    declared kinds' watches follow ``policies``."""
    proofs = TokenProofs(await token_key(settings, kube, home))
    leadership: Leadership | None = election
    controller = Controller.build(
        store, kube, proofs, leadership, pod_selector=settings.pod_selector
    )
    sweep = LegacySweep(store, controller.leadership)
    tasks.append(asyncio.create_task(sweep.run(), name="token-sweep"))
    commits = ObjectCommits(store, kube, controller.leadership)
    kinds = DeclaredKinds(kube.api, commits, settings.namespace)
    policies.follow(kinds.declare)  # the declared kinds, told by the one FencePolicy watch
    tasks.append(asyncio.create_task(commits.run(), name="object-commits"))
    tasks.append(asyncio.create_task(kinds.run(), name="fenced-kinds"))
    if election is not None:
        election.on_started_leading(controller.leadership_started)
        election.on_started_leading(sweep.leadership_started)
        election.on_started_leading(commits.leadership_started)
    else:  # a single replica by contract: it always writes
        metrics.CONTROLLER_LEADER.set(1)
        sweep.leadership_started()
        commits.leadership_started()
    return controller


async def _start_webhook_part(
    settings: Settings,
    store: EtcdStore,
    kube: KubeApi,
    controller: Controller | None,
    tasks: list[asyncio.Task[Any]],
) -> AdmissionServer:
    """The webhook part, its lease policies from the controller's cache (``role=all``) or
    from its own list + watch table (``role=webhook``): its readiness probe."""
    api_lookup = ApiLeaseLookup(kube)
    lookup: LeaseLookup
    if controller is not None:
        lookup = CachedLeaseLookup(controller.leases, api_lookup)
    else:  # no controller cache: the webhook keeps its own (no API GET per review)
        watched = WatchedLeaseLookup(kube, api_lookup, settings.namespace)
        tasks.append(asyncio.create_task(watched.run(), name="lease-policies"))
        lookup = watched
    probe, webhook_tasks = await start_webhook(settings, store, kube, lookup)
    tasks.extend(webhook_tasks)
    return probe


async def _on_signals(
    on_signal: Callable[[], None],
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
    *,
    restore: bool = True,
) -> None:
    """Call ``on_signal`` on each of ``signals`` until cancelled, then (``restore``) give
    them their default actions back. Under Kopf, these replace Kopf's own handlers of the
    same signals (installed before its startup handlers run). Outside the main thread it
    returns at once: the embedding program handles signals."""
    loop = asyncio.get_running_loop()
    try:
        for sig in signals:
            loop.add_signal_handler(sig, on_signal)
    except (RuntimeError, ValueError, NotImplementedError):
        return
    try:
        await asyncio.Event().wait()
    finally:
        if restore:
            for sig in signals:
                loop.remove_signal_handler(sig)


async def _resign_on_signal(
    election: LeaseElection,
    stop: Callable[[], None],
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
) -> None:
    """A stop signal: stop writing and release the election Lease first (a standby takes
    over within a retry period), then ``stop`` (Kopf stops; its cleanup ends the
    controller's watches and passes)."""
    resigning: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        if not resigning:
            resigning.append(asyncio.create_task(election.resign(), name="resign-election"))
            resigning[0].add_done_callback(lambda _: stop())

    # The handler stays once cancelled: a signal during the shutdown starts no second one.
    await _on_signals(on_signal, signals, restore=False)


async def _drain_on_signal(
    probes: Probes,
    stop: Callable[[], None],
    drain_seconds: float,
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
) -> None:
    """A stop signal in a process without a controller (role=webhook): answer not ready and
    keep serving for ``drain_seconds`` (the Service drops this Pod from its endpoints, so the
    API server sends its reviews elsewhere), then ``stop``; the caller stops the server,
    which gives reviews in flight their bound. A second signal stops at once.

    Without this the default SIGTERM action ended the process mid-review: the API server saw
    failed calls and, with ``failurePolicy: Fail``, refused those writes."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if probes.stopping:
            stop()
            return
        probes.stopping = True
        log.info("stopping: not ready, serving reviews for %.1fs more", drain_seconds)
        loop.call_later(drain_seconds, stop)

    await _on_signals(on_signal, signals)


def leader_election(settings: Settings, kube: KubeApi, home: str) -> LeaseElection | None:
    """The controller's election (``None`` when disabled: a single replica by contract)."""
    if not settings.leader_election:
        return None
    identity = settings.leader_election_identity or (
        f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    )
    timing = ElectionTiming(
        lease_duration=settings.leader_election_lease_duration_seconds,
        renew_deadline=settings.leader_election_renew_deadline_seconds,
        retry_period=settings.leader_election_retry_period_seconds,
        skew=settings.clock_skew_seconds,
    )
    namespace = settings.leader_election_namespace or home
    log.info(
        "leader election: Lease %s/%s as %s", namespace, settings.leader_election_name, identity
    )
    return LeaseElection(kube.api, namespace, settings.leader_election_name, identity, timing)


def _announce(
    ready: asyncio.Event, settings: Settings, on_ready: Callable[[], None] | None
) -> None:
    ready.set()
    log.info("fencedlease operator ready (role=%s)", settings.role.value)
    if on_ready:
        on_ready()


async def _ready_when_listing(
    kube: KubeApi,
    settings: Settings,
    listed: asyncio.Event,
    ready: asyncio.Event,
    on_ready: Callable[[], None] | None,
) -> None:
    """Ready once the controller's watches listed everything once and the API answers our
    credentials; say why not, and retry."""
    await listed.wait()
    while True:
        try:
            await kube.list_leases_probe(settings.namespace)
            break
        except Exception as exc:
            log.warning("not ready: listing FencedLeases failed (%s); retrying", exc)
            await asyncio.sleep(5)
    _announce(ready, settings, on_ready)


async def token_key(settings: Settings, kube: KubeApi, namespace: str) -> bytes:
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
    except ApiError as exc:
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


# --------------------------------------------------------------------------- health


def bounds(settings: Settings) -> health.Bounds:
    return health.Bounds(
        scheduler_stall=settings.health_scheduler_stall_seconds,
        watch_grace=settings.health_watch_grace_seconds,
        etcd_liveness=settings.health_etcd_liveness_seconds,
        etcd_readiness=settings.health_etcd_readiness_seconds,
    )


@dataclass
class Probes:
    """What ``/healthz`` and ``/readyz`` read: the parts' observations, decided by
    :mod:`fencedlease.health` (docs/operations.md, "Health")."""

    bounds: health.Bounds
    ready: asyncio.Event
    etcd: health.EtcdContact
    controller: Controller | None = None
    webhook: AdmissionServer | None = None
    stopping: bool = False
    """Told to stop: not ready while it drains (:func:`_drain_on_signal`)."""
    clock: Callable[[], float] = field(default=time.monotonic)

    def liveness(self) -> health.Health:
        controller = self.controller
        return health.liveness(
            self.clock(),
            self.bounds,
            schedulers=controller.progress() if controller is not None else (),
            watches=controller.watches if controller is not None else None,
            etcd=self.etcd,
        )

    def observed(self) -> dict[str, Any]:
        """Seconds since each observation (``?verbose``; ``null``: never)."""
        now = self.clock()

        def ago(when: float | None) -> float | None:
            return None if when is None else round(now - when, 3)

        found: dict[str, Any] = {
            "etcd": {
                "lastSuccessAgo": ago(self.etcd.last_success),
                "lastFailureAgo": ago(self.etcd.last_failure),
                "lastError": self.etcd.error or None,
            }
        }
        if self.controller is not None:
            found["schedulers"] = {
                p.name: {"dueFor": ago(p.waiting_since), "lastProgressAgo": ago(p.last_progress)}
                for p in self.controller.progress()
            }
            found["watches"] = {w: ago(t) for w, t in sorted(self.controller.watches.last.items())}
        if self.webhook is not None:
            found["webhookServing"] = self.webhook.serving
        return found

    def readiness(self) -> health.Health:
        webhook = self.webhook
        return health.readiness(
            self.clock(),
            self.bounds,
            started=self.ready.is_set(),
            etcd=self.etcd,
            webhook_serving=webhook.serving if webhook is not None else None,
            stopping=self.stopping,
        )


async def probe_etcd(store: EtcdStore, every: float, bound: float) -> None:
    """Read etcd's revision whenever no round trip happened for ``every`` seconds, so health
    sees etcd in an idle process too (each read is recorded in ``store.contact``)."""
    contact = store.contact
    while True:
        await asyncio.sleep(every / 2)
        last = max(contact.last_success or contact.since, contact.last_failure or contact.since)
        if store.clock() - last < every:
            continue
        before = store.clock()
        try:
            async with asyncio.timeout(bound + 1.0):
                await store.current_revision()
        except Exception as error:  # the store records its StoreUnavailable; anything else here
            if contact.last_failure is None or contact.last_failure < before:
                contact.failed(store.clock(), f"read: {error!r}"[:300])


def _health_routes(probes: Probes) -> list[web.RouteDef]:
    """``ok`` (200), or the reasons as JSON (500 / 503); ``?verbose``: JSON with what the
    verdict was decided from, always."""

    def answer(request: web.Request, verdict: health.Health, failing: int) -> web.Response:
        status = 200 if verdict.ok else failing
        if "verbose" in request.query:
            return web.json_response({**verdict.as_json(), **probes.observed()}, status=status)
        if verdict.ok:
            return web.Response(text="ok")
        return web.json_response(verdict.as_json(), status=status)

    async def healthz(request: web.Request) -> web.Response:
        verdict = probes.liveness()
        if not verdict.ok:
            log.warning("liveness failing: %s", "; ".join(verdict.reasons))
        return answer(request, verdict, 500)

    async def readyz(request: web.Request) -> web.Response:
        return answer(request, probes.readiness(), 503)

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]
