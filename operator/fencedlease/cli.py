"""The ``fencedlease`` command line: ``run``, ``local up``, ``local down``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fencedlease import __version__
from fencedlease.binaries import BuildError
from fencedlease.settings import Role, Settings, WebhookRegistration

log = logging.getLogger("fencedlease")


def default_state_dir() -> Path:
    env = os.environ.get("FENCEDLEASE_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fencedlease" / "local"


def _add_operator_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operator (each flag also reads FENCEDLEASE_<NAME> from the env)")
    g.add_argument("--role", choices=[r.value for r in Role])
    g.add_argument("--namespace", help="watch only this namespace (default: all)")
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
    g.add_argument("--priority", type=int)
    g.add_argument("-v", "--verbose", action="store_true", help="debug logging")


_SETTING_FLAGS = (
    "role",
    "namespace",
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
    "priority",
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
    up.add_argument("-v", "--verbose", action="store_true")
    down = lsub.add_parser("down", help="stop what 'local up' started")
    down.add_argument("--state-dir", type=Path, default=None)
    from fencedlease.client import cli as client_cli  # token, publish: docs/client.md

    client_cli.add_token_parser(sub)
    client_cli.add_publish_parser(sub)
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
    from fencedlease.controller.app import run_operator
    from fencedlease.controller.kube import KubeConfigError

    settings = _settings_from_args(args)
    try:
        asyncio.run(run_operator(settings))
    except KubeConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _ready_file(state_dir: Path) -> Path:
    return state_dir / "ready"


def _pid_file(state_dir: Path) -> Path:
    return state_dir / "local-up.pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(state_dir: Path) -> int | None:
    try:
        pid = int(_pid_file(state_dir).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def cmd_local_up(args: argparse.Namespace) -> int:
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    running = _read_pid(state_dir)
    if running is not None:
        print(
            f"error: a local control plane already runs from {state_dir} (pid {running}); "
            f"stop it with 'fencedlease local down --state-dir {state_dir}'",
            file=sys.stderr,
        )
        return 1
    _ready_file(state_dir).unlink(missing_ok=True)
    if args.detach:
        return _detach(state_dir, args.verbose)
    return _local_up_foreground(state_dir, args.verbose)


def _detach(state_dir: Path, verbose: bool) -> int:
    log_path = state_dir / "logs" / "local-up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "fencedlease", "local", "up", "--state-dir", str(state_dir)]
    if verbose:
        argv.append("--verbose")
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(f"starting in the background (log: {log_path}) ...", file=sys.stderr)
    deadline = time.monotonic() + 1800  # the first run may build kube-apiserver from source
    while time.monotonic() < deadline:
        if _ready_file(state_dir).exists():
            print(_ready_file(state_dir).read_text(), end="")
            return 0
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-30:]
            print(
                "error: local up exited before it was ready:\n" + "\n".join(tail), file=sys.stderr
            )
            return 1
        time.sleep(0.5)
    proc.terminate()
    print("error: local up was not ready in time; see " + str(log_path), file=sys.stderr)
    return 1


def _local_up_foreground(state_dir: Path, verbose: bool) -> int:
    from fencedlease.controller.app import run_operator
    from fencedlease.localcluster import ClusterError, LocalCluster, free_port

    _setup_logging(verbose)
    _pid_file(state_dir).write_text(str(os.getpid()))
    cluster = LocalCluster(state_dir)
    stop = asyncio.Event()

    def progress(msg: str) -> None:
        print(f"[local up] {msg}", file=sys.stderr, flush=True)

    try:
        try:
            cluster.start(progress)
        except (ClusterError, BuildError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        settings = Settings.from_env(
            {
                "etcd_endpoints": [cluster.etcd_endpoint],
                "webhook_registration": WebhookRegistration.URL,
                "webhook_port": free_port(),
                "webhook_host": "127.0.0.1",
                "webhook_cert_dir": state_dir / "webhook-pki",
                "metrics_port": free_port(),
                "health_port": free_port(),
            }
        )
        banner = (
            f"fencedlease is ready.\n"
            f"  kubeconfig: {cluster.kubeconfig}\n"
            f"  metrics:    http://127.0.0.1:{settings.metrics_port}/metrics\n"
            f"  try:        kubectl --kubeconfig {cluster.kubeconfig} get fencedleases -A\n"
            f"  stop:       fencedlease local down --state-dir {state_dir}\n"
        )

        def on_ready() -> None:
            _ready_file(state_dir).write_text(banner)
            print(banner, flush=True)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await run_operator(settings, stop_flag=stop, on_ready=on_ready)

        progress("starting the operator")
        asyncio.run(main())
        return 0
    finally:
        cluster.stop()
        _ready_file(state_dir).unlink(missing_ok=True)
        _pid_file(state_dir).unlink(missing_ok=True)


def cmd_local_down(args: argparse.Namespace) -> int:
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    pid = _read_pid(state_dir)
    if pid is None:
        print(f"nothing runs from {state_dir}")
        _pid_file(state_dir).unlink(missing_ok=True)
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        print(f"local up (pid {pid}) did not stop in 60s; killed it", file=sys.stderr)
    _ready_file(state_dir).unlink(missing_ok=True)
    _pid_file(state_dir).unlink(missing_ok=True)
    print(f"stopped the local control plane of {state_dir} (data kept)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("token", "publish"):
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
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
