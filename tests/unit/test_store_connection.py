"""The aetcd internals :mod:`fencedlease.store.connection` relies on are still there.

aetcd 1.0 cannot open a TLS channel, so ``TlsClient.connect`` sets the channel and stubs
itself from the client's private attributes (docs/etcd-client.md). ``pyproject.toml`` pins
aetcd; this test says what to check when the pin moves."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from typing import cast

import aetcd
import pytest
from aetcd import rpc, watcher

from fencedlease.authority.types import StoreUnavailable
from fencedlease.store.connection import PRIVATE_ATTRIBUTES, Connection, TlsClient


def test_aetcd_is_the_pinned_version() -> None:
    assert version("aetcd") == "1.0.0"


def test_the_private_attributes_and_stubs_exist() -> None:
    client = TlsClient("127.0.0.1", 1, timeout=1.0, credentials=None)
    assert isinstance(client, aetcd.Client)
    for name in PRIVATE_ATTRIBUTES:
        assert hasattr(client, name), name
    assert not client.connected
    for stub in ("KVStub", "ClusterStub", "LeaseStub", "MaintenanceStub", "WatchStub"):
        assert hasattr(rpc, stub), stub
    assert hasattr(rpc, "secure_channel") and hasattr(watcher, "Watcher")


class _OpenClient:
    """A connected client whose channel is closed under a call (grpc.aio cancels it)."""

    connected = True

    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def _connection() -> Connection:
    return Connection(
        ["http://127.0.0.1:1", "http://127.0.0.1:2"],
        timeout=1.0,
        tls_files=(None, None, None),
        clock=lambda: 0.0,
        on_header=lambda _header: None,
    )


async def test_a_call_cancelled_under_it_is_unavailable_not_cancelled() -> None:
    """Failing over closes the channel concurrent calls share; grpc.aio cancels those calls.
    Such a call failed like any etcd error: ``StoreUnavailable``, never a ``CancelledError``
    that ends the caller's task (a reconcile pass that was then never scheduled again)."""
    connection = _connection()
    connection._client = cast(TlsClient, _OpenClient())

    async def cancelled_by_the_channel(_client: object) -> None:
        raise asyncio.CancelledError

    with pytest.raises(StoreUnavailable):
        await connection.rpc("read", cancelled_by_the_channel)


async def test_cancelling_the_caller_still_cancels() -> None:
    connection = _connection()
    connection._client = cast(TlsClient, _OpenClient())
    started = asyncio.Event()

    async def forever(_client: object) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(connection.rpc("read", forever))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
