"""Each fence adapted to :class:`~.fence_checklist.FenceUnderTest`, on its real server.

Staged output lives where each store keeps data: blobs in a table (PostgreSQL), staging keys
(Redis, etcd), staging objects (S3), refs of an external store (FencedArtifact).  ``recover``
deletes staged output that nothing published references.  Blocking clients run in a thread
(``asyncio.to_thread``) so that concurrent writers really overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sqlite3
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
import redis

from fencedlease.client import AsyncKubeClient, AsyncPublisher, KubeConfig, RetryPolicy, SqlFence
from fencedlease.client.fences import FenceResult
from fencedlease.client.fences.etcd import EtcdFence
from fencedlease.client.fences.postgres import GuardSpec, install, publish_guarded
from fencedlease.client.fences.redis import RedisFence
from fencedlease.client.fences.s3 import S3Fence
from fencedlease.client.results import Rejected

from .fence_checklist import FenceUnderTest
from .fence_harness import FenceHarness


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Tokens(FenceUnderTest):
    """Successive grants' tokens for the fences that do not check them against an issuer."""

    remembers_operations = True
    _issued: dict[str, int]

    async def tokens(self, resource: str, n: int) -> list[int]:
        """41, 42, ... for each resource, continuing across calls as successive grants do."""
        issued = self.__dict__.setdefault("_issued", {})
        first = issued.get(resource, 40) + 1
        issued[resource] = first + n - 1
        return list(range(first, first + n))


class _Blocking(_Tokens):
    """A fence whose client blocks: :meth:`_publish` runs in a thread."""

    def _publish(self, resource: str, token: Any, ref: str, **kw: Any) -> FenceResult:
        raise NotImplementedError

    async def _send(self, resource: str, token: Any, ref: str, **options: Any) -> FenceResult:
        return await asyncio.to_thread(self._publish, resource, token, ref, **options)


# ----------------------------------------------------------------------------- SQL


class _SqlCatalog(_Blocking):
    """SqlFence's catalog ``report_catalog`` and a blob table ``report_blobs`` beside it.
    Statements are written with ``%s`` placeholders; :meth:`_query` runs one (autocommit)."""

    catalog = SqlFence("report_catalog")  # stateless: the table's name

    @classmethod
    def _create_tables(cls, conn: Any) -> None:
        cls.catalog.create_tables(conn)
        conn.execute("CREATE TABLE report_blobs (key TEXT PRIMARY KEY, data TEXT NOT NULL)")

    def _query(self, sql: str, params: Any = ()) -> list[Any]:
        raise NotImplementedError

    async def stage(self, resource: str, token: Any, data: str) -> str:
        key = f"blobs/{resource}/{uuid.uuid4().hex[:12]}"
        await asyncio.to_thread(
            self._query, "INSERT INTO report_blobs VALUES (%s, %s)", (key, data)
        )
        return key

    async def _column(self, column: str, resource: str) -> Any:
        rows = await asyncio.to_thread(
            self._query, f"SELECT {column} FROM report_catalog WHERE resource_id = %s", (resource,)
        )
        return rows[0][0] if rows else None

    async def visible(self, resource: str) -> str | None:
        found: str | None = await self._column("visible_object", resource)
        return found

    async def version(self, resource: str) -> Any:
        return await self._column("version", resource) or 0

    async def staged(self) -> set[str]:
        return {r[0] for r in await asyncio.to_thread(self._query, "SELECT key FROM report_blobs")}

    async def recover(self) -> None:
        await asyncio.to_thread(
            self._query,
            "DELETE FROM report_blobs WHERE key NOT IN (SELECT visible_object FROM "
            "report_catalog WHERE visible_object IS NOT NULL)",
        )


@dataclass
class PostgresGuarded(_SqlCatalog):
    """SqlFence's catalog, protected by the guard (trigger + grants), as role ``writer``."""

    conninfo: str
    name: str = "postgres-guard"

    @classmethod
    def setup(cls, admin_conninfo: str, writer: str) -> PostgresGuarded:
        with psycopg.connect(admin_conninfo) as conn:
            cls._create_tables(conn)
            conn.execute(f"GRANT SELECT, INSERT, DELETE ON report_blobs TO {writer}")
            conn.commit()
            for table in ("report_catalog", "report_catalog_operations"):
                spec = GuardSpec(table, domain_column="resource_id", writers=(writer,))
                install(conn, spec)
        return cls(admin_conninfo.replace("user=fencedlease", f"user={writer}"))

    def _publish(self, resource: str, token: Any, ref: str, **kw: Any) -> FenceResult:
        with psycopg.connect(self.conninfo) as conn:
            result = publish_guarded(conn, self.catalog, resource, token, ref, **kw)
            conn.commit()
            return result

    def _query(self, sql: str, params: Any = ()) -> list[Any]:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description else []


