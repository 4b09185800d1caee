"""The article's fence for the application's own database: a conditional catalog update.

The catalog row is the small pointer that makes an immutable object visible, and it carries the
highest fence it accepted.  Publishing is, in the caller's transaction::

    UPDATE <catalog>
       SET visible_object = :object_key, accepted_fence = :fence, version = version + 1, ...
     WHERE resource_id = :id
       AND accepted_fence <= :fence          -- "<" with strict=True: one write per grant
       [AND version = :expected_version]     -- same-token writes: the version read

and the helper checks that exactly one row changed.  The fence is compared first, with the row
locked: a stale fence is ``StaleFence`` whatever else it carries (as at the webhook).  Same-token
requests are told apart by an ``operation_id`` recorded in ``<catalog>_operations`` with its
fence (a retry under the same fence is a ``Duplicate``, never a second apply; the same id under
a newer fence is a new operation) and/or by ``expected_version`` (a request prepared against an
older version cannot move the pointer back: ``Rejected("version_conflict")``).  Fences are
integers (``bool``, ``float``, ``Decimal`` and ``str`` are refused with ``InvalidInput``).

Works with PostgreSQL (psycopg 3) and SQLite (the standard library).  The helper never commits:
it runs inside the caller's transaction (opening one if the connection is not in autocommit
mode), inside a savepoint so that a refused publish leaves nothing behind, so the caller can
update its own tables in the same transaction and commit them together with the pointer.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any, Union

from fencedlease.client._compat import StrEnum
from fencedlease.client.results import Applied, Duplicate, Rejected, StaleFence
from fencedlease.client.validation import InvalidInput
from fencedlease.client.validation import token as check_token
from fencedlease.client.validation import version as check_version

SqlResult = Union[Applied, Duplicate, StaleFence, Rejected]
"""What :meth:`SqlFence.publish` returns (there is no ``Unavailable``: database errors are
raised, as your driver raises them, and roll back the caller's transaction)."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,50}$")


class Dialect(StrEnum):
    POSTGRES = "postgres"
    SQLITE = "sqlite"


def dialect_of(conn: Any) -> Dialect:
    if isinstance(conn, sqlite3.Connection):
        return Dialect.SQLITE
    module = type(conn).__module__
    if module.startswith("psycopg"):
        return Dialect.POSTGRES
    raise TypeError(f"unsupported connection {type(conn).__name__}: use sqlite3 or psycopg 3")


_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)


def sqlite_autocommits(conn: Any) -> bool:
    """Does this SQLite connection commit every statement by itself?

    Python 3.12 added ``sqlite3.connect(autocommit=True)``: then ``conn.commit()`` does nothing
    and a transaction exists only between an explicit ``BEGIN`` and ``COMMIT``.  Before 3.12
    (and with ``autocommit=LEGACY_TRANSACTION_CONTROL``, the default) autocommit is
    ``isolation_level=None``.  ``autocommit=False`` always has a transaction open.
    """
    mode = getattr(conn, "autocommit", _LEGACY)
    if mode is True:
        return True
    if mode is False:
        return False
    return conn.isolation_level is None


@dataclass(frozen=True)
class CatalogRow:
    """One catalog row as stored."""

    resource_id: str
    visible_object: str | None
    accepted_fence: int
    operation_id: str | None
    version: int


class SqlFenceUsageError(Exception):
    """The helper was called in a way that cannot be fenced (e.g. no transaction)."""


