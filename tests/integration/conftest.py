"""Fixtures of the integration tests (the control plane itself is in ``tests/conftest.py``)."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from fencedlease.authority.retention import Retention
from fencedlease.local.cluster import EtcdServer, LocalCluster, ManagedProcess
from fencedlease.store.etcd import EtcdStore
from tests.fakes import FakeClock

from ..fence_servers import MinioServer, RedisServer
from ..pg import PostgresServer
from .fence_harness import FenceHarness, start_harness, stop_harness
from .k8s import running_fence
from .objects_harness import Objects, running_objects


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
async def objects(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Objects]:
    """The object webhook and the FencePolicy registration for the module
    (:func:`.objects_harness.running_objects`)."""
    async with running_objects(cluster, tmp_path_factory.mktemp("objects-tls")) as found:
        yield found


@pytest.fixture
def fence_process(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> Iterator[ManagedProcess]:
    """The operator, controller and webhook in one process, for ``namespace``
    (:func:`.k8s.running_fence`)."""
    with running_fence(cluster, tmp_path, namespace) as (proc, _):
        yield proc


# The servers behind the fences (each module that uses one starts its own).


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(port=random.randint(40000, 60000)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def minio() -> Iterator[MinioServer]:
    server = MinioServer().start()
    try:
        yield server
    finally:
        server.stop()


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


StoreFactory = Callable[..., EtcdStore]


@pytest.fixture
async def make_store(etcd: EtcdServer) -> AsyncIterator[StoreFactory]:
    """Stores on the module's etcd sharing one fresh prefix (a fake clock each):
    ``make_store(generations=3, window=600.0, cls=EtcdStore)``; closed after the test."""
    prefix = f"/r-{uuid.uuid4().hex[:8]}"
    stores: list[EtcdStore] = []

    def make(
        generations: int = 3, window: float = 600.0, cls: type[EtcdStore] = EtcdStore
    ) -> EtcdStore:
        store = cls(
            [etcd.endpoint],
            prefix=prefix,
            clock=FakeClock(),
            retention=Retention(generations, window),
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()
