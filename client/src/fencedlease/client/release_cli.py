"""``fencedlease release LEASE``: give the lease back from a shell worker (exit codes in
:mod:`fencedlease.client.cli` and docs/client.md)."""

from __future__ import annotations

import argparse
import json
import os

from fencedlease.client.api import KubeClient
from fencedlease.client.cli_common import (
    EXIT_ERROR,
    EXIT_NOT_CURRENT,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_REJECTED,
    EXIT_UNAVAILABLE,
    add_cluster_arguments,
    err,
    grant_or_exit,
    lease_id_arg,
    named,
    seconds_arg,
    token_arg,
    with_kube,
)
from fencedlease.client.contract import DEFAULT_DIR
from fencedlease.client.release import (
    Released,
    ReleasePending,
    Releaser,
    ReleaseRefused,
    ReleaseResult,
)


def add_release_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "lease", metavar="LEASE", type=named("FencedLease"), help="the FencedLease to give back"
    )
    p.add_argument("--dir", default=None, help=f"grant directory (default: {DEFAULT_DIR})")
    p.add_argument(
        "--lease-id", type=lease_id_arg, help="the generation to end (default: the grant files')"
    )
    p.add_argument("--token", type=token_arg, help="its token (default: the grant files')")
    p.add_argument("--pod", help="this Pod's name (default: POD_NAME, else HOSTNAME)")
    p.add_argument("--pod-uid", help="this Pod's UID (default: POD_UID, else read the Pod)")
    add_cluster_arguments(p)
    p.add_argument(
        "--wait",
        type=seconds_arg,
        default=30.0,
        metavar="SECONDS",
        help="wait this long for the operator's answer (0: exit 15 pending at once)",
    )
    p.add_argument(
        "--rejoin",
        action="store_true",
        help="ask for LEASE again: delete this Pod's release of generation --lease-id",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def cmd_release(args: argparse.Namespace) -> int:
    lease_id, token = args.lease_id, args.token
    if lease_id is None or (token is None and not args.rejoin):
        directory = args.dir or os.environ.get("FENCEDLEASE_DIR") or DEFAULT_DIR
        grant = grant_or_exit(directory, args.lease, ": no generation to release")
        if isinstance(grant, int):
            return grant
        lease_id = lease_id or grant.lease_id
        token = grant.token if token is None else token

    def release(kube: KubeClient, namespace: str) -> ReleaseResult | int:
        releaser = Releaser(kube, pod_uid=args.pod_uid)
        if args.rejoin:
            existed = releaser.rejoin(args.lease, lease_id, namespace=namespace)
            err(
                f"rejoined: lease {args.lease} may be granted to this Pod again"
                + ("" if existed else " (no release of generation " + lease_id + " existed)")
            )
            return EXIT_OK
        return releaser.release(
            args.lease,
            lease_id=lease_id,
            token=token,
            pod=args.pod,
            namespace=namespace,
            wait=args.wait,
        )

    result = with_kube(args, release)
    if not isinstance(result, int):
        err(result.message)
    if args.json and not isinstance(result, int):
        print(json.dumps({"result": result.code, "leaseId": lease_id, "token": token}))
    if isinstance(result, int):
        return result
    return _exit_code(result)


def _exit_code(result: ReleaseResult) -> int:
    """The exit code of a release's result (docs/client.md)."""
    if isinstance(result, Released):
        return EXIT_OK
    if isinstance(result, ReleasePending):
        return EXIT_PENDING
    if isinstance(result, ReleaseRefused):
        return {"not_current": EXIT_NOT_CURRENT, "not_installed": EXIT_ERROR}.get(
            result.reason, EXIT_REJECTED
        )
    return EXIT_UNAVAILABLE
