"""The ``fencedlease`` command line: ``run``, ``local up``, ``local down``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fencedlease import __version__
from fencedlease.settings import Role, Settings, StartupError, WebhookRegistration

log = logging.getLogger("fencedlease")


def _add_operator_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operator (each flag also reads FENCEDLEASE_<NAME> from the env)")
    g.add_argument("--role", choices=[r.value for r in Role])
    g.add_argument("--namespace", help="watch only this namespace (default: all)")
    g.add_argument(
        "--pod-selector",
        help="label selector every candidate Pod carries: list and watch only those Pods "
        "(default: every Pod)",
    )
    g.add_argument("--etcd-endpoints", help="comma-separated etcd URLs")
    g.add_argument("--etcd-ca-file")
    g.add_argument("--etcd-cert-file")
    g.add_argument("--etcd-key-file")
    g.add_argument("--etcd-prefix")
    g.add_argument("--clock-skew-seconds", type=float)
    g.add_argument("--metrics-port", type=int)
    g.add_argument("--health-port", type=int)
    g.add_argument("--webhook-port", type=int)
    g.add_argument("--webhook-cert-dir")
    g.add_argument("--webhook-registration", choices=[r.value for r in WebhookRegistration])
    g.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="elect one writing controller replica through a coordination.k8s.io Lease "
        "(default: on; --no-leader-election only for a single replica)",
    )
    g.add_argument("--leader-election-namespace")
    g.add_argument("--leader-election-identity")
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")


_SETTING_FLAGS = (
    "role",
    "namespace",
    "pod_selector",
    "etcd_endpoints",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "etcd_prefix",
    "clock_skew_seconds",
    "metrics_port",
    "health_port",
    "webhook_port",
    "webhook_cert_dir",
    "webhook_registration",
    "leader_election",
    "leader_election_namespace",
    "leader_election_identity",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencedlease",
        description="Leases with fencing tokens from etcd revisions, enforced at the resource.",
    )
    parser.add_argument("--version", action="version", version=f"fencedlease {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run", help="run the operator against the current kubeconfig or in-cluster config"
    )
    _add_operator_flags(run)

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
    from fencedlease.client import cli as client_cli  # token, publish: docs/client.md

    client_cli.add_token_parser(sub)
    client_cli.add_publish_parser(sub)
    client_cli.add_release_parser(sub)
    return parser


def _settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    overrides = {name: getattr(args, name, None) for name in _SETTING_FLAGS}
    overrides.update(extra)
    return Settings.from_env(overrides)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line (``FENCEDLEASE_LOG_FORMAT=json``), for log pipelines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler()
    if os.environ.get("FENCEDLEASE_LOG_FORMAT", "plain") == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    # kopf.objects logs every handler success at INFO: one line per watch event, thousands a
    # minute with many leases. Our own loggers say what matters (grants, losses, errors).
    for noisy in ("aiohttp.access", "kubernetes_asyncio", "grpc", "kopf.objects"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def cmd_run(args: argparse.Namespace) -> int:
    from fencedlease.app import loop_factory, run_operator

    settings = _settings_from_args(args)
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
            runner.run(run_operator(settings))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_local_up(args: argparse.Namespace) -> int:
    # Imported here: `fencedlease run` never loads the local machinery.
    from fencedlease.local.up import default_state_dir, local_up

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
    from fencedlease.local.up import default_state_dir, local_down

    return local_down(args.state_dir or default_state_dir())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("token", "publish", "release"):
        from fencedlease.client import cli as client_cli

        return client_cli.run(args)
    try:
        if args.command == "run":
            _setup_logging(args.verbose)
            return cmd_run(args)
        if args.local_command == "up":
            return cmd_local_up(args)
        return cmd_local_down(args)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            print(f"error: setting {loc}: {err['msg']}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
