"""``fencedlease token`` and ``fencedlease publish``: the client for shell workers.

Exit codes (docs/client.md), one per outcome:

====  =======================================  ==========================================
code  ``fencedlease token``                    ``fencedlease publish``
====  =======================================  ==========================================
0     held                                     applied
1     error (unreadable grant, bad config)     error (bad config, no API access)
2     usage                                    usage
3     absent (no grant files, or empty)        absent: no grant to take the token from
4     lost                                     --
5     expired (``valid-until`` passed)         --
10    --                                       duplicate (already applied: success)
11    --                                       stale_fence (stop; never retry this grant)
12    --                                       rejected (unknown_token, lease_mismatch,
                                               holder_mismatch, invalid, conflict, ...)
13    --                                       unavailable (after bounded retries)
====  =======================================  ==========================================

``fencedlease release``: 0 released (also ``--rejoin``: the release was deleted), 1 error,
2 usage, 3 absent (no grant to name), 12 rejected by the webhook (``holder_mismatch``,
``unknown_token``, ``lease_mismatch``, ``forbidden``, ``invalid``), 13 unavailable, 14 refused
(the generation is not current: nothing changed), 15 pending (the operator did not answer
within ``--wait``; it will act on the request).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fencedlease.client.cli_common import (
    EXIT_ABSENT,
    EXIT_REJECTED,
    EXIT_USAGE,
    RESULT_EXIT,
    STATE_EXIT,
    Parser,
    add_cluster_arguments,
    attempts_arg,
    default_dir,
    err,
    grant_or_exit,
    named,
    seconds_arg,
    token_arg,
    with_kube,
)
from fencedlease.client.contract import DEFAULT_DIR
from fencedlease.client.grant import GrantState
from fencedlease.client.release_cli import add_release_arguments, cmd_release

if TYPE_CHECKING:
    from fencedlease.client.api import KubeClient
    from fencedlease.client.results import PublishResult


def add_token_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "token",
        help="print the grant from the downward-API files; exit code: held/lost/expired/absent",
        description="Print the grant in the downward-API directory. Exit code: 0 held, "
        "3 absent, 4 lost, 5 expired (docs/client.md).",
    )
    p.add_argument("--dir", default=None, help=f"grant directory (default: {DEFAULT_DIR})")
    p.add_argument("--lease", help="the FencedLease name (shown; the files do not carry it)")
    p.add_argument(
        "--require-held",
        action="store_true",
        help="print only the token, and only when held (else nothing on stdout, why on stderr)",
    )
    p.add_argument(
        "--min-remaining",
        type=seconds_arg,
        default=0.0,
        metavar="SECONDS",
        help="count as expired unless at least this much validity is left",
    )
    p.add_argument("--json", action="store_true", help="print the grant as JSON")
    return p


def add_publish_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "publish",
        help="publish a FencedArtifact with the token from the grant files; one exit code "
        "per result",
        description="Point FencedArtifact ARTIFACT at OBJECT_REF with the fencing token from "
        "the grant files. Exit code: 0 applied, 10 duplicate, 11 stale_fence, 12 rejected, "
        "13 unavailable, 3 no grant (docs/client.md). The result is printed on stderr.",
    )
    p.add_argument(
        "artifact", metavar="ARTIFACT", type=named("FencedArtifact"), help="FencedArtifact name"
    )
    p.add_argument(
        "--lease", required=True, type=named("FencedLease"), help="the FencedLease (fencing domain)"
    )
    p.add_argument("--object-ref", required=True, help="the immutable object key to make visible")
    p.add_argument("--operation-id", help="idempotency key of this publish (default: random)")
    p.add_argument("--dir", default=None, help=f"grant directory (default: {DEFAULT_DIR})")
    add_cluster_arguments(p)
    p.add_argument(
        "--token",
        type=token_arg,
        help="publish with this token instead of the grant files' (scripts, tests)",
    )
    p.add_argument(
        "--expected-version",
        help="the artifact resourceVersion this publish was prepared against "
        "(a mismatch is rejected: conflict)",
    )
    p.add_argument(
        "--attempts", type=attempts_arg, default=5, help="tries for transient failures (1-100)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


Runner = Callable[[argparse.Namespace], int]
"""Runs one parsed command; returns the exit code."""
Register = Callable[[Any], Mapping[str, Runner]]
"""Adds commands to the ``fencedlease`` subparsers; returns a runner per command name."""

OPERATOR_COMMANDS = {"run": "fencedlease", "etcd": "fencedlease", "local": "fencedlease-local"}
"""The commands other distributions add, and which one (named when it is not installed)."""

COMMANDS_GROUP = "fencedlease.commands"
"""Entry-point group through which other distributions add ``fencedlease`` commands: the
operator (``fencedlease``) adds ``run`` and ``local``.  Each entry point is a
:data:`Register`."""


def installed_commands() -> list[Register]:
    """The :data:`Register` functions of the installed distributions (entry points of
    :data:`COMMANDS_GROUP`)."""
    from fencedlease.client._compat import entry_points_of

    found: list[Register] = []
    for entry in sorted(entry_points_of(COMMANDS_GROUP), key=lambda e: e.name):
        try:
            found.append(entry.load())
        except ImportError as exc:  # a broken install of the other distribution
            err(f"warning: fencedlease commands from {entry.value} are unavailable: {exc}")
    return found


def build_parser(
    extensions: Sequence[Register] = (),
) -> tuple[argparse.ArgumentParser, dict[str, Runner]]:
    """The ``fencedlease`` parser: ``token`` and ``publish``, then each extension's commands."""
    parser = Parser(
        prog="fencedlease",
        description="Leases with fencing tokens from etcd revisions, enforced at the resource.",
        epilog=None
        if extensions
        else "run and etcd come with the operator (pip install fencedlease), local with "
        "fencedlease-local",
    )
    parser.add_argument("--version", action="version", version=f"fencedlease {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_token_parser(sub)
    add_publish_parser(sub)
    from fencedlease.client.fences import cli as fences_cli  # sql ddl: docs/fences.md

    fences_cli.add_sql_parser(sub)
    add_release_parser(sub)
    runners: dict[str, Runner] = {
        "token": cmd_token,
        "publish": cmd_publish,
        "sql": fences_cli.run_sql,
        "release": cmd_release,
    }
    seen: set[Register] = set()
    for register in extensions:
        if register not in seen:
            seen.add(register)
            runners.update(register(sub))
    return parser, runners


def _version() -> str:
    from fencedlease.client.version import client_version

    return client_version()


def add_release_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "release",
        help="give the lease back (the generation in the grant files); one exit code per result",
        description="End this Pod's generation of LEASE (lease id and token from the grant "
        "files) so the next candidate is granted at once. Exit code: 0 released, 14 not "
        "current (nothing changed), 15 pending, 12 rejected, 13 unavailable, 3 no grant "
        "(docs/client.md).",
    )
    add_release_arguments(p)
    return p


