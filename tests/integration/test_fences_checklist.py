"""Every fence through the one checklist (fence_checklist.py), each on its real server:
PostgreSQL with the guard (tests/pg.py), Redis (Debian's redis-server), etcd (the module's
own), S3 (MinIO built from its Go module), FencedArtifact (the real webhook and API server)."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aetcd
import psycopg
import pytest
import redis

from fencedlease.client import KubeConfig
from fencedlease.client.fences.s3 import S3Fence, s3_client
from fencedlease.local.cluster import EtcdServer, LocalCluster

from ..fence_servers import MinioServer, RedisServer
from ..pg import PostgresServer
from .fence_adapters import (
    ArtifactAdapter,
    EtcdAdapter,
    PostgresGuarded,
    RedisAdapter,
    S3Adapter,
)
from .fence_checklist import CHECKLIST, FenceUnderTest
from .fence_harness import FenceHarness

pytestmark = pytest.mark.timeout(180)


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


def pg_adapter(postgres: PostgresServer) -> PostgresGuarded:
    writer = f"writer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {writer} LOGIN")
    return PostgresGuarded.setup(postgres.fresh_database("fences"), writer)


def s3_fence(minio: MinioServer) -> S3Fence:
    client = s3_client(minio.endpoint, minio.access_key, minio.secret_key)
    bucket = f"fences-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    return S3Fence(client, bucket)


FENCES = ["postgres-guard", "redis", "etcd", "s3", "fenced-artifact"]


@pytest.fixture(params=FENCES)
async def under_test(request: pytest.FixtureRequest) -> AsyncIterator[FenceUnderTest]:
    kind = request.param
    if kind == "postgres-guard":
        yield pg_adapter(request.getfixturevalue("postgres"))
    elif kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        client = redis.Redis.from_url(server.url)
        client.flushall()
        yield RedisAdapter(client)
        client.close()
    elif kind == "etcd":
        etcd: EtcdServer = request.getfixturevalue("etcd")
        host, port = etcd.endpoint.removeprefix("http://").split(":")
        async with aetcd.Client(host=host, port=int(port)) as etcd_client:
            yield EtcdAdapter(etcd_client, f"/user-{uuid.uuid4().hex[:8]}")
    elif kind == "s3":
        yield S3Adapter(s3_fence(request.getfixturevalue("minio")))
    else:
        cluster: LocalCluster = request.getfixturevalue("cluster")
        harness: FenceHarness = request.getfixturevalue("fence")
        ns = await harness.namespace()
        config = KubeConfig.load(str(Path(cluster.kubeconfig)))
        yield ArtifactAdapter(harness, config, ns)


@pytest.mark.parametrize("scenario", list(CHECKLIST))
async def test_checklist(under_test: FenceUnderTest, scenario: str) -> None:
    resource = f"r{uuid.uuid4().hex[:8]}"
    await CHECKLIST[scenario](under_test, resource)
