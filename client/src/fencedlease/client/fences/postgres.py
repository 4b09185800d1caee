"""PostgreSQL that enforces the fence itself: a table-level guard installed by DDL.

:class:`~fencedlease.client.SqlFence` fences the writers that use it.  The guard fences every
writer: a ``BEFORE INSERT OR UPDATE OR DELETE`` row trigger on each fenced table calls one
``SECURITY DEFINER`` function that

* reads the transaction's token from the setting ``fencedlease.token`` (``SET LOCAL
  fencedlease.token = 42``, or :func:`set_token`) and refuses the write without one
  (SQLSTATE ``FLT01``) or with one that is not a positive int64 written the one way
  (``^[1-9][0-9]{0,18}$``, ``FLT02``);
* locks the fencing domain's mark row in ``fencedlease.fences`` (``FOR UPDATE``: concurrent
  writers of one domain are serialized until commit), refuses a token below the accepted fence
  (``FLS01``, message ``stale_fence: ...``) and otherwise advances the mark to the token.

The domain of a row is a column's value (``--domain-column``, old and new value on an update)
or one constant for the whole table (``--domain``), optionally prefixed.  The mark table belongs
to the role that ran the DDL; writer roles get no privilege on it but ``SELECT`` (they cannot
move a mark back), only ``SELECT, INSERT, UPDATE, DELETE`` on the fenced table (no ``TRUNCATE``,
which row triggers do not see; a statement trigger refuses it too), and must not be a
superuser nor a member, directly or through other roles, of a superuser or of a role owning the
table, its schema or the guard (any of them could disable the trigger or move a mark: the DDL
checks).  A domain column must be of a type whose text is one value per equal key (text,
varchar, integers, uuid; deterministic collation): the DDL checks and so does the guard, at
every write.  So a hand-written ``UPDATE`` from ``psql`` is refused exactly like a stale helper
(docs/fences.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fencedlease.client.fences.core import FenceInputError, FenceResult, check_token
from fencedlease.client.results import Applied, Rejected, StaleFence

SETTING = "fencedlease.token"
GUARD_SCHEMA = "fencedlease"

SQLSTATE_STALE = "FLS01"
SQLSTATE_NO_TOKEN = "FLT01"
SQLSTATE_BAD_TOKEN = "FLT02"
SQLSTATE_BAD_DOMAIN = "FLD01"
SQLSTATE_TRUNCATE = "FLX01"

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_DOMAIN = re.compile(r"^[A-Za-z0-9_.:/-]{0,200}$")


def ident(name: object, what: str) -> str:
    """``name`` double-quoted, if it is a safe identifier (lower case letters, digits, ``_``,
    at most 63 characters, not starting with a digit); else :class:`FenceInputError`."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise FenceInputError(
            f"unsafe {what} {name!r}: use lower-case letters, digits and _ (at most 63, "
            "not starting with a digit)"
        )
    return f'"{name}"'


def _literal(value: str, what: str) -> str:
    if not _DOMAIN.match(value):
        raise FenceInputError(
            f"unsafe {what} {value!r}: letters, digits and _ . : / - only (at most 200)"
        )
    return f"'{value}'"


