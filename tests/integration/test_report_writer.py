"""The article's checklist on examples/report-writer, for every catalog: the SQL catalog (on a
real PostgreSQL server and on SQLite), fenced S3 pointers on MinIO (objects and pointers in one
bucket), and FencedArtifacts through the real webhook (writers with Pod-bound identities, so
the holder check applies; tokens from the store, as in test_webhook.py).

1. the paused writer; 2. the token-41 request delivered after 42; 3. duplicated current-token
requests; 4. reordered same-token requests with expected-version rules; 5. a crash between
staging and publication, then recovery cleans staging without exposing it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencedlease.client import (
    Applied,
    Duplicate,
    Grant,
    KubeClient,
    KubeConfig,
    Rejected,
    StaleFence,
)
from fencedlease.client.fences.s3 import s3_client
from fencedlease.client.plans import Reply

from ..fence_servers import MinioServer
from ..pg import PostgresServer
from .fence_harness import FenceHarness
from .test_webhook import _pod_identity
from .workers import pod_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "report-writer"))
from report_writer import (  # type: ignore[import-not-found, unused-ignore]
    ArtifactCatalog,
    Catalog,
    CatalogEntry,
    ObjectStore,
    ReportWriter,
    S3Catalog,
    S3Store,
    SqlCatalog,
    Store,
    collect_garbage,
)

pytestmark = pytest.mark.timeout(120)


@dataclass
class World:
    """Writers ``a``, ``b``, ``c`` (each with its own catalog connection/identity), grants in
    order (each newer than the last), one object store."""

    kind: str
    store: Store
    new_catalog: Callable[[str], Catalog]
    next_grant: Callable[[str], Any]  # async (who) -> Grant
    admin: Catalog
    catalogs: dict[str, Catalog] = field(default_factory=dict)

    def catalog(self, who: str) -> Catalog:
        if who not in self.catalogs:
            self.catalogs[who] = self.new_catalog(who)
        return self.catalogs[who]

    def writer(self, who: str) -> ReportWriter:
        return ReportWriter("july", self.store, self.catalog(who))

    async def grant(self, who: str) -> Grant:
        g: Grant = await self.next_grant(who)
        return g


def held(token: int, lease_id: str) -> Grant:
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    return Grant(token, lease_id, until, "held", "report-july")


@pytest.fixture(params=["postgres", "sqlite", "artifact", "s3"])
async def world(
    request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer, fence: FenceHarness
) -> AsyncIterator[World]:
    store: Store = ObjectStore(tmp_path / "objects")
    closers: list[Callable[[], Any]] = []
    if request.param == "s3":  # objects and fenced pointers in one bucket (docs/fences.md)
        server: MinioServer = request.getfixturevalue("minio")
        s3 = s3_client(server.endpoint, server.access_key, server.secret_key)
        bucket = f"rw-{random.getrandbits(40):x}"
        s3.create_bucket(Bucket=bucket)
        s3_tokens = iter(range(41, 1000))

        async def next_grant_s3(who: str) -> Grant:
            return held(next(s3_tokens), f"{who}{random.getrandbits(16):x}")

        yield World(
            "s3",
            S3Store(s3, bucket),
            lambda who: S3Catalog(s3, bucket),
            next_grant_s3,
            S3Catalog(s3, bucket),
        )
    elif request.param in ("postgres", "sqlite"):
        if request.param == "postgres":
            conninfo = postgres.fresh_database("rw")

            def connect() -> Any:
                conn = psycopg.connect(conninfo)
                closers.append(conn.close)
                return conn
        else:

            def connect() -> Any:
                conn = sqlite3.connect(tmp_path / "catalog.db", timeout=30, check_same_thread=False)
                closers.append(conn.close)
                return conn

        tokens = iter(range(41, 1000))

        async def next_grant(who: str) -> Grant:
            return held(next(tokens), f"{who}{random.getrandbits(16):x}")

        yield World(
            request.param,
            store,
            lambda who: SqlCatalog(connect()),
            next_grant,
            SqlCatalog(connect()),
        )
    else:
        harness = fence
        ns = await harness.namespace()
        await harness.lease(ns, "report-july")
        pods = {w: f"worker-{w}" for w in "abc"}
        identities = await _pod_identity(harness, ns, "publisher", list(pods.values()))

        def new_catalog(who: str) -> Catalog:
            kube = KubeClient(pod_config(harness.cluster, identities[pods[who]], ns))
            closers.append(kube.close)
            return ArtifactCatalog(kube, "report-july", ns)

        async def next_grant_artifact(who: str) -> Grant:
            acquired = await harness.grant(ns, "report-july", pods[who])
            return held(acquired.token, acquired.lease_id)

        admin_kube = KubeClient(KubeConfig.from_kubeconfig(harness.cluster.kubeconfig))
        closers.append(admin_kube.close)
        yield World(
            "artifact",
            store,
            new_catalog,
            next_grant_artifact,
            ArtifactCatalog(admin_kube, "report-july", ns),
        )
    for close in closers:
        close()


async def settled(world: World) -> CatalogEntry:
    """The catalog entry once its version stops moving: the operator may follow a publish
    with writes of its own to the artifact (status, finalizers), which change its version."""
    last: CatalogEntry | None = await call(world.admin.entry, "july")
    for _ in range(20):
        await asyncio.sleep(0.25 if world.kind == "artifact" else 0)
        entry = await call(world.admin.entry, "july")
        if entry == last:
            break
        last = entry
    assert last is not None
    return last


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run blocking client code in a thread (the webhook shares this event loop)."""
    return asyncio.to_thread(fn, *args, **kwargs)


