"""``fencedlease sql ddl``: print (or apply) the PostgreSQL guard of a fenced table.

Exit codes (docs/fences.md): 0 printed or applied, 1 the database refused or could not be
reached (one line on stderr), 2 usage (an unsafe identifier, a missing option).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fencedlease.client.fences.core import FenceInputError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def add_sql_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "sql",
        help="PostgreSQL that enforces the fence itself (docs/fences.md)",
        description="PostgreSQL that enforces the fence itself (docs/fences.md).",
    )
    ssub = p.add_subparsers(dest="sql_command", required=True)
    ddl = ssub.add_parser(
        "ddl",
        help="print the guard (trigger, security-definer function, grants) of a table",
        description="Print the SQL that installs the fencing guard on TABLE: every INSERT, "
        "UPDATE and DELETE needs `SET LOCAL fencedlease.token = N` and is refused below the "
        "domain's accepted fence, whoever runs it. With --apply, run it on --dsn instead. "
        "Exit code: 0 ok, 1 database error, 2 usage (docs/fences.md).",
    )
    ddl.add_argument("--table", required=True, help="the fenced table")
    ddl.add_argument("--schema", default="public", help="its schema (default: public)")
    domain = ddl.add_mutually_exclusive_group(required=True)
    domain.add_argument("--domain-column", help="the column naming each row's fencing domain")
    domain.add_argument("--domain", help="one fencing domain for the whole table")
    ddl.add_argument("--domain-prefix", default="", help="prefix of the domain names")
    ddl.add_argument(
        "--writer",
        action="append",
        default=[],
        metavar="ROLE",
        help="a role that may write the table through the guard (repeatable)",
    )
    ddl.add_argument("--apply", action="store_true", help="run it on --dsn (one transaction)")
    ddl.add_argument("--dsn", help="libpq connection string (with --apply)")
    return p


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_sql(args: argparse.Namespace) -> int:
    from fencedlease.client.fences.postgres import GuardSpec, guard_ddl, install

    spec = GuardSpec(
        table=args.table,
        schema=args.schema,
        domain_column=args.domain_column,
        domain=args.domain,
        domain_prefix=args.domain_prefix,
        writers=tuple(args.writer),
    )
    try:
        statements = guard_ddl(spec)
    except FenceInputError as exc:
        _err(f"error: {exc}")
        return EXIT_USAGE
    if not args.apply:
        try:
            print(";\n\n".join(statements) + ";", flush=True)
        except BrokenPipeError:  # `... | head`: the reader has what it wanted
            sys.stdout = None  # no second error at exit
        return EXIT_OK
    if not args.dsn:
        _err("error: --apply needs --dsn")
        return EXIT_USAGE
    try:
        import psycopg
    except ImportError:
        _err("error: --apply needs psycopg: pip install 'fencedlease-client[postgres]'")
        return EXIT_ERROR
    try:
        with psycopg.connect(args.dsn) as conn:
            install(conn, spec)
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _err(f"error: {first}")
        return EXIT_ERROR
    _err(f"installed the fencing guard on {args.schema}.{args.table}")
    return EXIT_OK