@dataclass
class SqliteCatalog(_SqlCatalog):
    """SqlFence's catalog on SQLite (the helper's conditional update, no guard)."""

    path: str
    name: str = "sqlite-sql-fence"

    @classmethod
    def setup(cls, path: str) -> SqliteCatalog:
        conn = sqlite3.connect(path)
        cls._create_tables(conn)
        conn.commit()
        conn.close()
        return cls(path)

    def _publish(self, resource: str, token: Any, ref: str, **kw: Any) -> FenceResult:
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
            result: FenceResult = self.catalog.publish(conn, resource, token, ref, **kw)
            conn.commit()
            return result

    def _query(self, sql: str, params: Any = ()) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as conn:
            rows = list(conn.execute(sql.replace("%s", "?"), params).fetchall())
            conn.commit()
            return rows


# ----------------------------------------------------------------------------- Redis


@dataclass
class RedisAdapter(_Blocking):
    client: redis.Redis
    name: str = "redis"

    def fence(self, resource: str) -> RedisFence:
        return RedisFence(self.client, mark_key=f"{resource}:fence")

    def _publish(self, resource: str, token: Any, ref: str, **kw: Any) -> FenceResult:
        return self.fence(resource).set(resource, ref, token, **kw)

    async def stage(self, resource: str, token: Any, data: str) -> str:
        key = f"staging:{resource}:{uuid.uuid4().hex[:12]}"
        assert await asyncio.to_thread(self.client.set, key, data, nx=True)
        return key

    async def visible(self, resource: str) -> str | None:
        value = await asyncio.to_thread(self.client.get, resource)
        return None if value is None else _text(value)

    async def version(self, resource: str) -> Any:
        value = await asyncio.to_thread(self.client.hget, f"{resource}:fence", "version")
        return 0 if value is None else int(value)

    async def staged(self) -> set[str]:
        keys = await asyncio.to_thread(self.client.keys, "staging:*")
        return {_text(k) for k in keys}

    async def recover(self) -> None:
        marks = await asyncio.to_thread(self.client.keys, "*:fence")
        roots = {await self.visible(_text(m)[: -len(":fence")]) for m in marks}
        for key in await self.staged() - roots:
            await asyncio.to_thread(self.client.delete, key)


# ----------------------------------------------------------------------------- etcd


@dataclass
class EtcdAdapter(_Tokens):
    client: Any  # aetcd.Client
    prefix: str
    name: str = "etcd"

    def fence(self, resource: str) -> EtcdFence:
        return EtcdFence(self.client, mark_key=f"{self.prefix}/marks/{resource}")

    def key(self, resource: str) -> str:
        return f"{self.prefix}/data/{resource}"

    async def _send(self, resource: str, token: Any, ref: str, **options: Any) -> FenceResult:
        return await self.fence(resource).put(self.key(resource), ref, token, **options)

    async def stage(self, resource: str, token: Any, data: str) -> str:
        key = f"{self.prefix}/staging/{resource}/{uuid.uuid4().hex[:12]}"
        tx = self.client.transactions
        ok, _ = await self.client.transaction(
            compare=[tx.version(key.encode()) == 0],
            success=[tx.put(key.encode(), data.encode())],
            failure=[],
        )
        assert ok
        return key

    async def visible(self, resource: str) -> str | None:
        got = await self.client.get(self.key(resource).encode())
        return None if got is None else bytes(got.value).decode()

    async def version(self, resource: str) -> Any:
        mark = await self.fence(resource).mark()
        return 0 if mark is None else mark.version

    async def _keys(self, sub: str) -> list[tuple[str, bytes]]:
        got = await self.client.get_prefix(f"{self.prefix}/{sub}/".encode())
        return [(bytes(kv.key).decode(), bytes(kv.value)) for kv in got]

    async def staged(self) -> set[str]:
        return {k for k, _ in await self._keys("staging")}

    async def recover(self) -> None:
        roots = {v.decode() for _, v in await self._keys("data")}
        for key in await self.staged() - roots:
            await self.client.delete(key.encode())


