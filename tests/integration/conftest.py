"""Fixtures of the integration tests (the control plane itself is in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from fencedlease.local.cluster import EtcdServer, LocalCluster

from .fence_harness import FenceHarness, start_harness, stop_harness


@pytest.fixture(scope="module")
async def fence(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FenceHarness]:
    """An in-process fence webhook for the module (see :mod:`.fence_harness`)."""
    harness = await start_harness(cluster, tmp_path_factory.mktemp("webhook-tls"))
    try:
        yield harness
    finally:
        await stop_harness(harness)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """An etcd of the test module's own (the store tests: no API server needed)."""
    base = tmp_path_factory.mktemp("etcd")
    server = EtcdServer(base / "data", base / "etcd.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
