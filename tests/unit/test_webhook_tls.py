"""The webhook's TLS server, on each event loop a process may run it on (asyncio, uvloop): it
answers over TLS 1.3 and sends no session tickets (the API server's client never resumes a
session, so a ticket is work thrown away on every new connection; docs/performance.md,
"The fenced write: nearly free")."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from fencedlease.settings import Settings
from fencedlease.webhook.server import NUM_TICKETS, AdmissionServer

from .test_webhook_timeout import BlockedStore

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop] | None] = {"asyncio": None}
try:
    import uvloop

    LOOPS["uvloop"] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency where wheels exist
    pass


def _lookup(namespace: str, name: str) -> str | None:
    return "AllowEqual"


def _get_healthz(port: int, cafile: Path) -> tuple[str, str, bool]:
    """One TLS connection from a client that keeps sessions: (protocol, status line, whether
    the server handed it a resumable session)."""
    context = ssl.create_default_context(cafile=str(cafile))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := tls.recv(4096):  # tickets, if any, arrive before the reply
            reply += chunk
        session = tls.session
        resumable = session is not None and session.has_ticket
        return str(tls.version()), reply.split(b"\r\n", 1)[0].decode(), resumable


async def _serve_one(tmp_path: Path) -> tuple[str, str, bool]:
    settings = Settings(
        webhook_host="127.0.0.1",
        webhook_port=0,
        webhook_cert_dir=tmp_path / "certs",
        webhook_registration="url",
    )
    server = AdmissionServer(settings, BlockedStore(), _lookup, reload_interval=3600)
    await server.start()
    try:
        return await asyncio.to_thread(_get_healthz, server.port, tmp_path / "certs" / "ca.crt")
    finally:
        await server.stop()


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_server_answers_over_tls_13_without_session_tickets(tmp_path: Path, loop: str) -> None:
    assert NUM_TICKETS == 0
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        version, status, resumable = runner.run(_serve_one(tmp_path))
    assert version == "TLSv1.3"
    assert status == "HTTP/1.1 200 OK"
    assert not resumable, "the server sent a session ticket no API server will use"
