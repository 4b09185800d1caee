"""Each fence against the same unfenced operation on the same server, in one run (docs/fences.md).

Starts its own servers (PostgreSQL from tests/pg.py, Redis and MinIO from
tests/fence_servers.py, etcd from the cached binary) and times, interleaved round by round in a
shuffled order (machine load hits every row alike), pairs of rows:

- PostgreSQL: a plain ``UPDATE`` of a catalog row (committed) / ``SqlFence.publish`` (the
  helper's conditional update and operation log) / the same plain ``UPDATE`` on a table with
  the guard (``SET LOCAL fencedlease.token``; the trigger locks and advances the mark) /
  ``SqlFence`` on a guarded catalog;
- Redis: ``SET`` / the fenced ``SET`` (one ``EVALSHA``);
- etcd: ``put`` / the fenced put (a read of the mark, one transaction);
- S3 (MinIO): ``PUT`` of the pointer object / the fenced publish (``HEAD`` of the staged
  object, ``GET`` of the pointer, conditional ``PUT``) / the same without the ``HEAD``.

Every fenced write uses a new, higher token, so each one is ``Applied`` (checked). Prints the
table (p50, p99, the fenced row's p50 over its unfenced row's) and writes it to
``--out``/fences.md.  Run by ``make bench``; alone: ``.venv/bin/python bench/fences.py -n 300``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aetcd  # noqa: E402
import psycopg  # noqa: E402
import redis  # noqa: E402
from benchlib import Percentiles, interleaved  # noqa: E402  (bench/benchlib.py)
from tests.fence_servers import MinioServer, RedisServer  # noqa: E402
from tests.pg import PostgresServer  # noqa: E402

from fencedlease.client import Applied, SqlFence  # noqa: E402
from fencedlease.client.fences.etcd import EtcdFence  # noqa: E402
from fencedlease.client.fences.postgres import GuardSpec, install, publish_guarded  # noqa: E402
from fencedlease.client.fences.redis import RedisFence  # noqa: E402
from fencedlease.client.fences.s3 import S3Fence, s3_client  # noqa: E402
from fencedlease.local.cluster import EtcdServer  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
Op = Callable[[int], Awaitable[object]]


@dataclass
class Row(Percentiles):
    store: str
    name: str
    op: Op
    baseline: str | None = None  # the unfenced row this one is compared with
    samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # this process's CPU time per op (unused)


def applied(result: object) -> object:
    if not isinstance(result, Applied):
        raise RuntimeError(f"a benchmark write was not applied: {result!r}")
    return result


async def postgres_rows(pg: PostgresServer) -> list[Row]:
    conninfo = pg.fresh_database("bench")
    conn = psycopg.connect(conninfo)
    plain, guarded = SqlFence("plain_catalog"), SqlFence("guarded_catalog")
    for fence in (plain, guarded):
        fence.create_tables(conn)
        conn.execute(
            f"INSERT INTO {fence.table} (resource_id, accepted_fence, version) VALUES ('r', 0, 0)"
        )
    conn.commit()
    for table in ("guarded_catalog", "guarded_catalog_operations"):
        install(conn, GuardSpec(table, domain_column="resource_id"))

    async def update(i: int) -> object:
        conn.execute(
            "UPDATE plain_catalog SET visible_object = %s, version = version + 1 "
            "WHERE resource_id = 'r'",
            (f"obj-{i}",),
        )
        conn.commit()
        return None

    async def sql_fence(i: int) -> object:
        result = plain.publish(conn, "r", i + 1, f"obj-{i}", operation_id=f"op-{i}")
        conn.commit()
        return applied(result)

    async def guard_update(i: int) -> object:
        conn.execute("SELECT set_config('fencedlease.token', %s, true)", (str(i + 1),))
        conn.execute(
            "UPDATE guarded_catalog SET visible_object = %s, version = version + 1 "
            "WHERE resource_id = 'g'",
            (f"obj-{i}",),
        )
        conn.commit()
        return None

    async def guard_and_fence(i: int) -> object:
        result = publish_guarded(conn, guarded, "r", i + 1, f"obj-{i}", operation_id=f"op-{i}")
        conn.commit()
        return applied(result)

    conn.execute("SELECT set_config('fencedlease.token', '1', true)")
    conn.execute(
        "INSERT INTO guarded_catalog (resource_id, accepted_fence, version) VALUES ('g', 0, 0)"
    )
    conn.commit()
    base = "UPDATE (plain)"
    return [
        Row("PostgreSQL", base, update),
        Row("PostgreSQL", "SqlFence.publish (helper)", sql_fence, base),
        Row("PostgreSQL", "UPDATE on a guarded table", guard_update, base),
        Row("PostgreSQL", "SqlFence on a guarded catalog", guard_and_fence, base),
    ]


async def redis_rows(server: RedisServer) -> list[Row]:
    client = redis.Redis.from_url(server.url)
    fence = RedisFence(client, mark_key="{b}:fence")

    async def plain(i: int) -> object:
        return client.set("{b}:plain", f"v{i}")

    async def fenced(i: int) -> object:
        return applied(fence.set("{b}:fenced", f"v{i}", i + 1, operation_id=f"op-{i}"))

    return [Row("Redis", "SET", plain), Row("Redis", "fenced SET (EVALSHA)", fenced, "SET")]


async def etcd_rows(client: Any) -> list[Row]:
    fence = EtcdFence(client, mark_key="/bench/mark")

    async def plain(i: int) -> object:
        return await client.put(b"/bench/plain", f"v{i}".encode())

    async def fenced(i: int) -> object:
        return applied(await fence.put("/bench/fenced", f"v{i}", i + 1, operation_id=f"op-{i}"))

    return [Row("etcd", "put", plain), Row("etcd", "fenced put (get + txn)", fenced, "put")]


async def s3_rows(minio: MinioServer) -> list[Row]:
    client = s3_client(minio.endpoint, minio.access_key, minio.secret_key)
    client.create_bucket(Bucket="bench")
    fence = S3Fence(client, "bench")
    lean = S3Fence(client, "bench", check_object=False)
    staged = fence.stage("pointers/a", 1, b"x" * 1024)
    staged_b = fence.stage("pointers/b", 1, b"x" * 1024)  # a staged object has one pointer

    async def plain(i: int) -> object:
        return client.put_object(Bucket="bench", Key="pointers/plain", Body=b'{"v": %d}' % i)

    async def fenced(i: int) -> object:
        return applied(fence.publish("pointers/a", staged, i + 1, operation_id=f"op-{i}"))

    async def fenced_lean(i: int) -> object:
        return applied(lean.publish("pointers/b", staged_b, i + 1, operation_id=f"op-{i}"))

    base = "PUT pointer"
    return [
        Row("S3 (MinIO)", base, plain),
        Row("S3 (MinIO)", "fenced publish (HEAD + GET + PUT If-Match)", fenced, base),
        Row("S3 (MinIO)", "fenced publish, no HEAD (GET + PUT If-Match)", fenced_lean, base),
    ]


def markdown(rows: list[Row], meta: str) -> str:
    by_name = {(r.store, r.name): r for r in rows}
    lines = [
        f"Fences against the same unfenced write ({meta})",
        "",
        "| store | operation | p50 ms | p99 ms | p50 vs unfenced |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        ratio = "1.00x (baseline)"
        if row.baseline is not None:
            base = by_name[(row.store, row.baseline)]
            ratio = f"{statistics.median(row.samples) / statistics.median(base.samples):.2f}x"
        lines.append(
            f"| {row.store} | {row.name} | {statistics.median(row.samples) * 1000:.3f} | "
            f"{row.p(0.99) * 1000:.3f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300, help="measured rounds (each runs every row)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--s3", action=argparse.BooleanOptionalAction, default=True, help="the MinIO rows"
    )
    args = parser.parse_args()
    pg = PostgresServer(port=random.randint(40000, 60000)).start()
    red = RedisServer().start()
    minio = MinioServer().start() if args.s3 else None
    tmp = Path(tempfile.mkdtemp(prefix="fencedlease-bench-fences-"))
    etcd = EtcdServer(tmp / "etcd", tmp / "etcd.log")
    etcd.start()
    try:
        host, port = etcd.endpoint.removeprefix("http://").split(":")
        async with aetcd.Client(host=host, port=int(port)) as client:
            rows = [
                *await postgres_rows(pg),
                *await redis_rows(red),
                *await etcd_rows(client),
                *(await s3_rows(minio) if minio is not None else []),
            ]
            await interleaved(rows, args.n, args.warmup, args.seed)
    finally:
        etcd.stop()
        if minio is not None:
            minio.stop()
        red.stop()
        pg.stop()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    meta = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, n={args.n}, load {load}"
    text = markdown(rows, meta)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fences.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
