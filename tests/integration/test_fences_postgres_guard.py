"""PostgreSQL enforcing the fence itself: hand-written SQL from a second role that never uses
our helper is refused by the database (the guard installed by ``fencedlease sql ddl``)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from fencedlease.client import Applied, StaleFence
from fencedlease.client.fences import FenceInputError
from fencedlease.client.fences.postgres import (
    SQLSTATE_BAD_DOMAIN,
    SQLSTATE_BAD_TOKEN,
    SQLSTATE_NO_TOKEN,
    SQLSTATE_STALE,
    GuardSpec,
    guard_ddl,
    write,
)

from ..pg import PostgresServer

pytestmark = pytest.mark.timeout(120)


Connect = Callable[[], psycopg.Connection[Any]]


@pytest.fixture
def db(postgres: PostgresServer) -> Iterator[tuple[str, Connect]]:
    """A fresh database with table ``reports`` guarded by the CLI (``--apply``); the
    connection factory of role ``writer``, which bypasses every helper."""
    writer = f"w_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {writer} LOGIN")
    conninfo = postgres.fresh_database("guard")
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("CREATE TABLE reports (report_id TEXT PRIMARY KEY, body TEXT)")
    cli = subprocess.run(
        [sys.executable, "-m", "fencedlease", "sql", "ddl", "--table", "reports",
         "--domain-column", "report_id", "--writer", writer, "--apply", "--dsn", conninfo],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    opened: list[psycopg.Connection[Any]] = []

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(conninfo.replace("user=fencedlease", f"user={writer}"))
        opened.append(conn)
        return conn

    yield conninfo, connect
    for conn in opened:
        conn.close()


def refused(conn: psycopg.Connection[Any], sql: str, token: str | None = None) -> psycopg.Error:
    """Run ``sql`` (with ``SET LOCAL fencedlease.token``) and return the database's refusal."""
    with pytest.raises(psycopg.Error) as info, conn.transaction():
        if token is not None:
            conn.execute("SELECT set_config('fencedlease.token', %s, true)", (token,))
        conn.execute(sql)
    return info.value


def written(conn: psycopg.Connection[Any], sql: str, token: int) -> None:
    """Run ``sql`` in a transaction after ``SET LOCAL fencedlease.token``; the guard admits it."""
    with conn.transaction():
        conn.execute(f"SET LOCAL fencedlease.token = {token}")
        conn.execute(sql)


def rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    with conn.transaction():
        return list(conn.execute("SELECT report_id, body FROM reports ORDER BY 1").fetchall())


def test_hand_written_writes_from_a_second_role(db: tuple[str, Connect]) -> None:
    _, connect = db
    conn = connect()
    # No token: refused, whatever the statement.
    err = refused(conn, "INSERT INTO reports VALUES ('july', 'a')")
    assert err.sqlstate == SQLSTATE_NO_TOKEN and "no_token" in str(err)
    # The current owner's hand-written writes go through.
    written(conn, "INSERT INTO reports VALUES ('july', 'b')", 42)
    # A stale owner's UPDATE, DELETE and INSERT ... ON CONFLICT are refused by the database.
    for sql in (
        "UPDATE reports SET body = 'a' WHERE report_id = 'july'",
        "DELETE FROM reports WHERE report_id = 'july'",
        "INSERT INTO reports VALUES ('july', 'a') ON CONFLICT (report_id) DO UPDATE SET body = 'a'",
    ):
        err = refused(conn, sql, token="41")
        assert err.sqlstate == SQLSTATE_STALE, (sql, err)
        assert "stale_fence: fence 41 is below the accepted fence 42 of domain july" in str(err)
    assert rows(conn) == [("july", "b")]
    # Bad tokens: refused, nothing changed.
    for bad in ("abc", "-1", "0", "4.2", "99999999999999999999", " 42"):
        err = refused(conn, "UPDATE reports SET body = 'x'", token=bad)
        assert err.sqlstate == SQLSTATE_BAD_TOKEN, (bad, err)
    assert rows(conn) == [("july", "b")]
    # Other domains have their own fence.
    written(conn, "INSERT INTO reports VALUES ('august', 'c')", 7)
    # Moving a row into a domain checks that domain too.
    err = refused(conn, "UPDATE reports SET report_id = 'july2' WHERE report_id = 'july'", "7")
    assert err.sqlstate == SQLSTATE_STALE


