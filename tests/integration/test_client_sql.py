"""The SQL fence (the article's conditional catalog update) on a real PostgreSQL server and on
SQLite.  The PostgreSQL server is a throwaway local process (tests/pg.py)."""

from __future__ import annotations

import random
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fencedlease.client import Applied, Duplicate, Rejected, SqlFence, StaleFence
from fencedlease.client.sql import SqlFenceUsageError
from fencedlease.client.validation import InvalidInput

from ..pg import PostgresServer

pytestmark = pytest.mark.timeout(120)

Connect = Callable[[], Any]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """Its own server (as tests/integration/conftest.py's): make test-pythons runs this module
    with --noconftest, in a venv holding only the client (the conftest imports the operator)."""
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


def test_a_stale_writer_reusing_an_applied_operation_id_is_stale(connect: Connect) -> None:
    """Issue 31, defect 4: fence 6 applied operation Y; fence 4 with Y used to get Duplicate
    (callers treat it as success) because the operation-id insert ran before the fence
    comparison.  Stale wins, as at the webhook."""
    conn = connect()
    assert isinstance(FENCE.publish(conn, "r", 6, "six", operation_id="Y"), Applied)
    late = FENCE.publish(conn, "r", 4, "four", operation_id="Y")
    assert isinstance(late, StaleFence), late
    strict = FENCE.publish(conn, "r", 6, "six", operation_id="Y", strict=True)
    assert isinstance(strict, StaleFence), strict  # StrictlyGreater: equal is stale first
    conn.commit()
    row = FENCE.read(conn, "r")
    assert row is not None and (row.visible_object, row.accepted_fence, row.version) == (
        "six",
        6,
        1,
    )


def test_operation_ids_are_scoped_by_fence(connect: Connect) -> None:
    """The rule (docs/client.md), the webhook's: an operation id is a retry only under the
    fence it was applied with; a newer fence reusing it is a new operation and applies."""
    conn = connect()
    assert isinstance(FENCE.publish(conn, "r", 5, "five", operation_id="Y"), Applied)
    newer = FENCE.publish(conn, "r", 6, "six", operation_id="Y")
    assert isinstance(newer, Applied), newer
    again = FENCE.publish(conn, "r", 6, "six", operation_id="Y")
    assert isinstance(again, Duplicate), again
    old = FENCE.publish(conn, "r", 5, "five", operation_id="Y")
    assert isinstance(old, StaleFence), old
    conn.commit()
    row = FENCE.read(conn, "r")
    assert row is not None and (row.visible_object, row.accepted_fence, row.version) == (
        "six",
        6,
        2,
    )
    ops = conn.execute("SELECT operation_id, fence FROM report_catalog_operations").fetchall()
    assert [tuple(o) for o in ops] == [("Y", 6)]


@pytest.mark.parametrize("fence", [8.5, 8.0, True, Decimal("8"), "8", 0, -1, 2**63, None], ids=repr)
def test_fences_are_integers(connect: Connect, fence: Any) -> None:
    """Issue 31, defect 6: a fence of 8.5 was stored as a REAL (SQLite), and the real token 8
    then got not_applied instead of StaleFence."""
    conn = connect()
    with pytest.raises(InvalidInput):
        FENCE.publish(conn, "r", fence, "x")
    with pytest.raises(InvalidInput):
        FENCE.publish(conn, "r", 8, "x", expected_version=1.0)  # type: ignore[arg-type]
    assert FENCE.read(conn, "r") is None  # nothing written, not even the row
    assert isinstance(FENCE.publish(conn, "r", 9, "nine"), Applied)
    assert isinstance(FENCE.publish(conn, "r", 8, "eight"), StaleFence)


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


class _AutocommitConnection(sqlite3.Connection):
    """A double of Python 3.12's ``sqlite3.connect(autocommit=True)`` for every Python: the
    attribute the helper must read (``conn.commit()`` is a no-op in that mode)."""

    autocommit = True


def test_sqlite_autocommit_attribute_without_a_transaction_is_refused(tmp_path: Path) -> None:
    """Issue 31, defect 5 (through the attribute, on every Python): ``_begin`` looked only at
    ``isolation_level``, so publish returned Applied and the row was lost on close."""
    conn = sqlite3.connect(tmp_path / "auto.db", factory=_AutocommitConnection)
    assert conn.autocommit is True and not conn.in_transaction
    SqlFence("c").create_tables(conn)
    conn.commit()
    with pytest.raises(SqlFenceUsageError):
        SqlFence("c").publish(conn, "r", 1, "x")
    conn.execute("BEGIN")  # an explicit transaction is what the docs ask for
    assert isinstance(SqlFence("c").publish(conn, "r", 1, "x"), Applied)
    conn.execute("COMMIT")
    conn.close()


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sqlite3 autocommit= is Python 3.12+")
def test_sqlite_autocommit_true_without_a_transaction_is_refused(tmp_path: Path) -> None:
    """Issue 31, defect 5 on a real Python >= 3.12 connection (make test-pythons)."""
    path = tmp_path / "auto.db"
    connect: Any = sqlite3.connect  # autocommit= is 3.12+ (mypy checks as 3.11)
    conn = connect(path, autocommit=True)
    SqlFence("c").create_tables(conn)
    with pytest.raises(SqlFenceUsageError):
        SqlFence("c").publish(conn, "r", 1, "x")
    conn.execute("BEGIN")
    assert isinstance(SqlFence("c").publish(conn, "r", 1, "x"), Applied)
    conn.execute("COMMIT")
    conn.close()
    other = sqlite3.connect(path)
    assert SqlFence("c").read(other, "r") is not None  # committed, not lost on close
    other.close()
    # autocommit=False (PEP 249) always has a transaction open: publish, then commit().
    pep249 = connect(path, autocommit=False)
    assert isinstance(SqlFence("c").publish(pep249, "r", 2, "y"), Applied)
    pep249.commit()
    pep249.close()
    row = SqlFence("c").read(sqlite3.connect(path), "r")
    assert row is not None and row.accepted_fence == 2


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
