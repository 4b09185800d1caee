"""The admission webhook's HTTPS server (aiohttp): one path per review kind, and ``GET /healthz``.

========================  ==============================================================
``POST /fence``           FencedArtifact writes (:mod:`.admission`, :class:`FenceChecker`)
``POST /fence-release``   a holder's FencedRelease (:mod:`.releases`)
``POST /fence-claim``     a worker's FencedClaim (:mod:`.claims`)
``POST /fence-object``    labelled objects of the kinds FencePolicies declare (:mod:`.objects`)
========================  ==============================================================

Each webhook entry calls its own path, so no handler tells review kinds apart by their body.
Until 0.3, ``/fence`` also answers FencedRelease and FencedClaim reviews, which a
configuration written before the webhook routed by path (one entry for all three) sends there
(docs/operations.md, "Upgrading"). A review of another kind on a path is ``invalid``; a bug
in a handler answers ``unavailable``, never HTTP 500.

TLS material is ``tls.crt`` / ``tls.key`` in ``settings.webhook_cert_dir`` (a Secret mount in
a cluster, the operator's own CA-signed pair in local mode).  A background task checks the
files' mtimes every ``reload_interval`` seconds and loads a renewed pair into the live
``SSLContext``; new connections get the new certificate, open ones are unaffected, and a
half-written pair is retried on the next tick (the old one keeps serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from fencedlease import metrics, pki
from fencedlease.events import EventSink
from fencedlease.settings import Settings, WebhookRegistration
from fencedlease.webhook import claims, releases
from fencedlease.webhook.checker import FenceChecker, FenceStore, LeaseLookup, check_budget
from fencedlease.webhook.objects import parse_object_review
from fencedlease.webhook.parents import ParentReader
from fencedlease.webhook.reads import CoalescedReads
from fencedlease.webhook.reviews import (
    MAX_DEPTH,
    AllowedWriters,
    Verdict,
    review_response,
    review_uid,
    too_deep,
)

log = logging.getLogger(__name__)

Review = Callable[[Any], Coroutine[Any, Any, dict[str, Any]]]
"""One path's handler: AdmissionReview body → AdmissionReview reply."""

FENCE_PATH = "/fence"
"""FencedArtifact writes (and, until 0.3, releases and claims of an earlier configuration)."""
RELEASE_PATH = "/fence-release"
CLAIM_PATH = "/fence-claim"
OBJECT_PATH = "/fence-object"
"""Fenced objects of the kinds FencePolicies declare (docs/fenced-objects.md)."""
MAX_BODY = 3 * 1024 * 1024  # the API server's request limit is 3 MiB
NUM_TICKETS = 0
"""TLS 1.3 session tickets sent after a handshake (OpenSSL's default: 2). The API server's
webhook client (client-go) keeps no session cache, so it never resumes a session and every
ticket is encrypted, written and thrown away: measured, a connection costs the webhook about
0.09 ms less CPU without them (docs/performance.md, "The fenced write: nearly free"). Under
load client-go opens a new connection for about one review in five (it keeps 25 idle
connections per host)."""