def test_the_writer_cannot_switch_the_guard_off(db: tuple[str, Connect]) -> None:
    _, connect = db
    conn = connect()
    written(conn, "INSERT INTO reports VALUES ('july', 'b')", 42)
    for sql in (
        "UPDATE fencedlease.fences SET accepted_fence = 0",
        "DELETE FROM fencedlease.fences",
        "TRUNCATE reports",
        "ALTER TABLE reports DISABLE TRIGGER fencedlease_guard",
        "DROP TRIGGER fencedlease_guard ON reports",
        "SET session_replication_role = replica",
        "CREATE OR REPLACE FUNCTION fencedlease.guard() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RETURN NEW; END $$",
    ):
        err = refused(conn, sql, token="41")
        assert isinstance(err, psycopg.errors.InsufficientPrivilege), (sql, err)
    with conn.transaction():
        marks = conn.execute("SELECT domain, accepted_fence FROM fencedlease.fences").fetchall()
    assert marks == [("july", 42)]
    assert rows(conn) == [("july", "b")]


def test_the_helper_returns_results(db: tuple[str, Connect]) -> None:
    _, connect = db
    conn = connect()
    ok = write(conn, 42, "INSERT INTO reports VALUES ('july', 'b')")
    assert isinstance(ok, Applied) and ok.version == "1"
    stale = write(conn, 41, "UPDATE reports SET body = 'a'")
    assert isinstance(stale, StaleFence) and "below the accepted fence 42" in stale.message
    conn.commit()
    with pytest.raises(FenceInputError, match="invalid token"):
        write(conn, True, "UPDATE reports SET body = 'a'")
    assert rows(conn) == [("july", "b")]


def test_a_stale_writer_waiting_on_the_mark_is_refused_after_the_commit(
    db: tuple[str, Connect], postgres: PostgresServer
) -> None:
    """B (42) holds the domain's mark row; A (41) blocks on it (seen in pg_stat_activity, not
    guessed with a sleep); B commits; A is refused."""
    conninfo, connect = db
    b, a = connect(), connect()
    b.execute("SET LOCAL fencedlease.token = 42")
    b.execute("INSERT INTO reports VALUES ('july', 'b')")  # holds the mark row until commit
    a_pid = a.info.backend_pid
    outcome: list[Any] = []

    def stale_writer() -> None:
        outcome.append(
            write(a, 41, "INSERT INTO reports VALUES ('july', 'a') ON CONFLICT DO NOTHING")
        )

    thread = threading.Thread(target=stale_writer)
    thread.start()
    with psycopg.connect(conninfo, autocommit=True) as watch:
        deadline = time.monotonic() + 30
        while True:
            got = watch.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (a_pid,)
            ).fetchone()
            if got is not None and got[0] == "Lock":
                break
            assert time.monotonic() < deadline, f"A never waited on the mark: {got}"
            time.sleep(0.02)
    b.commit()
    thread.join(30)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StaleFence), outcome
    a.rollback()
    assert rows(b) == [("july", "b")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GuardSpec("reports; drop table x", domain="d"), "unsafe table"),
        (GuardSpec("Reports", domain="d"), "unsafe table"),
        (GuardSpec("reports", schema='pub"lic', domain="d"), "unsafe schema"),
        (GuardSpec("reports", domain_column="id)--", writers=()), "unsafe domain column"),
        (GuardSpec("reports", domain="it's"), "unsafe domain"),
        (GuardSpec("reports", domain="d", writers=("app; drop role x",)), "unsafe role"),
        (GuardSpec("reports"), "exactly one"),
        (GuardSpec("reports", domain="d", domain_column="c"), "exactly one"),
    ],
)
def test_unsafe_names_are_refused(spec: GuardSpec, message: str) -> None:
    with pytest.raises(FenceInputError, match=message):
        guard_ddl(spec)


def test_cli_refuses_unsafe_names_in_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fencedlease", "sql", "ddl", "--table", "x;drop", "--domain", "d"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: unsafe table 'x;drop'") and out.stderr.count("\n") == 1


# ----------------------------------------------------------------------------- issue 42


def ddl_cli(conninfo: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencedlease", "sql", "ddl", *args, "--apply", "--dsn", conninfo],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def guard_triggers(conninfo: str, table: str) -> list[str]:
    with psycopg.connect(conninfo, autocommit=True) as admin:
        got = admin.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
            (table,),
        ).fetchall()
    return sorted(r[0] for r in got)