_FUNCTION = r"""
CREATE OR REPLACE FUNCTION fencedlease.guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  raw text := current_setting('fencedlease.token', true);
  tok bigint;
  acc bigint;
  d text;
  problem text;
  typ oid;
  coll oid;
  doms text[] := ARRAY[]::text[];
  tbl text := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
BEGIN
  IF raw IS NULL OR raw = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'FLT01', MESSAGE = format(
      'no_token: %s on %s needs a fencing token (SET LOCAL fencedlease.token = <token>)',
      TG_OP, tbl);
  END IF;
  -- One text per token (no sign, no leading zero, no blank, no exponent), then the int64
  -- range; two steps: SQL does not promise to evaluate OR left to right (no cast of non-digits).
  IF raw !~ '^[1-9][0-9]{0,18}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'FLT02', MESSAGE = format(
      'invalid_token: fencedlease.token %L is not a positive 64-bit integer', raw);
  END IF;
  IF raw::numeric > 9223372036854775807 THEN
    RAISE EXCEPTION USING ERRCODE = 'FLT02', MESSAGE = format(
      'invalid_token: fencedlease.token %L is not a positive 64-bit integer', raw);
  END IF;
  tok := raw::bigint;
  IF TG_NARGS <> 3 OR TG_ARGV[0] NOT IN ('column', 'constant') OR TG_WHEN <> 'BEFORE'
     OR TG_LEVEL <> 'ROW' THEN
    RAISE EXCEPTION USING ERRCODE = 'FLD01', MESSAGE = format(
      'invalid_domain: the guard on %s was created with unknown arguments', tbl);
  END IF;
  IF TG_ARGV[0] = 'column' THEN
    -- The column's type is checked at every write, not only by the DDL (ALTER COLUMN TYPE).
    -- One catalog read when it is text, varchar, int2/4/8 or uuid (built-in OIDs, fixed) with
    -- the default, "C" or "POSIX" collation; else the whole check (domains, collations).
    SELECT a.atttypid, a.attcollation INTO typ, coll FROM pg_attribute a
     WHERE a.attrelid = TG_RELID AND a.attname = TG_ARGV[1]::name AND a.attnum > 0
       AND NOT a.attisdropped;
    IF typ IS NULL OR typ NOT IN (25, 1043, 21, 23, 20, 2950) OR coll NOT IN (0, 100, 950, 951)
    THEN
      problem := fencedlease.domain_column_problem(TG_RELID, TG_ARGV[1]);
      IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FLD01', MESSAGE = 'invalid_domain: ' || problem;
      END IF;
    END IF;
    IF TG_OP <> 'INSERT' THEN doms := doms || (to_jsonb(OLD) ->> TG_ARGV[1]); END IF;
    IF TG_OP <> 'DELETE' THEN doms := doms || (to_jsonb(NEW) ->> TG_ARGV[1]); END IF;
  ELSE
    doms := ARRAY[TG_ARGV[1]];
  END IF;
  -- One order for every writer (no deadlock between two writers moving a row across domains).
  FOR d IN SELECT DISTINCT x FROM unnest(doms) AS x ORDER BY x LOOP
    IF d IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'FLT02', MESSAGE = format(
        'invalid_domain: %s on %s: the domain column %s is NULL', TG_OP, tbl, TG_ARGV[1]);
    END IF;
    d := TG_ARGV[2] || d;
    INSERT INTO fencedlease.fences (domain, accepted_fence) VALUES (d, 0)
      ON CONFLICT (domain) DO NOTHING;
    SELECT accepted_fence INTO acc FROM fencedlease.fences WHERE domain = d FOR UPDATE;
    IF tok < acc THEN
      RAISE EXCEPTION USING ERRCODE = 'FLS01', MESSAGE = format(
        'stale_fence: fence %s is below the accepted fence %s of domain %s (%s on %s)',
        tok, acc, d, TG_OP, tbl);
    ELSIF tok > acc THEN
      UPDATE fencedlease.fences SET accepted_fence = tok, updated_at = now() WHERE domain = d;
    END IF;
  END LOOP;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END
$fn$"""

_DOMAIN_TYPES = ("text", "varchar", "int2", "int4", "int8", "uuid")
"""Types whose text (``to_jsonb``) is one value per equal key, with a deterministic collation:
the mark of a domain is found by that text, so two equal keys must never have two texts
(``numeric`` 1 = 1.0, ``citext``, floats' -0 = 0, ``timestamptz`` shown in the session's time
zone, ``interval`` '1 day' = '24 hours', ``bytea`` as ``bytea_output`` says ...)."""