async def test_paused_writer(world: World) -> None:
    a_writer, b_writer = world.writer("a"), world.writer("b")
    a = await world.grant("a")
    a_key = await call(a_writer.stage, a, b"A's report")
    resume = threading.Event()
    a_result: list[Any] = []

    def a_resumes() -> None:
        resume.wait(30)  # the GC pause: A still believes it holds the lease
        a_result.append(a_writer.publish(a, a_key))

    thread = threading.Thread(target=a_resumes)
    thread.start()
    b = await world.grant("b")  # A's lease expired; B is the new generation
    assert b.token > a.token
    b_key = await call(b_writer.stage, b, b"B's report")
    assert isinstance(await call(b_writer.publish, b, b_key), Applied)
    resume.set()
    await call(thread.join, 30)
    assert isinstance(a_result[0], StaleFence), a_result
    entry = await call(world.admin.entry, "july")
    assert entry is not None and entry.visible == b_key
    assert not world.store.exists(a_key)  # A removed only its own staged object
    assert world.store.read(b_key) == b"B's report"


async def test_token_41_request_delivered_after_42(world: World) -> None:
    a_writer, b_writer = world.writer("a"), world.writer("b")
    a = await world.grant("a")
    a_key = await call(a_writer.stage, a, b"A")
    b = await world.grant("b")
    if world.kind == "artifact":
        # A's request is prepared (read, resourceVersion taken) and held on the wire while B
        # publishes; then it is delivered.
        catalog = world.catalog("a")
        assert isinstance(catalog, ArtifactCatalog)
        kube: KubeClient = catalog.client
        gate, prepared = threading.Event(), threading.Event()
        original = kube.request

        def delayed(method: str, path: str, **kw: Any) -> Reply:
            if method in ("PUT", "POST") and not gate.is_set():
                prepared.set()
                gate.wait(30)
            return original(method, path, **kw)

        kube.request = delayed  # type: ignore[method-assign]
        pending = asyncio.ensure_future(call(a_writer.publish, a, a_key))
        assert await call(prepared.wait, 30)
        assert isinstance(
            await call(b_writer.publish, b, await call(b_writer.stage, b, b"B")), Applied
        )
        gate.set()
        late = await pending
    else:
        # SQL: A read the catalog (its expected version) before B committed, and its
        # transaction runs after.
        before = await call(world.catalog("a").entry, "july")
        assert isinstance(
            await call(b_writer.publish, b, await call(b_writer.stage, b, b"B")), Applied
        )
        late = await call(
            a_writer.publish, a, a_key, expected_version=before.version if before else None
        )
    assert isinstance(late, StaleFence), late
    entry = await call(world.admin.entry, "july")
    assert entry is not None and entry.fence == b.token and entry.visible != a_key