class SqlFence:
    """The conditional catalog update on table ``table`` (and ``<table>_operations``)."""

    def __init__(self, table: str = "fenced_catalog") -> None:
        if not _IDENT.match(table):
            raise ValueError(f"not a plain SQL identifier: {table!r}")
        self.table = table
        self.ops = f"{table}_operations"

    # ------------------------------------------------------------------ DDL

    def ddl(self, dialect: Dialect | str) -> list[str]:
        """``CREATE TABLE IF NOT EXISTS`` statements for the catalog and its operation log."""
        pg = Dialect(dialect) is Dialect.POSTGRES
        ts = "TIMESTAMPTZ" if pg else "TEXT"
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
    resource_id    TEXT PRIMARY KEY,
    visible_object TEXT,
    accepted_fence BIGINT NOT NULL DEFAULT 0 CHECK (accepted_fence >= 0),
    operation_id   TEXT,
    version        BIGINT NOT NULL DEFAULT 0,
    published_at   {ts}
)""",
            f"""CREATE TABLE IF NOT EXISTS {self.ops} (
    resource_id  TEXT NOT NULL REFERENCES {self.table} (resource_id) ON DELETE CASCADE,
    operation_id TEXT NOT NULL,
    fence        BIGINT NOT NULL,
    version      BIGINT NOT NULL,
    PRIMARY KEY (resource_id, operation_id)
)""",
        ]

    def create_tables(self, conn: Any) -> None:
        """Run :meth:`ddl` on ``conn`` (in its current transaction; commit it yourself)."""
        cur = conn.cursor()
        try:
            for statement in self.ddl(dialect_of(conn)):
                cur.execute(statement)
        finally:
            cur.close()

    # ------------------------------------------------------------------ publish

    def publish(
        self,
        conn: Any,
        resource_id: str,
        fence: int,
        object_key: str | None,
        *,
        operation_id: str | None = None,
        expected_version: int | None = None,
        strict: bool = False,
    ) -> SqlResult:
        """Make ``object_key`` visible for ``resource_id`` if ``fence`` may write.

        ``strict``: ``accepted_fence < fence`` (one write per grant), else ``<=``.
        ``operation_id``: a same-token retry of an applied operation is a ``Duplicate``.
        ``expected_version``: the row's ``version`` this publish was prepared against.
        ``object_key=None`` advances the fence without changing the visible object (fence a
        domain update of your own tables done in the same transaction).
        """
        fence = check_token(fence, "fence")
        if expected_version is not None:
            expected_version = check_version(expected_version)
        if not isinstance(resource_id, str) or not resource_id:
            raise InvalidInput(f"resource_id must be a non-empty string, got {resource_id!r:.40}")
        if operation_id is not None and (not isinstance(operation_id, str) or not operation_id):
            raise InvalidInput(f"operation_id must be a non-empty string, got {operation_id!r:.40}")
        d = dialect_of(conn)
        p = "%s" if d is Dialect.POSTGRES else "?"
        cur = conn.cursor()
        try:
            self._begin(conn, cur, d)
            cur.execute("SAVEPOINT fencedlease_publish")
            early = self._admit(cur, d, resource_id, fence, operation_id, strict, expected_version)
            if early is not None:
                return early
            order = "<" if strict else "<="
            sql = (
                f"UPDATE {self.table} SET visible_object = COALESCE({p}, visible_object), "
                f"accepted_fence = {p}, operation_id = {p}, version = version + 1, "
                f"published_at = CURRENT_TIMESTAMP "
                f"WHERE resource_id = {p} AND accepted_fence {order} {p}"
            )
            params: list[Any] = [object_key, fence, operation_id, resource_id, fence]
            if expected_version is not None:
                sql += f" AND version = {p}"
                params.append(expected_version)
            cur.execute(sql, params)
            if cur.rowcount != 1:
                cur.execute("ROLLBACK TO SAVEPOINT fencedlease_publish")
                cur.execute("RELEASE SAVEPOINT fencedlease_publish")
                return self._refusal(cur, p, resource_id, fence, strict, expected_version)
            row = self._read(cur, resource_id, p)
            assert row is not None
            if operation_id is not None:
                cur.execute(
                    f"UPDATE {self.ops} SET version = {p} "
                    f"WHERE resource_id = {p} AND operation_id = {p}",
                    (row.version, resource_id, operation_id),
                )
            # Operations of older fences can never apply again (they are stale): forget them.
            cur.execute(
                f"DELETE FROM {self.ops} WHERE resource_id = {p} AND fence < {p}",
                (resource_id, fence),
            )
            cur.execute("RELEASE SAVEPOINT fencedlease_publish")
            return Applied(
                fence,
                object_key,
                operation_id,
                str(row.version),
                f"applied: {resource_id} shows {row.visible_object} at fence {fence}",
            )
        finally:
            cur.close()

    def _admit(
        self,
        cur: Any,
        d: Dialect,
        resource_id: str,
        fence: int,
        operation_id: str | None,
        strict: bool,
        expected_version: int | None,
    ) -> SqlResult | None:
        """The order checks before the update, in the webhook's order: stale first, then a
        retry of an operation already applied under this very fence (``Duplicate``).  ``None``:
        go on and update (the operation id is then recorded in the open savepoint)."""
        p = "%s" if d is Dialect.POSTGRES else "?"
        cur.execute(
            f"INSERT INTO {self.table} (resource_id, accepted_fence, version) "
            f"VALUES ({p}, 0, 0) ON CONFLICT (resource_id) DO NOTHING",
            (resource_id,),
        )
        # The row lock first (PostgreSQL; on SQLite the INSERT above took the database's write
        # lock), then the comparison: a stale writer is StaleFence whatever operation id it
        # carries.
        lock = " FOR UPDATE" if d is Dialect.POSTGRES else ""
        cur.execute(
            f"SELECT accepted_fence FROM {self.table} WHERE resource_id = {p}{lock}",
            (resource_id,),
        )
        locked = cur.fetchone()
        accepted = int(locked[0]) if locked is not None else 0
        if fence < accepted or (strict and fence == accepted):
            cur.execute("ROLLBACK TO SAVEPOINT fencedlease_publish")
            cur.execute("RELEASE SAVEPOINT fencedlease_publish")
            return self._refusal(cur, p, resource_id, fence, strict, expected_version)
        if operation_id is None:
            return None
        # Operation ids are scoped by fence (the webhook's rule): the same id under the same
        # fence is a retry; under a newer fence it is a new operation (its record moves up).
        cur.execute(
            f"INSERT INTO {self.ops} AS o (resource_id, operation_id, fence, version) "
            f"VALUES ({p}, {p}, {p}, -1) "
            "ON CONFLICT (resource_id, operation_id) DO UPDATE "
            "SET fence = excluded.fence, version = -1 WHERE o.fence < excluded.fence",
            (resource_id, operation_id, fence),
        )
        if cur.rowcount == 1:
            return None
        cur.execute("RELEASE SAVEPOINT fencedlease_publish")
        return Duplicate(
            fence,
            operation_id,
            f"duplicate: operation {operation_id} was already applied to {resource_id} "
            f"at fence {fence}",
        )

    def read(self, conn: Any, resource_id: str) -> CatalogRow | None:
        """The catalog row of ``resource_id`` (``None`` if never published)."""
        d = dialect_of(conn)
        cur = conn.cursor()
        try:
            return self._read(cur, resource_id, "%s" if d is Dialect.POSTGRES else "?")
        finally:
            cur.close()

    def referenced(self, conn: Any) -> set[str]:
        """Every object key a catalog row makes visible (the garbage collector's roots)."""
        cur = conn.cursor()
        try:
            cur.execute(f"SELECT visible_object FROM {self.table} WHERE visible_object IS NOT NULL")
            return {str(r[0]) for r in cur.fetchall()}
        finally:
            cur.close()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _begin(conn: Any, cur: Any, d: Dialect) -> None:
        if d is Dialect.SQLITE:
            if not conn.in_transaction:
                if sqlite_autocommits(conn):
                    raise SqlFenceUsageError(
                        "the SQLite connection is in autocommit mode with no open transaction:"
                        " run the publish inside BEGIN ... COMMIT"
                    )
                cur.execute("BEGIN IMMEDIATE")  # the caller commits (or rolls back)
            return
        import psycopg

        status = conn.info.transaction_status
        if conn.autocommit and status == psycopg.pq.TransactionStatus.IDLE:
            raise SqlFenceUsageError(
                "the psycopg connection is in autocommit mode with no open transaction: "
                "run the publish inside `with conn.transaction():`"
            )
        # Not autocommit: psycopg opens the transaction with the first statement.

    def _read(self, cur: Any, resource_id: str, p: str) -> CatalogRow | None:
        cur.execute(
            f"SELECT resource_id, visible_object, accepted_fence, operation_id, version "
            f"FROM {self.table} WHERE resource_id = {p}",
            (resource_id,),
        )
        r = cur.fetchone()
        if r is None:
            return None
        return CatalogRow(str(r[0]), r[1], int(r[2]), r[3], int(r[4]))

    def _refusal(
        self,
        cur: Any,
        p: str,
        resource_id: str,
        fence: int,
        strict: bool,
        expected_version: int | None,
    ) -> SqlResult:
        row = self._read(cur, resource_id, p)
        if row is None:
            return Rejected("not_found", f"{self.table} has no row {resource_id!r}")
        if fence < row.accepted_fence or (strict and fence == row.accepted_fence):
            rule = "is not above" if fence == row.accepted_fence else "is below"
            return StaleFence(
                fence,
                f"stale_fence: fence {fence} {rule} the accepted fence {row.accepted_fence} "
                f"of {resource_id}",
            )
        if expected_version is not None and row.version != expected_version:
            return Rejected(
                "version_conflict",
                f"version_conflict: {resource_id} is at version {row.version}, the publish was "
                f"prepared against {expected_version}",
            )
        return Rejected("not_applied", f"{resource_id}: the conditional update changed no row")
