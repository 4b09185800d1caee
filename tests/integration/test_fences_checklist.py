"""Every fence through the one checklist (fence_checklist.py), each on its real server:
PostgreSQL with the guard (tests/pg.py), SqlFence on SQLite, Redis (Debian's redis-server),
etcd (the module's own), S3 (MinIO built from its Go module), FencedArtifact (the real webhook
and API server)."""

from __future__ import annotations

import uuid
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
    SqliteCatalog,
)
from .fence_checklist import CHECKLIST, FenceUnderTest
from .fence_harness import FenceHarness

pytestmark = pytest.mark.timeout(180)


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


SCENARIOS = pytest.mark.parametrize("scenario", list(CHECKLIST))


async def run(fence: FenceUnderTest, scenario: str) -> None:
    await CHECKLIST[scenario](fence, f"r{uuid.uuid4().hex[:8]}")


@SCENARIOS
async def test_postgres_guard(postgres: PostgresServer, scenario: str) -> None:
    await run(pg_adapter(postgres), scenario)


@SCENARIOS
async def test_sql_fence_on_sqlite(tmp_path: Path, scenario: str) -> None:
    await run(SqliteCatalog.setup(str(tmp_path / "catalog.db")), scenario)


@SCENARIOS
async def test_redis(redis_server: RedisServer, scenario: str) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
        await run(RedisAdapter(client), scenario)
    finally:
        client.close()


@SCENARIOS
async def test_etcd(etcd: EtcdServer, scenario: str) -> None:
    host, port = etcd.endpoint.removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        await run(EtcdAdapter(client, f"/user-{uuid.uuid4().hex[:8]}"), scenario)


@SCENARIOS
async def test_s3(minio: MinioServer, scenario: str) -> None:
    await run(S3Adapter(s3_fence(minio)), scenario)


@SCENARIOS
async def test_fenced_artifact(cluster: LocalCluster, fence: FenceHarness, scenario: str) -> None:
    ns = await fence.namespace()
    config = KubeConfig.load(str(Path(cluster.kubeconfig)))
    await run(ArtifactAdapter(fence, config, ns), scenario)