@pytest.mark.parametrize("how", ["chain", "direct", "noinherit", "owner", "superuser-member"])
def test_a_writer_that_can_act_as_an_owner_is_refused(postgres: PostgresServer, how: str) -> None:
    """Issue 42 item 3: ``--writer w2`` where w2 is a member (here through a chain) of the
    table owner's role installed, and w2 then disabled the trigger and wrote without a token.
    The DDL refuses such a writer, in one line, and installs nothing."""
    tag = uuid.uuid4().hex[:8]
    owner, mid, w2 = f"o_{tag}", f"m_{tag}", f"w2_{tag}"
    conninfo = postgres.fresh_database("member")
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {owner}")
        admin.execute(f"CREATE ROLE {mid}")
        admin.execute(f"CREATE ROLE {w2} LOGIN {'NOINHERIT' if how == 'noinherit' else ''}")
        admin.execute("CREATE TABLE reports (report_id TEXT PRIMARY KEY, body TEXT)")
        admin.execute(f"ALTER TABLE reports OWNER TO {owner}")
        if how == "chain":
            admin.execute(f"GRANT {owner} TO {mid}")
            admin.execute(f"GRANT {mid} TO {w2}")
        elif how in ("direct", "noinherit"):
            admin.execute(f"GRANT {owner} TO {w2}")  # NOINHERIT still allows SET ROLE
        elif how == "owner":
            admin.execute(f"ALTER TABLE reports OWNER TO {w2}")
        else:
            admin.execute(f"GRANT {postgres.user} TO {mid}")
            admin.execute(f"GRANT {mid} TO {w2}")
    out = ddl_cli(conninfo, "--table", "reports", "--domain-column", "report_id", "--writer", w2)
    assert out.returncode == 1, out
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: fencedlease: the writer role {w2} "), out.stderr
    expected = {
        "chain": f"is a member (directly or through other roles) of {owner}, the owner of the "
        "table public.reports",
        "direct": f"of {owner}, the owner of the table public.reports",
        "noinherit": f"of {owner}, the owner of the table public.reports",
        "owner": "owns the table public.reports",
        "superuser-member": f"is a member of the superuser role {postgres.user}",
    }[how]
    assert expected in out.stderr and "could switch the guard" in out.stderr, out.stderr
    assert guard_triggers(conninfo, "reports") == []  # one transaction: nothing installed
    if how != "chain":
        return
    # Why: with the guard installed for another writer, w2 can switch it off (the reproduction).
    plain = f"w_{tag}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {plain} LOGIN")
    ok = ddl_cli(conninfo, "--table", "reports", "--domain-column", "report_id", "--writer", plain)
    assert ok.returncode == 0, ok.stderr
    with psycopg.connect(conninfo.replace(f"user={postgres.user}", f"user={w2}")) as conn:
        conn.execute("ALTER TABLE reports DISABLE TRIGGER fencedlease_guard")
        conn.rollback()


@pytest.mark.parametrize(
    "column_type",
    ["numeric", "numeric(10,2)", "float8", "real", "timestamptz", "interval", "bytea", "num_k"],
)
def test_a_domain_column_whose_text_is_not_canonical_is_refused(
    postgres: PostgresServer, column_type: str
) -> None:
    """Issue 42 item 5: with a numeric domain column, 42 wrote k=1, then 41 wrote k=1.0 and was
    admitted (the mark's key was the text). The DDL refuses such a column, in one line."""
    conninfo = postgres.fresh_database("numeric")
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("CREATE DOMAIN num_k AS numeric")
        admin.execute(f"CREATE TABLE t (k {column_type}, body TEXT)")
    out = ddl_cli(conninfo, "--table", "t", "--domain-column", "k")
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out
    assert "error: fencedlease: the domain column k of public.t is of type" in out.stderr, (
        out.stderr
    )
    assert "not one value per equal key" in out.stderr
    assert guard_triggers(conninfo, "t") == []


@pytest.mark.parametrize("column_type", ["text", "varchar(20)", "int4", "int8", "uuid", "txt_k"])
def test_canonical_domain_columns_are_accepted(postgres: PostgresServer, column_type: str) -> None:
    conninfo = postgres.fresh_database("canonical")
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("CREATE DOMAIN base_k AS text; CREATE DOMAIN txt_k AS base_k")
        admin.execute(f"CREATE TABLE t (k {column_type}, body TEXT)")
    out = ddl_cli(conninfo, "--table", "t", "--domain-column", "k")
    assert out.returncode == 0, out.stderr
    assert guard_triggers(conninfo, "t") == ["fencedlease_guard", "fencedlease_no_truncate"]


