"""A delaying, reordering and duplicating HTTP proxy between the holders and the API server.

Holders talk plain HTTP to the proxy on loopback; the proxy forwards every request (with the
holder's own bearer token, so the API server still sees the Pod-bound identity) to the real
kube-apiserver over TLS. The nemesis sets, per holder, how its writes are treated:

- ``delay(holder, seconds)``: hold each of its writes that long before delivering it — the
  partitioned owner whose token-41 write reaches the API server after 42 was admitted;
- ``jitter(seconds)``: random extra delay on every write (requests overtake each other);
- ``duplicate(holder)``: deliver each of its writes twice (a retried request on the network),
  the holder seeing only the first answer.

Writes are requests that change a FencedArtifact (POST, PUT, PATCH); reads pass untouched.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

WRITES = frozenset({"POST", "PUT", "PATCH"})


@dataclass
class Rules:
    delays: dict[str, tuple[float, float]] = field(default_factory=dict)  # holder → (s, until)
    duplicates: dict[str, float] = field(default_factory=dict)  # holder → until
    jitter: float = 0.0
    jitter_until: float = 0.0


class FaultProxy:
    def __init__(self, upstream: str, ca_file: str, holders: dict[str, str], seed: int) -> None:
        """``holders``: bearer token → holder name (who is sending)."""
        self.upstream = upstream.rstrip("/")
        self.holders = holders
        self.rules = Rules()
        self.rng = random.Random(seed)
        self.delivered = 0
        self.duplicated = 0
        self.delayed = 0
        self._ssl = ssl.create_default_context(cafile=ca_file)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ nemesis controls

    def delay(self, holder: str, seconds: float, duration: float) -> None:
        self.rules.delays[holder] = (seconds, time.monotonic() + duration)

    def duplicate(self, holder: str, duration: float) -> None:
        self.rules.duplicates[holder] = time.monotonic() + duration

    def jitter(self, seconds: float, duration: float) -> None:
        self.rules.jitter, self.rules.jitter_until = seconds, time.monotonic() + duration

    # ------------------------------------------------------------------ serving

    async def start(self) -> int:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=200),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        app = web.Application(client_max_size=4 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server) and server.sockets
        self.port = int(server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _holder(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return self.holders.get(auth.removeprefix("Bearer ").strip(), "")

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, bytes, str]:
        assert self._session is not None
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() in {"authorization", "content-type", "accept", "user-agent"}
        }
        async with self._session.request(
            request.method, f"{self.upstream}{request.path_qs}", data=body, headers=headers
        ) as resp:
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        holder = self._holder(request)
        now = time.monotonic()
        if request.method in WRITES and "fencedartifacts" in request.path:
            wait = 0.0
            delay = self.rules.delays.get(holder)
            if delay is not None and now < delay[1]:
                wait += delay[0]
                self.delayed += 1
            if now < self.rules.jitter_until:
                wait += self.rng.uniform(0.0, self.rules.jitter)
            if wait:
                await asyncio.sleep(wait)
            if now < self.rules.duplicates.get(holder, 0.0):
                self.duplicated += 1
                first, second = await asyncio.gather(
                    self._forward(request, body),
                    self._forward(request, body),
                    return_exceptions=True,
                )
                answer = first if not isinstance(first, BaseException) else second
                if isinstance(answer, BaseException):
                    return web.Response(status=502, text=f"proxy: {answer}")
                return self._reply(answer)
        try:
            answer = await self._forward(request, body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return web.Response(status=502, text=f"proxy: {exc}")
        return self._reply(answer)

    def _reply(self, answer: tuple[int, bytes, str]) -> web.Response:
        self.delivered += 1
        status, payload, ctype = answer
        return web.Response(
            status=status, body=payload, headers={"Content-Type": ctype or "application/json"}
        )