# ----------------------------------------------------------------------------- S3


@dataclass
class S3Adapter(_Blocking):
    fence: S3Fence
    name: str = "s3"

    def _publish(self, resource: str, token: Any, ref: str, **kw: Any) -> FenceResult:
        return self.fence.publish(f"pointers/{resource}", ref, token, **kw)

    async def stage(self, resource: str, token: Any, data: str) -> str:
        return await asyncio.to_thread(
            self.fence.stage, f"pointers/{resource}", token, data.encode()
        )

    async def visible(self, resource: str) -> str | None:
        mark = await asyncio.to_thread(self.fence.read, f"pointers/{resource}")
        return None if mark is None else mark.visible

    async def version(self, resource: str) -> Any:
        mark = await asyncio.to_thread(self.fence.read, f"pointers/{resource}")
        return 0 if mark is None else mark.version

    async def staged(self) -> set[str]:
        return {k for k, _ in await asyncio.to_thread(lambda: list(self.fence._list("staging/")))}

    async def recover(self) -> None:
        await asyncio.to_thread(self.fence.collect_garbage)


# ----------------------------------------------------------------------------- FencedArtifact


@dataclass
class ArtifactAdapter(FenceUnderTest):
    """FencedArtifacts through the real webhook (tokens are real grants of the store)."""

    harness: FenceHarness
    config: KubeConfig
    namespace: str
    name: str = "fenced-artifact"
    remembers_operations: bool = False  # the artifact shows its last operationId only
    leases: set[str] = field(default_factory=set)
    staging: set[str] = field(default_factory=set)
    holders: itertools.count[int] = field(default_factory=itertools.count)

    async def tokens(self, resource: str, n: int) -> list[int]:
        if resource not in self.leases:
            await self.harness.lease(self.namespace, resource)
            self.leases.add(resource)
        out = []
        for _ in range(n):
            grant = await self.harness.grant(self.namespace, resource, f"h{next(self.holders)}")
            out.append(grant.token)
        return out

    async def _send(self, resource: str, token: Any, ref: str, **options: Any) -> FenceResult:
        expected_version = options["expected_version"]
        retry = RetryPolicy(attempts=6, base_delay=0.05, max_delay=0.3)
        async with AsyncKubeClient(self.config) as kube:
            result = await AsyncPublisher(kube, retry=retry).publish(
                resource,
                lease=resource,
                token=token,
                object_ref=ref,
                operation_id=options["operation_id"],
                namespace=self.namespace,
                expected_version=None if expected_version is None else str(expected_version),
            )
        if not isinstance(result, Rejected):
            await self._settle(resource)
        return result

    async def _settle(self, resource: str) -> None:
        """Wait until the recorder accepted what the artifact shows now (its status write
        moves the resourceVersion the next scenario step compares)."""

        async def done() -> bool:
            obj = await self.harness.get(self.namespace, resource) or {}
            token = (obj.get("spec") or {}).get("fencingToken")
            return token is None or (obj.get("status") or {}).get("acceptedFence") == token

        await self.harness._settle(done, f"acceptedFence of {self.namespace}/{resource}")

    async def stage(self, resource: str, token: Any, data: str) -> str:
        ref = f"objects/{resource}/{uuid.uuid4().hex[:12]}"
        self.staging.add(ref)
        return ref

    async def visible(self, resource: str) -> str | None:
        obj = await self.harness.get(self.namespace, resource)
        return None if obj is None else str(obj["spec"]["objectRef"])

    async def version(self, resource: str) -> Any:
        obj = await self.harness.get(self.namespace, resource)
        return None if obj is None else obj["metadata"]["resourceVersion"]

    async def staged(self) -> set[str]:
        return set(self.staging)

    async def recover(self) -> None:
        roots = {await self.visible(r) for r in self.leases}
        self.staging = {s for s in self.staging if s in roots}


HOSTILE_MARKS = [
    b'{"fence":"0041","format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":-42,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":41.9,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":4e10,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":11111111111111111111111,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":true,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":NaN,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":99,"fence":1,"format":"%s","operations":[],"version":1,"visible":null}',
    b'{"fence":1,"format":"%s","operations":["a b"],"version":1,"visible":null}',
    b'{"fence":1,"format":"%s","operations":[],"version":1,"visible":""}',
]
"""Marks written by hand in the stores that run no code of ours (etcd, S3): each must be
refused when read back, never compared or overwritten."""