_COLUMN_CHECK = r"""
CREATE OR REPLACE FUNCTION fencedlease.domain_column_problem(rel oid, col text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  typ oid;
  coll oid;
  base oid;
  kind "char";
  under oid;
BEGIN
  SELECT a.atttypid, a.attcollation INTO typ, coll FROM pg_attribute a
   WHERE a.attrelid = rel AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped;
  IF typ IS NULL THEN
    RETURN format('%s has no domain column %I', rel::regclass, col);
  END IF;
  base := typ;
  LOOP  -- a domain over a domain over ... : its base type decides
    SELECT t.typtype, t.typbasetype INTO kind, under FROM pg_type t WHERE t.oid = base;
    EXIT WHEN kind IS DISTINCT FROM 'd';
    base := under;
  END LOOP;
  IF NOT base = ANY (ARRAY[@TYPES@]::regtype[]::oid[]) THEN
    RETURN format('the domain column %I of %s is of type %s, whose text is not one value per '
      'equal key (numeric 1 = 1.0; citext, float, timestamptz and interval alike): use a '
      'text, varchar, smallint, integer, bigint or uuid column (or a domain over one)',
      col, rel::regclass, format_type(typ, NULL));
  END IF;
  IF coll <> 0 AND NOT (SELECT c.collisdeterministic FROM pg_collation c WHERE c.oid = coll)
  THEN
    RETURN format('the domain column %I of %s has the nondeterministic collation %s '
      '(unequal texts compare equal): use a deterministic collation', col, rel::regclass,
      (SELECT c.collname FROM pg_collation c WHERE c.oid = coll));
  END IF;
  RETURN NULL;
END
$fn$""".replace("@TYPES@", ", ".join(f"'{t}'" for t in _DOMAIN_TYPES))

_TRUNCATE = r"""
CREATE OR REPLACE FUNCTION fencedlease.refuse_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  RAISE EXCEPTION USING ERRCODE = 'FLX01', MESSAGE = format(
    'truncate_refused: %I.%I is fenced: delete rows with a fencing token instead',
    TG_TABLE_SCHEMA, TG_TABLE_NAME);
END
$fn$"""


def _column_check(table: str, column: str) -> str:
    """Refuse a domain column whose text is not one value per equal key (docs/fences.md)."""
    return f"""DO $check$
DECLARE
  problem text := {GUARD_SCHEMA}.domain_column_problem('{table}'::regclass, '{column}');
BEGIN
  IF problem IS NOT NULL THEN
    RAISE EXCEPTION USING MESSAGE = 'fencedlease: ' || problem;
  END IF;
END $check$"""


def _writer_check(table: str, tag: str, schema: str, writers: Sequence[str]) -> str:
    """Refuse a writer role that could switch the guard off or move a mark: a superuser, a
    member (directly or through other roles) of a superuser or of a role owning the table, its
    schema, the marks, the guard's schema or function; or, before PostgreSQL 16, one with
    ``CREATEROLE`` (it can grant itself any of those roles)."""
    names = ", ".join(f"'{w}'" for w in writers)
    return f"""DO $check$
DECLARE
  w text;
  o oid;
  what text;
  sup text;
BEGIN
  FOR w IN SELECT r.rolname FROM pg_roles r WHERE r.rolname IN ({names}) ORDER BY 1 LOOP
    IF (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = w) THEN
      RAISE EXCEPTION USING MESSAGE = format('fencedlease: the writer role %I is a superuser: '
        'it could switch the guard of {tag} off; choose another writer role', w);
    END IF;
    SELECT s.rolname INTO sup FROM pg_roles s
     WHERE s.rolsuper AND pg_has_role(w, s.oid, 'MEMBER') LIMIT 1;
    IF sup IS NOT NULL THEN
      RAISE EXCEPTION USING MESSAGE = format('fencedlease: the writer role %I is a member of '
        'the superuser role %I: it could switch the guard of {tag} off; revoke that membership '
        'or choose another writer role', w, sup);
    END IF;
    FOR o, what IN
      SELECT c.relowner, 'the table {tag}' FROM pg_class c WHERE c.oid = '{table}'::regclass
      UNION ALL SELECT n.nspowner, 'the schema {schema}' FROM pg_namespace n
       WHERE n.nspname = '{schema}'
      UNION ALL SELECT c.relowner, 'the fence marks {GUARD_SCHEMA}.fences' FROM pg_class c
       WHERE c.oid = '{GUARD_SCHEMA}.fences'::regclass
      UNION ALL SELECT n.nspowner, 'the schema {GUARD_SCHEMA}' FROM pg_namespace n
       WHERE n.nspname = '{GUARD_SCHEMA}'
      UNION ALL SELECT p.proowner, 'the function {GUARD_SCHEMA}.guard()' FROM pg_proc p
       WHERE p.oid = '{GUARD_SCHEMA}.guard()'::regprocedure
    LOOP
      IF w = o::regrole::text THEN
        RAISE EXCEPTION USING MESSAGE = format('fencedlease: the writer role %I owns %s: it '
          'could switch the guard of {tag} off; give %s to another role or choose another '
          'writer role', w, what, what);
      ELSIF pg_has_role(w, o, 'MEMBER') THEN
        RAISE EXCEPTION USING MESSAGE = format('fencedlease: the writer role %I is a member '
          '(directly or through other roles) of %I, the owner of %s: it could switch the guard '
          'of {tag} off; revoke that membership or choose another writer role', w,
          o::regrole::text, what);
      END IF;
    END LOOP;
    IF current_setting('server_version_num')::int < 160000
       AND (SELECT r.rolcreaterole FROM pg_roles r WHERE r.rolname = w) THEN
      RAISE EXCEPTION USING MESSAGE = format('fencedlease: the writer role %I has CREATEROLE: '
        'before PostgreSQL 16 it can grant itself the owner''s role of {tag}; choose another '
        'writer role', w);
    END IF;
  END LOOP;
END $check$"""


