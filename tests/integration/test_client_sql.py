"""The SQL fence (the article's conditional catalog update) on a real PostgreSQL server and on
SQLite.  The PostgreSQL server is a throwaway local process (tests/pg.py)."""

from __future__ import annotations

import random
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencedlease.client import Applied, Duplicate, Rejected, SqlFence, StaleFence
from fencedlease.client.sql import SqlFenceUsageError

from ..pg import PostgresServer

pytestmark = pytest.mark.timeout(120)

Connect = Callable[[], Any]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(port=random.randint(40000, 60000)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["postgres", "sqlite"])
def connect(
    request: pytest.FixtureRequest, tmp_path: Path, postgres: PostgresServer
) -> Iterator[Connect]:
    """A factory of connections to one fresh database, with the fence's tables created."""
    opened: list[Any] = []
    if request.param == "postgres":
        conninfo = postgres.fresh_database("t")

        def factory() -> Any:
            conn = psycopg.connect(conninfo)
            opened.append(conn)
            return conn
    else:
        path = tmp_path / "catalog.db"

        def factory() -> Any:
            conn = sqlite3.connect(path, timeout=30, check_same_thread=False)
            opened.append(conn)
            return conn

    setup = factory()
    SqlFence("report_catalog").create_tables(setup)
    setup.execute("CREATE TABLE report_meta (report_id TEXT PRIMARY KEY, rows INTEGER)")
    setup.commit()
    yield factory
    for conn in opened:
        conn.close()


FENCE = SqlFence("report_catalog")


def test_the_article_walkthrough(connect: Connect) -> None:
    """A (41) pauses, B (42) publishes, A resumes: stale_fence, B stays visible."""
    conn = connect()
    b = FENCE.publish(conn, "july", 42, "reports/july/b9.tmp", operation_id="b9")
    assert isinstance(b, Applied) and b.version == "1"
    conn.commit()
    a = FENCE.publish(conn, "july", 41, "reports/july/a7.tmp", operation_id="a7")
    assert isinstance(a, StaleFence) and "41 is below the accepted fence 42" in a.message
    conn.commit()
    row = FENCE.read(conn, "july")
    assert row is not None
    assert (row.visible_object, row.accepted_fence, row.version) == ("reports/july/b9.tmp", 42, 1)
    assert FENCE.referenced(conn) == {"reports/july/b9.tmp"}


def test_equal_fence_and_strict_policy(connect: Connect) -> None:
    conn = connect()
    assert isinstance(FENCE.publish(conn, "r", 7, "one", operation_id="1"), Applied)
    assert isinstance(FENCE.publish(conn, "r", 7, "two", operation_id="2"), Applied)  # <=
    strict = FENCE.publish(conn, "r", 7, "three", operation_id="3", strict=True)
    assert isinstance(strict, StaleFence) and "is not above" in strict.message
    assert isinstance(FENCE.publish(conn, "r", 8, "four", strict=True), Applied)
    conn.commit()
    row = FENCE.read(conn, "r")
    assert row is not None and row.visible_object == "four" and row.accepted_fence == 8


def test_duplicate_current_token_requests(connect: Connect) -> None:
    conn = connect()
    first = FENCE.publish(conn, "r", 5, "p1", operation_id="op-1")
    assert isinstance(first, Applied)
    again = FENCE.publish(conn, "r", 5, "p1", operation_id="op-1")
    assert isinstance(again, Duplicate) and again.operation_id == "op-1"
    conn.commit()
    row = FENCE.read(conn, "r")
    assert row is not None and row.version == 1  # applied once


