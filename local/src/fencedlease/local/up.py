"""``fencedlease local up`` / ``local down``: the embedded default's process management.

``up`` runs the local control plane (:mod:`fencedlease.local.cluster`) and the operator in the
foreground, or with ``detach`` re-executes itself in a new session and returns once it is ready.
The state directory holds a pid file and a ready file (the banner), so ``down`` finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fencedlease.local.binaries import BuildError
from fencedlease.local.cluster import ClusterError, LocalCluster, free_port
from fencedlease.settings import Settings, WebhookRegistration

if TYPE_CHECKING:
    from fencedlease.local.node import NodeCluster


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


def local_up(
    state_dir: Path, *, detach: bool, verbose: bool, node: bool = False, operator: bool = True
) -> int:
    """Start the local control plane and the operator (``detach``: in the background).

    ``node`` adds a real node (:mod:`fencedlease.local.node`); ``operator=False`` leaves the
    operator out (to install it with the Helm chart instead).
    """
    state_dir = state_dir.resolve()
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
    flags = (["--node"] if node else []) + ([] if operator else ["--no-operator"])
    if detach:
        return _detach(state_dir, verbose, flags)
    return _local_up_foreground(state_dir, node=node, operator=operator)


def _detach(state_dir: Path, verbose: bool, flags: list[str]) -> int:
    log_path = state_dir / "logs" / "local-up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "fencedlease", "local", "up", "--state-dir", str(state_dir)]
    argv += flags
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


def _local_up_foreground(state_dir: Path, *, node: bool, operator: bool) -> int:
    from fencedlease.kopfapp import run_operator

    _pid_file(state_dir).write_text(str(os.getpid()))
    cluster: LocalCluster | NodeCluster | None = None
    stop = asyncio.Event()

    def progress(msg: str) -> None:
        print(f"[local up] {msg}", file=sys.stderr, flush=True)

    try:
        try:
            if node:
                from fencedlease.local.node import NodeCluster

                cluster = NodeCluster(state_dir)
            else:
                cluster = LocalCluster(state_dir)
            cluster.start(progress)
        except (ClusterError, BuildError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if not operator:
            return _serve_without_operator(state_dir, cluster)
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
                # A local sandbox: its admin (kubectl with the printed kubeconfig) may publish
                # by hand. Installed clusters allow only holder Pods unless told otherwise.
                "allowed_writers": os.environ.get(
                    "FENCEDLEASE_ALLOWED_WRITERS", "group:system:masters"
                ),
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
        if cluster is not None:
            progress("stopping")
            cluster.stop()
        _ready_file(state_dir).unlink(missing_ok=True)
        _pid_file(state_dir).unlink(missing_ok=True)


def _serve_without_operator(state_dir: Path, cluster: LocalCluster | NodeCluster) -> int:
    """Keep the cluster up until SIGINT/SIGTERM, with no operator (the chart brings one)."""
    banner = (
        f"fencedlease's local cluster is ready (no operator: install it with the chart).\n"
        f"  kubeconfig: {cluster.kubeconfig}\n"
        f"  stop:       fencedlease local down --state-dir {state_dir}\n"
    )
    _ready_file(state_dir).write_text(banner)
    print(banner, flush=True)
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    stopped.wait()
    return 0


def local_down(state_dir: Path) -> int:
    """Stop what ``local up`` started from ``state_dir`` (its data stays)."""
    state_dir = state_dir.resolve()
    pid = _read_pid(state_dir)
    if pid is None:
        _pid_file(state_dir).unlink(missing_ok=True)
        if _teardown_node(state_dir):
            return 1
        print(f"nothing runs from {state_dir}")
        return 0
    os.kill(pid, signal.SIGTERM)
    # A node drains its Pods before it stops; the control plane alone stops in seconds.
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and _pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        print(f"local up (pid {pid}) did not stop in 150s; killed it", file=sys.stderr)
    _ready_file(state_dir).unlink(missing_ok=True)
    _pid_file(state_dir).unlink(missing_ok=True)
    if _teardown_node(state_dir):
        return 1
    print(f"stopped the local control plane of {state_dir} (data kept)")
    return 0


def _teardown_node(state_dir: Path) -> list[str]:
    """A node whose ``local up`` did not finish its own teardown: finish it. Returns leftovers."""
    from fencedlease.local.node import RECORD, teardown

    if not (state_dir / RECORD).exists():
        return []
    print("cleaning up after the node (local up did not finish its teardown)", file=sys.stderr)
    left = teardown(state_dir, lambda msg: print(msg, file=sys.stderr))
    for item in left:
        print(f"error: left behind: {item}", file=sys.stderr)
    return left