@dataclass(frozen=True)
class GuardSpec:
    """What ``fencedlease sql ddl`` installs on one table."""

    table: str
    schema: str = "public"
    domain_column: str | None = None
    domain: str | None = None
    domain_prefix: str = ""
    writers: Sequence[str] = ()


def guard_ddl(spec: GuardSpec) -> list[str]:
    """The statements that install the guard on ``spec.table`` (idempotent: run them again to
    add writers or re-create the function).  :class:`FenceInputError` for unsafe names."""
    table = f"{ident(spec.schema, 'schema')}.{ident(spec.table, 'table')}"
    if (spec.domain_column is None) == (spec.domain is None):
        raise FenceInputError("give exactly one of a domain column or a constant domain")
    if spec.domain_column is not None:
        ident(spec.domain_column, "domain column")
        args = f"'column', '{spec.domain_column}', {_literal(spec.domain_prefix, 'prefix')}"
    else:
        assert spec.domain is not None
        if not spec.domain:
            raise FenceInputError("the constant domain may not be empty")
        args = (
            f"'constant', {_literal(spec.domain, 'domain')}, "
            f"{_literal(spec.domain_prefix, 'prefix')}"
        )
    writers = [ident(w, "role") for w in spec.writers]
    tag = f"{spec.schema}.{spec.table}"
    statements = [
        f"CREATE SCHEMA IF NOT EXISTS {GUARD_SCHEMA}",
        f"REVOKE ALL ON SCHEMA {GUARD_SCHEMA} FROM PUBLIC",
        f"""CREATE TABLE IF NOT EXISTS {GUARD_SCHEMA}.fences (
    domain         TEXT PRIMARY KEY,
    accepted_fence BIGINT NOT NULL CHECK (accepted_fence >= 0),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
)""",
        f"REVOKE ALL ON {GUARD_SCHEMA}.fences FROM PUBLIC",
        _COLUMN_CHECK.strip(),
        f"REVOKE ALL ON FUNCTION {GUARD_SCHEMA}.domain_column_problem(oid, text) FROM PUBLIC",
        _FUNCTION.strip(),
        f"REVOKE ALL ON FUNCTION {GUARD_SCHEMA}.guard() FROM PUBLIC",
        _TRUNCATE.strip(),
    ]
    if spec.domain_column is not None:
        statements.append(_column_check(table, spec.domain_column))
    statements += [
        f"DROP TRIGGER IF EXISTS fencedlease_guard ON {table}",
        f"CREATE TRIGGER fencedlease_guard BEFORE INSERT OR UPDATE OR DELETE ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION {GUARD_SCHEMA}.guard({args})",
        f"DROP TRIGGER IF EXISTS fencedlease_no_truncate ON {table}",
        f"CREATE TRIGGER fencedlease_no_truncate BEFORE TRUNCATE ON {table} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {GUARD_SCHEMA}.refuse_truncate()",
    ]
    if writers:
        statements.append(_writer_check(table, tag, spec.schema, spec.writers))
    for role in writers:
        statements += [
            f"GRANT USAGE ON SCHEMA {ident(spec.schema, 'schema')} TO {role}",
            f"GRANT USAGE ON SCHEMA {GUARD_SCHEMA} TO {role}",
            f"GRANT SELECT ON {GUARD_SCHEMA}.fences TO {role}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}",
            f"REVOKE TRUNCATE, TRIGGER, REFERENCES ON {table} FROM {role}",
        ]
    return statements