def test_reordered_same_token_requests_with_expected_version(connect: Connect) -> None:
    conn = connect()
    base = FENCE.publish(conn, "r", 5, "p0", operation_id="op-0")
    assert isinstance(base, Applied)
    read_at = int(base.version)
    # op-1 and op-2 were both prepared at read_at; op-2 arrives first and applies.
    op2 = FENCE.publish(conn, "r", 5, "p2", operation_id="op-2", expected_version=read_at)
    assert isinstance(op2, Applied)
    op1 = FENCE.publish(conn, "r", 5, "p1", operation_id="op-1", expected_version=read_at)
    assert isinstance(op1, Rejected) and op1.code == "version_conflict"
    conn.commit()
    row = FENCE.read(conn, "r")
    assert row is not None and row.visible_object == "p2"
    # op-1's id was not consumed by the refused attempt: re-read, retry, applied.
    retry = FENCE.publish(conn, "r", 5, "p1", operation_id="op-1", expected_version=row.version)
    assert isinstance(retry, Applied)


def test_operation_ids_of_older_fences_are_stale_not_duplicates(connect: Connect) -> None:
    conn = connect()
    assert isinstance(FENCE.publish(conn, "r", 5, "a", operation_id="op"), Applied)
    assert isinstance(FENCE.publish(conn, "r", 6, "b", operation_id="op-6"), Applied)
    late = FENCE.publish(conn, "r", 5, "a", operation_id="op-late")
    assert isinstance(late, StaleFence)


def test_runs_in_the_callers_transaction(connect: Connect) -> None:
    conn = connect()
    conn.execute("INSERT INTO report_meta VALUES ('july', 10)")
    assert isinstance(FENCE.publish(conn, "july", 3, "x"), Applied)
    conn.rollback()  # the caller gives up: neither the pointer nor its own row exist
    assert FENCE.read(conn, "july") is None
    conn.rollback()
    # A refused publish undoes only its own savepoint: the caller's other writes stay.
    assert isinstance(FENCE.publish(conn, "july", 9, "nine"), Applied)
    conn.commit()
    conn.execute("INSERT INTO report_meta VALUES ('july', 20)")
    assert isinstance(FENCE.publish(conn, "july", 4, "four", operation_id="o4"), StaleFence)
    conn.commit()
    other = connect()
    rows = other.execute("SELECT rows FROM report_meta WHERE report_id = 'july'").fetchall()
    assert [r[0] for r in rows] == [20]
    ops = other.execute("SELECT count(*) FROM report_catalog_operations").fetchone()
    assert ops is not None and ops[0] == 0  # the refused operation left no trace


def test_autocommit_without_a_transaction_is_refused(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    with psycopg.connect(postgres.conninfo, autocommit=True) as conn:
        fence = SqlFence(f"auto_{random.getrandbits(30):x}")
        for statement in fence.ddl("postgres"):
            conn.execute(statement)
        with pytest.raises(SqlFenceUsageError):
            fence.publish(conn, "r", 1, "x")
        with conn.transaction():
            assert isinstance(fence.publish(conn, "r", 1, "x"), Applied)
    lite = sqlite3.connect(tmp_path / "auto.db", isolation_level=None)
    SqlFence("c").create_tables(lite)
    with pytest.raises(SqlFenceUsageError):
        SqlFence("c").publish(lite, "r", 1, "x")
    lite.close()


def test_concurrent_publishers_serialise_on_the_row(connect: Connect) -> None:
    """B (42) holds the row lock, uncommitted; A (41) waits for it, then sees 42: stale."""
    b_conn, a_conn = connect(), connect()
    assert isinstance(FENCE.publish(b_conn, "july", 1, "seed"), Applied)
    b_conn.commit()
    assert isinstance(FENCE.publish(b_conn, "july", 42, "b9"), Applied)  # not committed yet
    results: list[Any] = []
    started = threading.Event()

    def writer_a() -> None:
        started.set()
        results.append(FENCE.publish(a_conn, "july", 41, "a7"))
        a_conn.commit()

    thread = threading.Thread(target=writer_a)
    thread.start()
    started.wait(5)
    thread.join(0.5)
    assert thread.is_alive(), "A should wait for B's row lock"
    b_conn.commit()
    thread.join(30)
    assert len(results) == 1 and isinstance(results[0], StaleFence), results
    row = FENCE.read(connect(), "july")
    assert row is not None and row.visible_object == "b9"


def test_table_names_are_checked() -> None:
    with pytest.raises(ValueError):
        SqlFence("catalog; DROP TABLE x")
