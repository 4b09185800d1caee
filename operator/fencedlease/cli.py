"""The operator's ``fencedlease run``, added to the ``fencedlease`` command of
fencedlease-client (``token``, ``publish``); ``local up/down`` come with fencedlease-local."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

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


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``run`` and ``etcd`` to the ``fencedlease`` command of fencedlease-client (the
    entry point ``fencedlease.commands: operator`` in pyproject.toml; ``local`` comes with
    fencedlease-local)."""
    run = sub.add_parser(
        "run", help="run the operator against the current kubeconfig or in-cluster config"
    )
    _add_operator_flags(run)
    from fencedlease.etcdbackup import cli as etcd_cli  # backup, restore: docs/operations.md

    etcd_cli.add_parser(sub)
    return {"run": _run_operator_command, "etcd": etcd_cli.run}


def build_parser() -> argparse.ArgumentParser:
    """The whole ``fencedlease`` parser: the client's commands (token, publish) and ours."""
    from fencedlease.client import cli as client_cli  # token, publish: docs/client.md

    parser, _ = client_cli.build_parser([register])
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
    # Our own loggers say what matters (grants, losses, errors).
    for noisy in ("aiohttp.access", "kubernetes_asyncio", "grpc"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


def import_kopf() -> None:
    """Import Kopf without the synchronous ``kubernetes`` client's models.

    Kopf imports ``kubernetes.client`` whenever that package is installed, to recognise its
    model objects in ``kopf.adopt()`` and friends (an ``ImportError`` there means "not
    installed"; docs/design.md names Kopf's module). The operator never hands Kopf such an
    object, yet the import alone costs about 36 MiB of RSS; ``kubernetes`` is installed
    because fencedlease-client loads kubeconfigs with it. So ``fencedlease run`` imports Kopf
    first, with ``kubernetes`` marked absent for that one import (a ``None`` in
    ``sys.modules`` makes an import raise ``ImportError``), then unmarks it: a later import
    of ``kubernetes`` in this process works as usual. Nothing happens when Kopf or
    ``kubernetes`` is already imported. The operator's own registry has no fallback login
    through that client either (``fencedlease.kopfapp``).
    """
    if "kopf" in sys.modules or "kubernetes" in sys.modules:
        return
    sys.modules["kubernetes"] = None  # type: ignore[assignment]
    try:
        import kopf  # noqa: F401
    finally:
        del sys.modules["kubernetes"]


def cmd_run(args: argparse.Namespace) -> int:
    from fencedlease.app import loop_factory

    import_kopf()
    from fencedlease.kopfapp import run_operator  # Kopf hosts a process with a controller

    settings = _settings_from_args(args)
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings)) as runner:
            runner.run(run_operator(settings))
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _run_operator_command(args: argparse.Namespace) -> int:
    try:
        _setup_logging(args.verbose)
        return cmd_run(args)
    except ValidationError as exc:
        print_settings_errors(exc)
        return 2


def print_settings_errors(exc: ValidationError) -> None:
    """One line per invalid setting (never a traceback)."""
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        print(f"error: setting {loc}: {err['msg']}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m fencedlease``: the ``fencedlease`` command of fencedlease-client, with ours
    whether or not the entry point is installed (and fencedlease-local's when installed)."""
    from fencedlease.client import cli as client_cli

    return client_cli.main(argv, [*client_cli.installed_commands(), register])
