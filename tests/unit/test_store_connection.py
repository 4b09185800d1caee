"""The aetcd internals :mod:`fencedlease.store.connection` relies on are still there.

aetcd 1.0 cannot open a TLS channel, so ``TlsClient.connect`` sets the channel and stubs
itself from the client's private attributes (docs/etcd-client.md). ``pyproject.toml`` pins
aetcd; this test says what to check when the pin moves."""

from __future__ import annotations

from importlib.metadata import version

import aetcd
from aetcd import rpc, watcher

from fencedlease.store.connection import PRIVATE_ATTRIBUTES, TlsClient


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