def test_a_nondeterministic_collation_is_refused(postgres: PostgresServer) -> None:
    conninfo = postgres.fresh_database("collation")
    with psycopg.connect(conninfo, autocommit=True) as admin:
        try:
            admin.execute(
                "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', "
                "deterministic = false)"
            )
        except psycopg.Error as exc:  # a server built without ICU
            pytest.skip(f"no ICU collations: {exc}")
        admin.execute("CREATE TABLE t (k TEXT COLLATE ci, body TEXT)")
    out = ddl_cli(conninfo, "--table", "t", "--domain-column", "k")
    assert out.returncode == 1 and "nondeterministic collation ci" in out.stderr, out.stderr


def test_the_guard_checks_the_column_type_at_every_write(db: tuple[str, Connect]) -> None:
    """The column changed type after the DDL (``ALTER COLUMN ... TYPE numeric``): the guard
    itself refuses the write, so 42's k=1 and 41's k=1.0 can never be two domains."""
    conninfo, connect = db
    conn = connect()
    written(conn, "INSERT INTO reports VALUES ('1', 'b')", 42)
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("ALTER TABLE reports ALTER COLUMN report_id TYPE numeric USING 1")
    for token, sql in (
        ("41", "INSERT INTO reports VALUES (1.0, 'a')"),
        ("42", "INSERT INTO reports VALUES (2, 'c')"),
    ):
        err = refused(conn, sql, token=token)
        assert err.sqlstate == SQLSTATE_BAD_DOMAIN, err
        assert (
            "invalid_domain: the domain column report_id of public.reports is of type numeric"
            in str(err)
        )
    assert rows(conn) == [(1, "b")]


HOSTILE_TOKENS = [
    "0041", "-42", "41.9", "4e10", "1" * 23, "+42", "42 ", " 42", "42\n", "\u0664\u0662", "0",
    "9223372036854775808", "0x2a", "1_0", "42;", "NaN", "Infinity", "4\u200b2",
]  # fmt: skip


def test_the_guard_validates_tokens_itself(db: tuple[str, Connect]) -> None:
    """As if the client library did not exist: a writer's own SQL with a hostile token."""
    _, connect = db
    conn = connect()
    written(conn, "INSERT INTO reports VALUES ('july', 'b')", 42)
    for bad in HOSTILE_TOKENS:
        for sql in (
            "UPDATE reports SET body = 'x'",
            "INSERT INTO reports VALUES ('august', 'x')",
            "DELETE FROM reports",
        ):
            err = refused(conn, sql, token=bad)
            assert err.sqlstate == SQLSTATE_BAD_TOKEN, (bad, sql, err)
    assert rows(conn) == [("july", "b")]
    with conn.transaction():
        marks = conn.execute("SELECT domain, accepted_fence FROM fencedlease.fences").fetchall()
    assert marks == [("july", 42)]
    # Nor can the writer call the guard's pieces or read past them.
    for sql in (
        "SELECT fencedlease.domain_column_problem('reports'::regclass, 'report_id')",
        "INSERT INTO fencedlease.fences VALUES ('august', 99)",
    ):
        err = refused(conn, sql, token="42")
        assert isinstance(err, psycopg.errors.InsufficientPrivilege), (sql, err)


@pytest.mark.parametrize(
    "trigger",
    [
        "AFTER INSERT ON reports FOR EACH ROW EXECUTE FUNCTION "
        "fencedlease.guard('column', 'report_id', '')",
        "BEFORE INSERT ON reports FOR EACH STATEMENT EXECUTE FUNCTION "
        "fencedlease.guard('constant', 'd', '')",
        "BEFORE INSERT ON reports FOR EACH ROW EXECUTE FUNCTION "
        "fencedlease.guard('bogus', 'x', '')",
        "BEFORE INSERT ON reports FOR EACH ROW EXECUTE FUNCTION fencedlease.guard('column')",
        "BEFORE INSERT ON reports FOR EACH ROW EXECUTE FUNCTION "
        "fencedlease.guard('column', 'no_such_column', '')",
    ],
)
def test_the_guard_checks_how_it_is_attached(db: tuple[str, Connect], trigger: str) -> None:
    """The guard attached by hand (not by our DDL) the wrong way refuses every write."""
    conninfo, connect = db
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE TRIGGER by_hand {trigger}")
    err = refused(connect(), "INSERT INTO reports VALUES ('july', 'b')", token="42")
    assert err.sqlstate == SQLSTATE_BAD_DOMAIN and "invalid_domain" in str(err), err
