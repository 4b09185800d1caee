"""The article's report writer, runnable: prepare, then a fenced commit, then garbage collection.

1. **Render** the report and write it to an *immutable, unique* key
   ``reports/<report>/<token>-<lease id>-<nonce>.json`` (never overwriting anything: harmless
   and invisible until published).
2. **Publish** the key through the fence: a ``FencedArtifact`` (the operator's webhook checks the
   token), the SQL catalog (``UPDATE ... WHERE accepted_fence <= :fence``) or, with
   ``--catalog s3``, objects and a fenced pointer in one S3 bucket (conditional ``PUT``s).
3. On ``stale_fence``: stop, delete only *our own* staged object, never retry under this grant.
4. **Garbage collection** deletes an object only if no catalog references it, it is older than
   the retention period, *and* its token is below the catalog's accepted fence for its report
   (so no publish of it can ever succeed again: a paused writer cannot resurrect a deleted
   key).  A referenced object is never deleted.
5. **Recovery** after a crash between staging and publication: the next holder advances the
   catalog's fence to its own token without changing what is visible; the crashed writer's
   staged object is then unreferenced and below the fence, and the collector removes it.  It is
   never exposed.

Command line (see README.md)::

    python report_writer.py run --report july --catalog sql --db catalog.db --store objects \\
        --token 42 --lease-id b9               # or --dir /etc/fencedlease, or --pod NAME
    python report_writer.py gc --catalog sql --db catalog.db --store objects --retention 600
    python report_writer.py work --catalog artifact   # in a Pod: publish once per grant held

``work`` is what the example Pods run (image ``ghcr.io/fencedlease/fencedlease``, where this
file is ``/app/report_writer.py``): it serves ``/healthz`` on ``--health-port`` for the
readiness probe (a frozen process fails it, so the lease moves on), reads the grant from the
downward-API files every ``--interval`` seconds and, while it is held, runs once per token.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from fencedlease.client import (
    Applied,
    DirectoryGrant,
    Duplicate,
    Grant,
    KubeClient,
    KubeConfig,
    PodGrant,
    Publisher,
    PublishResult,
    Rejected,
    SqlFence,
    StaleFence,
)
from fencedlease.client.api import artifact_path

KEY = re.compile(
    r"^reports/(?P<report>[a-z0-9-]+)/(?P<token>\d+)-(?P<lease>[^/]*)-[0-9a-f]+\.json$"
)


# ----------------------------------------------------------------------------- object store


class Store(Protocol):
    """Where staged reports live: a directory (:class:`ObjectStore`) or a bucket
    (:class:`S3Store`)."""

    def put_new(self, key: str, data: bytes) -> str: ...
    def exists(self, key: str) -> bool: ...
    def read(self, key: str) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def list(self) -> Iterator[tuple[str, float]]: ...


class ObjectStore:
    """A directory as an object store whose writes never overwrite (``O_EXCL``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def put_new(self, key: str, data: bytes) -> str:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return key

    def exists(self, key: str) -> bool:
        return (self.root / key).exists()

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def list(self) -> Iterator[tuple[str, float]]:
        """``(key, modification time)`` of every object."""
        if not self.root.exists():
            return
        for path in sorted(self.root.rglob("*")):
            if path.is_file():
                yield path.relative_to(self.root).as_posix(), path.stat().st_mtime


# ----------------------------------------------------------------------------- catalogs


@dataclass(frozen=True)
class CatalogEntry:
    """What the catalog shows for one report: the visible key, the accepted fence, a version."""

    visible: str | None
    fence: int
    version: str | None


class Catalog(Protocol):
    def publish(
        self,
        report: str,
        key: str | None,
        token: int,
        *,
        operation_id: str | None = None,
        expected_version: str | None = None,
    ) -> PublishResult:
        """Make ``key`` visible for ``report`` under ``token`` (``None``: keep what is
        visible, only advance the fence)."""
        ...

    def entry(self, report: str) -> CatalogEntry | None: ...

    def snapshot(self) -> dict[str, CatalogEntry]:
        """Every report's entry (the collector's roots)."""
        ...


class SqlCatalog:
    """The article's report catalog in SQLite or PostgreSQL (:class:`SqlFence`).  Each publish
    is one transaction: the conditional update (plus, here, nothing else) and a commit."""

    def __init__(self, conn: Any, table: str = "report_catalog") -> None:
        self.conn = conn
        self.fence = SqlFence(table)
        self.fence.create_tables(conn)
        conn.commit()

    def publish(
        self,
        report: str,
        key: str | None,
        token: int,
        *,
        operation_id: str | None = None,
        expected_version: str | None = None,
    ) -> PublishResult:
        try:
            result = self.fence.publish(
                self.conn,
                report,
                token,
                key,
                operation_id=operation_id,
                expected_version=int(expected_version) if expected_version else None,
            )
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise
        return result

    def entry(self, report: str) -> CatalogEntry | None:
        row = self.fence.read(self.conn, report)
        self.conn.rollback()  # end the read transaction
        if row is None:
            return None
        return CatalogEntry(row.visible_object, row.accepted_fence, str(row.version))

    def snapshot(self) -> dict[str, CatalogEntry]:
        cur = self.conn.cursor()
        cur.execute(
            f"SELECT resource_id, visible_object, accepted_fence, version FROM {self.fence.table}"
        )
        rows = cur.fetchall()
        cur.close()
        self.conn.rollback()
        return {str(r[0]): CatalogEntry(r[1], int(r[2]), str(r[3])) for r in rows}


class ArtifactCatalog:
    """The catalog as FencedArtifacts ``report-<report>`` of one FencedLease, fenced by the
    operator's admission webhook."""

    def __init__(self, client: KubeClient, lease: str, namespace: str | None = None) -> None:
        self.client = client
        self.lease = lease
        self.namespace = namespace or client.namespace
        self.publisher = Publisher(client)

    @staticmethod
    def name(report: str) -> str:
        return f"report-{report}"

    def publish(
        self,
        report: str,
        key: str | None,
        token: int,
        *,
        operation_id: str | None = None,
        expected_version: str | None = None,
    ) -> PublishResult:
        if key is None:  # advance the fence, keep what is visible
            current = self.entry(report)
            if current is None or current.visible is None:
                return Rejected("not_found", f"no artifact for report {report} to advance")
            key = current.visible
        return self.publisher.publish(
            self.name(report),
            lease=self.lease,
            token=token,
            object_ref=key,
            operation_id=operation_id,
            namespace=self.namespace,
            expected_version=expected_version,
        )

    @staticmethod
    def _entry(obj: Mapping[str, Any]) -> CatalogEntry:
        spec = obj.get("spec") or {}
        return CatalogEntry(
            spec.get("objectRef"),
            int(spec.get("fencingToken") or 0),
            (obj.get("metadata") or {}).get("resourceVersion"),
        )

    def entry(self, report: str) -> CatalogEntry | None:
        reply = self.client.request("GET", artifact_path(self.namespace, self.name(report)))
        if reply.status_code == 404:
            return None
        return self._entry(reply.raise_for_status().json())

    def snapshot(self) -> dict[str, CatalogEntry]:
        items = self.client.get(artifact_path(self.namespace)).get("items") or []
        out = {}
        for obj in items:
            spec = obj.get("spec") or {}
            name = (obj.get("metadata") or {}).get("name", "")
            if (spec.get("leaseRef") or {}).get("name") == self.lease and name.startswith(
                "report-"
            ):
                out[name.removeprefix("report-")] = self._entry(obj)
        return out


class S3Store:
    """An S3 bucket as the object store: ``put_new`` is a ``PUT`` with ``If-None-Match: *``
    (never overwrites), like :class:`ObjectStore`'s ``O_EXCL``."""

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.bucket = bucket

    def put_new(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        return key

    def exists(self, key: str) -> bool:
        import botocore.exceptions

        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError:
            return False
        return True

    def read(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def list(self) -> Iterator[tuple[str, float]]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix="reports/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                yield str(obj["Key"]), obj["LastModified"].timestamp()


class S3Catalog:
    """The catalog as fenced pointer objects ``pointers/<report>`` in the same bucket
    (:class:`~fencedlease.client.fences.s3.S3Fence`: conditional ``PUT``s, docs/fences.md)."""

    def __init__(self, client: Any, bucket: str) -> None:
        from fencedlease.client.fences.s3 import S3Fence

        self.fence = S3Fence(client, bucket)

    def publish(
        self,
        report: str,
        key: str | None,
        token: int,
        *,
        operation_id: str | None = None,
        expected_version: str | None = None,
    ) -> PublishResult:
        if key is None:  # advance the fence, keep what is visible
            current = self.entry(report)
            if current is None or current.visible is None:
                return Rejected("not_found", f"no pointer for report {report} to advance")
            key = current.visible
        return self.fence.publish(
            f"pointers/{report}",
            key,
            token,
            operation_id=operation_id,
            expected_version=int(expected_version) if expected_version else None,
        )

    def entry(self, report: str) -> CatalogEntry | None:
        mark = self.fence.read(f"pointers/{report}")
        return None if mark is None else CatalogEntry(mark.visible, mark.fence, str(mark.version))

    def snapshot(self) -> dict[str, CatalogEntry]:
        out = {}
        for key, _ in self.fence._list("pointers/"):
            entry = self.entry(key.removeprefix("pointers/"))
            if entry is not None:
                out[key.removeprefix("pointers/")] = entry
        return out


# ----------------------------------------------------------------------------- the writer


class ReportWriter:
    """Renders report ``report`` and publishes it through ``catalog`` under a grant."""

    def __init__(self, report: str, store: Store, catalog: Catalog) -> None:
        self.report = report
        self.store = store
        self.catalog = catalog

    def stage(self, grant: Grant, content: bytes) -> str:
        """Write ``content`` to a new immutable key (prepare: harmless, not visible)."""
        key = f"reports/{self.report}/{grant.token}-{grant.lease_id}-{uuid.uuid4().hex[:8]}.json"
        return self.store.put_new(key, content)

    def publish(
        self,
        grant: Grant,
        key: str,
        *,
        operation_id: str | None = None,
        expected_version: str | None = None,
    ) -> PublishResult:
        """The fenced commit.  On ``stale_fence`` our own staged object is deleted (it can
        never be published now); the visible object is never touched."""
        result = self.catalog.publish(
            self.report,
            key,
            grant.token,
            operation_id=operation_id,
            expected_version=expected_version,
        )
        if isinstance(result, StaleFence):
            self.store.delete(key)
        return result

    def run(
        self, grant: Grant, render: Callable[[], bytes], *, min_remaining: float = 0.0
    ) -> PublishResult | None:
        """One unit of work: skip if too little lease time is left (efficiency only), render,
        stage, publish.  Returns ``None`` when skipped."""
        if grant.remaining() < min_remaining:
            return None
        key = self.stage(grant, render())
        nonce = key.rsplit("-", 1)[1].removesuffix(".json")
        return self.publish(grant, key, operation_id=f"{grant.lease_id}-{nonce}")

    def recover(self, grant: Grant) -> PublishResult:
        """After taking over: advance the catalog's fence to our token, keeping what is
        visible, so every object staged under an older token becomes collectable."""
        return self.catalog.publish(
            self.report, None, grant.token, operation_id=f"recover-{grant.lease_id}"
        )


def collect_garbage(
    store: Store,
    catalog: Mapping[str, CatalogEntry],
    *,
    retention: float,
    now: float | None = None,
) -> list[str]:
    """Delete unreferenced staged objects older than ``retention`` seconds whose token is below
    their report's accepted fence.  Never deletes a referenced object, an object of a report the
    catalog does not know, or one a current-or-future writer could still publish."""
    now = time.time() if now is None else now
    referenced = {e.visible for e in catalog.values() if e.visible}
    deleted = []
    for key, mtime in store.list():
        match = KEY.match(key)
        if match is None or key in referenced or now - mtime < retention:
            continue
        entry = catalog.get(match["report"])
        if entry is None or int(match["token"]) >= entry.fence:
            continue  # its writer may still publish it: the fence has not passed it
        store.delete(key)
        deleted.append(key)
    return deleted


# ----------------------------------------------------------------------------- command line


def _s3(args: argparse.Namespace) -> Any:
    from fencedlease.client.fences.s3 import s3_client

    return s3_client(
        args.s3_endpoint,
        os.environ.get("AWS_ACCESS_KEY_ID"),
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
    )


def _catalog(args: argparse.Namespace) -> Catalog:
    if args.catalog == "s3":
        return S3Catalog(_s3(args), args.bucket)
    if args.catalog == "artifact":
        client = KubeClient(KubeConfig.load(args.kubeconfig))
        return ArtifactCatalog(client, args.lease, args.namespace)
    db = args.db
    if db.startswith(("postgresql://", "postgres://", "host=")):
        import psycopg

        return SqlCatalog(psycopg.connect(db))
    return SqlCatalog(sqlite3.connect(db))


def _grant(args: argparse.Namespace) -> Grant | None:
    if args.token is not None:
        until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=args.valid_for)
        return Grant(args.token, args.lease_id or "manual", until, "held", args.lease)
    if args.pod:
        with KubeClient(KubeConfig.load(args.kubeconfig)) as kube:
            return PodGrant(args.lease, pod=args.pod, namespace=args.namespace, client=kube).read()
    return DirectoryGrant(args.dir, args.lease).read()


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no line per probe


def serve_health(port: int) -> ThreadingHTTPServer:
    """``/healthz`` answered by this process (readiness: a frozen process does not answer)."""
    server = ThreadingHTTPServer(("", port), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def work(args: argparse.Namespace, writer: ReportWriter, rounds: int | None = None) -> int:
    """Publish once per grant held, for as long as the process runs (``rounds``: a bound for
    tests).  Each line printed says what happened, with the token read from ``--dir``."""
    source = DirectoryGrant(args.dir, args.lease)
    done: set[int] = set()
    n = 0
    while rounds is None or n < rounds:
        n += 1
        try:
            grant = source.read()
            if grant is not None and grant.held and grant.token not in done:
                print(f"grant: token {grant.token}, lease id {grant.lease_id} (from {args.dir})")
                body = args.content or json.dumps({"report": args.report, "at": time.time()})
                result = writer.run(grant, body.encode, min_remaining=args.min_remaining)
                if result is not None:
                    done.add(grant.token)
                    print(f"{result.code}: token {grant.token}: {result.message}")
        except Exception as exc:  # one line, keep serving (the fence protects the catalog)
            print(f"error: {type(exc).__name__}: {exc}")
        sys.stdout.flush()
        time.sleep(args.interval)
    return 0


EXIT = {"applied": 0, "duplicate": 0, "stale_fence": 11, "unavailable": 13}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_writer.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["run", "gc", "show", "work"])
    parser.add_argument("--report", default="july")
    parser.add_argument("--store", default="objects", help="object store directory")
    parser.add_argument("--catalog", choices=["sql", "artifact", "s3"], default="sql")
    parser.add_argument("--s3-endpoint", help="S3 endpoint (--catalog s3; keys from AWS_* env)")
    parser.add_argument("--bucket", default="reports", help="bucket (--catalog s3)")
    parser.add_argument("--db", default="catalog.db", help="SQLite file or PostgreSQL conninfo")
    parser.add_argument("--lease", default="report-july")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--dir", default="/etc/fencedlease", help="downward-API directory")
    parser.add_argument("--pod", help="read the grant from this Pod's annotations instead")
    parser.add_argument("--token", type=int, help="use this token (SQL catalog demos)")
    parser.add_argument("--lease-id")
    parser.add_argument("--valid-for", type=float, default=60)
    parser.add_argument("--retention", type=float, default=600)
    parser.add_argument("--content", default=None, help="report body (default: a timestamp)")
    parser.add_argument("--interval", type=float, default=2.0, help="work: seconds between reads")
    parser.add_argument("--health-port", type=int, default=8080, help="work: /healthz port")
    parser.add_argument("--min-remaining", type=float, default=2.0, help="work: skip below")
    args = parser.parse_args(argv)
    catalog = _catalog(args)
    store: Store = (
        S3Store(_s3(args), args.bucket) if args.catalog == "s3" else ObjectStore(args.store)
    )
    if args.command == "gc":
        for key in collect_garbage(store, catalog.snapshot(), retention=args.retention):
            print(f"deleted {key}")
        return 0
    if args.command == "show":
        print(json.dumps({r: e.__dict__ for r, e in catalog.snapshot().items()}, indent=2))
        return 0
    if args.command == "work":
        serve_health(args.health_port)
        return work(args, ReportWriter(args.report, store, catalog))
    grant = _grant(args)
    if grant is None or not grant.held:
        print(f"no held grant ({grant})", file=sys.stderr)
        return 3
    body = args.content or json.dumps({"report": args.report, "at": time.time()})
    result = ReportWriter(args.report, store, catalog).run(grant, body.encode)
    if result is None:
        print("skipped: too little lease time left", file=sys.stderr)
        return 5
    print(result.message, file=sys.stderr)
    if isinstance(result, Applied | Duplicate):
        print(result.object_ref if isinstance(result, Applied) else "")
    return EXIT.get(result.code, 12)


if __name__ == "__main__":
    sys.exit(main())