def cmd_token(args: argparse.Namespace) -> int:
    directory = args.dir or default_dir()
    grant = grant_or_exit(directory, args.lease)
    if isinstance(grant, int):
        if grant == EXIT_ABSENT and args.json and not args.require_held:
            print(json.dumps({"status": "absent", "source": str(directory)}))
        return grant
    status = grant.status()
    if status is GrantState.HELD and grant.remaining() < args.min_remaining:
        status = GrantState.EXPIRED
    if args.require_held:
        if status is not GrantState.HELD:
            err(
                f"{status.value}: grant {grant.lease_id} (token {grant.token}) is not held "
                f"({grant.remaining():.1f}s left, state {grant.state})"
            )
        else:
            print(grant.token)
        return STATE_EXIT[status]
    data = grant.as_dict()
    data["status"] = status.value
    if args.json:
        print(json.dumps(data))
    else:
        for key in ("lease", "token", "leaseId", "validUntil", "state", "status"):
            if data.get(key) is not None:
                print(f"{key}={data[key]}")
        print(f"remainingSeconds={data['remainingSeconds']}")
    return STATE_EXIT[status]


def cmd_publish(args: argparse.Namespace) -> int:
    from fencedlease.client.publish import Publisher, RetryPolicy

    artifact, lease = args.artifact, args.lease  # checked by their argparse types
    token = args.token
    grant = None
    if token is None:
        found = grant_or_exit(args.dir or default_dir(), args.lease, ": nothing to publish with")
        if isinstance(found, int):
            return found
        grant, token = found, found.token

    def publish(kube: KubeClient, namespace: str) -> PublishResult:
        return Publisher(kube, retry=RetryPolicy(attempts=args.attempts)).publish(
            artifact,
            lease=lease,
            token=token,
            object_ref=args.object_ref,
            operation_id=args.operation_id,
            namespace=namespace,
            expected_version=args.expected_version,
        )

    result = with_kube(args, publish)
    if isinstance(result, int):
        return result
    err(result.message if grant is None else f"{result.message} [grant {grant.lease_id}]")
    if args.json:
        out: dict[str, Any] = {"result": result.code, "token": token, "message": result.message}
        if grant is not None:
            out["leaseId"] = grant.lease_id
        version = getattr(result, "version", None)
        if version:
            out["resourceVersion"] = version
        print(json.dumps(out))
    return RESULT_EXIT.get(result.code, EXIT_REJECTED)


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``token`` / ``publish`` command."""
    try:
        if args.command == "token":
            return cmd_token(args)
        if args.command == "release":
            return cmd_release(args)
        return cmd_publish(args)
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None, extensions: Sequence[Register] | None = None) -> int:
    """The ``fencedlease`` command: the client's commands, and those of every installed
    distribution that registers some (``extensions``: these instead of the entry points)."""
    parser, runners = build_parser(installed_commands() if extensions is None else extensions)
    words = sys.argv[1:] if argv is None else argv
    if words and words[0] in OPERATOR_COMMANDS and words[0] not in runners:
        dist = OPERATOR_COMMANDS[words[0]]
        err(f"error: 'fencedlease {words[0]}' comes with {dist}: pip install {dist}")
        return EXIT_USAGE
    args = parser.parse_args(argv)
    try:
        return runners[args.command](args)
    except KeyboardInterrupt:
        return 130