async def test_duplicated_current_token_requests(world: World) -> None:
    writer = world.writer("b")
    b = await world.grant("b")
    key = await call(writer.stage, b, b"B")
    first = await call(writer.publish, b, key, operation_id="b-publish-1")
    assert isinstance(first, Applied), first
    after_first = await settled(world)
    for _ in range(3):  # a retried request, delivered again and again
        again = await call(writer.publish, b, key, operation_id="b-publish-1")
        assert isinstance(again, Duplicate), again
    entry = await settled(world)
    assert entry == after_first  # applied once: same version
    assert world.store.exists(key)


async def test_reordered_same_token_requests_with_expected_version(world: World) -> None:
    writer = world.writer("b")
    b = await world.grant("b")
    base = await call(writer.publish, b, await call(writer.stage, b, b"v0"), operation_id="op-0")
    assert isinstance(base, Applied)
    read_at = (await settled(world)).version
    k1 = await call(writer.stage, b, b"v1")
    k2 = await call(writer.stage, b, b"v2")
    # Both prepared against read_at; op-2 is delivered first, op-1 after it.
    op2 = await call(writer.publish, b, k2, operation_id="op-2", expected_version=read_at)
    assert isinstance(op2, Applied), op2
    op1 = await call(writer.publish, b, k1, operation_id="op-1", expected_version=read_at)
    assert isinstance(op1, Rejected) and op1.code in ("conflict", "version_conflict"), op1
    entry = await call(world.admin.entry, "july")
    assert entry is not None and entry.visible == k2  # the pointer never moved back


async def test_crash_between_staging_and_publication_then_recovery(world: World) -> None:
    w1, w2, w3 = world.writer("a"), world.writer("b"), world.writer("c")
    g1 = await world.grant("a")
    k1 = await call(w1.stage, g1, b"first")
    assert isinstance(await call(w1.publish, g1, k1), Applied)
    g2 = await world.grant("b")
    k2 = await call(w2.stage, g2, b"crashed")  # ... and the writer dies before publishing
    assert (await call(world.admin.entry, "july")).visible == k1

    # Before recovery the collector keeps k2: its writer (token g2) could still publish it.
    assert (
        await call(lambda: collect_garbage(world.store, world.admin.snapshot(), retention=0)) == []
    )
    g3 = await world.grant("c")
    recovered = await call(w3.recover, g3)
    assert isinstance(recovered, Applied), recovered
    entry = await call(world.admin.entry, "july")
    assert entry is not None and entry.visible == k1 and entry.fence == g3.token
    # A long retention keeps everything; past it, the crashed staging object goes, the
    # referenced one stays (even though its token is below the fence).
    snapshot = await call(world.admin.snapshot)
    assert collect_garbage(world.store, snapshot, retention=3600) == []
    assert collect_garbage(world.store, snapshot, retention=0) == [k2]
    assert world.store.exists(k1) and not world.store.exists(k2)
    # The crashed writer's publish can never expose it now.
    assert isinstance(await call(w2.publish, g2, k2), StaleFence)
    # W3 publishes its own report; the old visible object becomes collectable.
    k3 = await call(w3.stage, g3, b"third")
    assert isinstance(await call(w3.publish, g3, k3), Applied)
    snapshot = await call(world.admin.snapshot)
    assert collect_garbage(world.store, snapshot, retention=0) == [k1]
    assert world.store.exists(k3)