def install(conn: Any, spec: GuardSpec) -> None:
    """Run :func:`guard_ddl` on a psycopg connection, in one transaction (committed here)."""
    statements = guard_ddl(spec)
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)


def set_token(conn: Any, token: object) -> int:
    """Set this transaction's fencing token (``SET LOCAL fencedlease.token``); the checked
    token.  Call it inside the transaction that writes the fenced tables."""
    checked = check_token(token)
    conn.execute("SELECT set_config(%s, %s, true)", (SETTING, str(checked)))
    return checked


def result_of_error(exc: BaseException, token: int) -> FenceResult | None:
    """The guard's refusal as a result (``None``: not the guard's error)."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    message = str(getattr(diag, "message_primary", None) or exc).strip()
    if sqlstate == SQLSTATE_STALE:
        return StaleFence(token, message)
    if sqlstate in (SQLSTATE_NO_TOKEN, SQLSTATE_BAD_TOKEN, SQLSTATE_BAD_DOMAIN):
        return Rejected("invalid", message)
    if sqlstate == SQLSTATE_TRUNCATE:
        return Rejected("forbidden", message)
    return None


@contextmanager
def fenced(conn: Any, token: object) -> Iterator[None]:
    """``with fenced(conn, 42): conn.execute("UPDATE ...")``: a savepoint with the token set.

    A refusal by the guard rolls the savepoint back and raises the driver's error; use
    :func:`write` for a result value instead."""
    with conn.transaction():
        set_token(conn, token)
        yield


def write(conn: Any, token: object, sql: Any, params: Any = None) -> FenceResult:
    """Run one statement on guarded tables under ``token`` (in a savepoint of the caller's
    transaction) and say what happened: ``Applied`` (``version`` = rows changed), or the
    guard's ``StaleFence`` / ``Rejected``; nothing is changed by a refused write."""
    import psycopg

    checked = check_token(token)
    try:
        with fenced(conn, checked):
            cur = conn.execute(sql, params)
            rows = cur.rowcount
    except psycopg.Error as exc:
        result = result_of_error(exc, checked)
        if result is None:
            raise
        return result
    return Applied(checked, None, None, str(rows), f"applied: {rows} row(s) at fence {checked}")


def publish_guarded(
    conn: Any,
    catalog: Any,
    resource_id: str,
    token: object,
    object_key: str | None,
    *,
    operation_id: str | None = None,
    expected_version: int | None = None,
    strict: bool = False,
) -> FenceResult:
    """:meth:`SqlFence.publish <fencedlease.client.SqlFence.publish>` on a catalog the guard
    protects: the token is set for the transaction, and the guard's refusal (a stale token seen
    by the trigger before the helper's own check) is a result, not an exception.  Runs in a
    savepoint of the caller's transaction (or its own transaction, committed, in autocommit)."""
    import psycopg

    checked = check_token(token)
    try:
        with fenced(conn, checked):
            result: FenceResult = catalog.publish(
                conn,
                resource_id,
                checked,
                object_key,
                operation_id=operation_id,
                expected_version=expected_version,
                strict=strict,
            )
            return result
    except psycopg.Error as exc:
        refused = result_of_error(exc, checked)
        if refused is None:
            raise
        return refused
