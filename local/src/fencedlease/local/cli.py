"""``fencedlease local up`` / ``local down``, added to the ``fencedlease`` command through the
entry point ``fencedlease.commands: local`` (local/pyproject.toml).

Light on purpose: every ``fencedlease`` invocation loads this module to build its parser, so the
machinery (binaries, cluster, node, up) is imported only when a ``local`` command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    local = sub.add_parser("local", help="the embedded default: a local control plane")
    lsub = local.add_subparsers(dest="local_command", required=True)
    up = lsub.add_parser("up", help="start local etcd + kube-apiserver + CRDs + webhook + operator")
    up.add_argument("--state-dir", type=Path, default=None, help="default: %(default)s")
    up.add_argument(
        "--detach", action="store_true", help="return once everything is ready; stop with 'down'"
    )
    up.add_argument(
        "--node",
        action="store_true",
        help="add a real node (root): containerd, kubelet, kube-proxy, CoreDNS, "
        "kube-controller-manager, kube-scheduler; Pods really run",
    )
    up.add_argument(
        "--no-operator",
        dest="operator",
        action="store_false",
        help="do not run the operator (install it with the Helm chart instead)",
    )
    up.add_argument("-v", "--verbose", action="store_true")
    down = lsub.add_parser("down", help="stop what 'local up' started")
    down.add_argument("--state-dir", type=Path, default=None)
    demo = lsub.add_parser(
        "demo",
        help="the article's race on a local control plane of its own, as a timeline: a frozen "
        "holder's write refused with stale_fence (exit 0 when it is)",
    )
    demo.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where the control plane lives (default: a temporary directory, removed after)",
    )
    return {"local": run}


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from fencedlease.cli import print_settings_errors

    try:
        if args.local_command == "up":
            return cmd_local_up(args)
        if args.local_command == "demo":
            from fencedlease.local.demo import run_demo

            return run_demo(args.state_dir)
        return cmd_local_down(args)
    except ValidationError as exc:
        print_settings_errors(exc)
        return 2


def cmd_local_up(args: argparse.Namespace) -> int:
    from fencedlease.cli import _setup_logging
    from fencedlease.local.cluster import default_state_dir
    from fencedlease.local.up import local_up

    if not args.detach:
        _setup_logging(args.verbose)
    return local_up(
        args.state_dir or default_state_dir(),
        detach=args.detach,
        verbose=args.verbose,
        node=args.node,
        operator=args.operator,
    )


def cmd_local_down(args: argparse.Namespace) -> int:
    from fencedlease.local.cluster import default_state_dir
    from fencedlease.local.up import local_down

    return local_down(args.state_dir or default_state_dir())