class AdmissionServer:
    """Serves the fence check over TLS.

    ``settings``: ``webhook_host``, ``webhook_port`` (0: any free port; see :attr:`port`),
    ``webhook_cert_dir`` (required), ``allowed_writers``, ``webhook_registration``
    (``url``: create the local CA and serving cert there first if missing).
    ``store``: the grant authority (:class:`fencedlease.store.etcd.EtcdStore`).
    ``lease_lookup``: ``(namespace, name) -> fencingPolicy | None`` (sync or async).
    ``events``: where denial Events go (``None``: no Events).
    ``parents``: reads the object a ``scale`` write scales (``None``: such writes of a Pod are
    ``unavailable``; :class:`.parents.ApiParents` in a process).
    """

    def __init__(
        self,
        settings: Settings,
        store: FenceStore,
        lease_lookup: LeaseLookup,
        events: EventSink | None = None,
        *,
        reload_interval: float = 2.0,
        check_timeout: float | None = None,
        shutdown_timeout: float | None = None,
        parents: ParentReader | None = None,
    ) -> None:
        if settings.webhook_cert_dir is None:
            raise ValueError("settings.webhook_cert_dir is required to serve the webhook (TLS)")
        self.settings = settings
        self.cert_dir: Path = settings.webhook_cert_dir
        self.reads = CoalescedReads(store)
        """The store as the checker sees it: concurrent reviews of one token share a read."""
        self.checker = FenceChecker(
            self.reads,
            lease_lookup,
            events,
            writers=AllowedWriters.parse(settings.allowed_writers),
            timeout=(
                check_budget(settings.webhook_timeout_seconds)
                if check_timeout is None
                else check_timeout
            ),
        )
        self.objects = FenceChecker(
            self.reads,
            lease_lookup,
            events,
            writers=self.checker.writers,
            timeout=self.checker.timeout,
            parse=parse_object_review,
            parents=parents,
        )
        """The same check for labelled objects of declared kinds (``POST /fence-object``)."""
        self.reload_interval = reload_interval
        self.shutdown_timeout = (
            self.checker.timeout + 1.0 if shutdown_timeout is None else shutdown_timeout
        )
        """Seconds :meth:`stop` lets an in-flight review finish before it is cancelled (the
        check's own budget and a margin: a review never needs longer)."""
        self._runner: web.AppRunner | None = None
        self._ssl: ssl.SSLContext | None = None
        self._loaded: tuple[float, float] | None = None
        self._reloader: asyncio.Task[None] | None = None
        self._port: int | None = None
        self.in_flight = 0
        """Reviews being answered now (:meth:`stop` logs how many it had to wait for)."""

    @property
    def cert_file(self) -> Path:
        return self.cert_dir / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.cert_dir / "tls.key"

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("AdmissionServer is not started")
        return self._port

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def serving(self) -> bool:
        """Able to answer reviews: listening with TLS and the checker running (readiness)."""
        return self._runner is not None and self.checker.running and self.objects.running

    # ----------------------------------------------------------------------------- TLS

    def _mtimes(self) -> tuple[float, float]:
        return (os.stat(self.cert_file).st_mtime, os.stat(self.key_file).st_mtime)

    def reload_certificates(self) -> bool:
        """Load ``tls.crt``/``tls.key`` if they changed since the last load; ``True`` if so."""
        assert self._ssl is not None
        try:
            mtimes = self._mtimes()
        except FileNotFoundError:
            log.warning(
                "webhook certificate files missing in %s; keeping the old ones", self.cert_dir
            )
            return False
        if mtimes == self._loaded:
            return False
        try:
            self._ssl.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (ssl.SSLError, OSError) as error:
            log.warning("could not load renewed webhook certificate (will retry): %s", error)
            return False
        self._loaded = mtimes
        log.info("webhook serving certificate (re)loaded from %s", self.cert_dir)
        return True

    async def _reload_loop(self) -> None:
        while True:
            await asyncio.sleep(self.reload_interval)
            try:
                self.reload_certificates()
            except Exception:  # keep serving with the old certificate
                log.exception("certificate reload failed")

    # -------------------------------------------------------------------------- handlers

    async def review_artifact(self, body: Any) -> dict[str, Any]:
        return await self.checker.review(body)

    async def review_release(self, body: Any) -> dict[str, Any]:
        return await releases.review_release(self.reads, body, self.checker.timeout)

    async def review_claim(self, body: Any) -> dict[str, Any]:
        return claims.review_claim(body)

    async def review_object(self, body: Any) -> dict[str, Any]:
        return await self.objects.review(body)

    async def review_any_of_three(self, body: Any) -> dict[str, Any]:
        """``/fence`` until 0.3: an earlier configuration (one entry) sends FencedArtifact,
        FencedRelease and FencedClaim reviews all here (told apart by the review's resource)."""
        if releases.is_release_review(body):
            return await self.review_release(body)
        if claims.is_claim_review(body):
            return await self.review_claim(body)
        return await self.review_artifact(body)

    async def _fence(self, request: web.Request) -> web.Response:
        return await self._serve(request, self.review_any_of_three)

    async def _fence_release(self, request: web.Request) -> web.Response:
        return await self._serve(request, self.review_release)

    async def _fence_claim(self, request: web.Request) -> web.Response:
        return await self._serve(request, self.review_claim)

    async def _fence_object(self, request: web.Request) -> web.Response:
        return await self._serve(request, self.review_object)

    async def _serve(self, request: web.Request, review: Review) -> web.Response:
        self.in_flight += 1
        try:
            return await self._answer(request, review)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, review: Review) -> web.Response:
        try:
            body = loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _invalid_body("body is not JSON")
        except RecursionError:
            return _invalid_body(f"body nests deeper than {MAX_DEPTH} levels")
        if too_deep(body):
            return _invalid_body(f"body nests deeper than {MAX_DEPTH} levels")
        try:
            reply = await review(body)
        except Exception as error:  # a bug: never a 500, never admitted unchecked
            log.exception("answering an AdmissionReview on %s failed", request.path)
            verdict = Verdict.unavailable(f"internal error: {type(error).__name__}")
            reply = review_response(review_uid(body), verdict)
        return web.Response(body=dumps(reply), content_type="application/json")

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    # ------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._runner is not None:
            return
        if self.settings.webhook_registration is WebhookRegistration.URL:
            await asyncio.to_thread(
                pki.ensure_local_certificates,
                self.settings.webhook_cert_dir,
                self.settings.webhook_url_host,
            )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.num_tickets = NUM_TICKETS
        self._ssl = context
        if not self.reload_certificates():
            raise FileNotFoundError(f"no usable tls.crt/tls.key in {self.cert_dir}")
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes(
            [
                web.post(FENCE_PATH, self._fence),
                web.post(RELEASE_PATH, self._fence_release),
                web.post(CLAIM_PATH, self._fence_claim),
                web.post(OBJECT_PATH, self._fence_object),
                web.get("/healthz", self._healthz),
            ]
        )
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=self.shutdown_timeout
        )
        await runner.setup()
        family = socket.AF_INET6 if ":" in self.settings.webhook_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.settings.webhook_host, self.settings.webhook_port))
            sock.setblocking(False)
            site = web.SockSite(runner, sock, ssl_context=context)
            await site.start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._port = int(sock.getsockname()[1])
        self._runner = runner
        self._reloader = asyncio.create_task(self._reload_loop(), name="webhook-cert-reload")
        self.checker.start()
        self.objects.start()
        log.info(
            "fence webhook listening on https://%s:%d%s",
            self.settings.webhook_host,
            self._port,
            FENCE_PATH,
        )

    async def stop(self) -> None:
        """Stop serving, in bounded time: in-flight reviews get :attr:`shutdown_timeout`
        seconds to finish and are then cancelled (the API server sees a failed call and, with
        ``failurePolicy: Fail``, refuses the write); then the checker counts what is pending
        and gives queued Events the same bound."""
        reloader, self._reloader = self._reloader, None
        if reloader is not None:
            reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reloader
        runner, self._runner = self._runner, None
        if runner is not None:
            if self.in_flight:
                log.info(
                    "stopping the webhook with %d reviews in flight (bound %.1fs each)",
                    self.in_flight,
                    self.shutdown_timeout,
                )
            # aiohttp waits up to shutdown_timeout for a handler, cancels it, and waits up to
            # shutdown_timeout again; the outer bound covers a handler that ignores the cancel.
            try:
                async with asyncio.timeout(2 * self.shutdown_timeout + 1.0):
                    await runner.cleanup()
            except TimeoutError:
                log.warning("webhook server did not shut down cleanly within the bound")
        await self.checker.stop(within=self.shutdown_timeout)
        await self.objects.stop(within=self.shutdown_timeout)
        await self.reads.close()


def loads(raw: bytes) -> Any:
    """Parse a review body: orjson (a review parses several times faster than with ``json``),
    and ``json`` for what orjson refuses, so every body is judged exactly as before: a lone
    surrogate escape (``"\\ud800"``, which ``json`` accepts and the checks then call
    ``invalid``), nesting past orjson's limit (``json`` raises :class:`RecursionError`: 400)
    and everything that is not JSON at all (:class:`ValueError`: 400)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps(reply: dict[str, Any]) -> bytes:
    """Serialise a reply: orjson, or ``json`` for a string orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(reply)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(reply).encode()


def _invalid_body(reason: str) -> web.Response:
    """HTTP 400 for a body that is not an AdmissionReview at all (counted, never a 500)."""
    metrics.ADMISSION_INVALID.labels("body").inc()
    return web.json_response({"error": f"invalid: {reason}"}, status=400)
