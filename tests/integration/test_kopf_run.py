"""``kopf run -m fencedlease.kopfapp``: the operator as someone used to Kopf runs it, through
the real control plane. Kopf's own CLI hosts the same handlers as ``fencedlease run``
(settings from the environment); a lease is granted, Kopf leaves no trace on it, and a
SIGTERM resigns the election before the controller stops (docs/design.md, "What is Kopf's and
what is ours")."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port

from ..fence_servers import http_ok
from .k8s import apply, get, lease, ready_pods, wait_held


def test_kopf_run_with_the_module_grants_and_resigns_on_sigterm(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    health = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "FENCEDLEASE_ETCD_ENDPOINTS": cluster.etcd_endpoint,
        "FENCEDLEASE_ROLE": "controller",
        "FENCEDLEASE_NAMESPACE": namespace,
        "FENCEDLEASE_HEALTH_PORT": str(health),
        "FENCEDLEASE_METRICS_PORT": "0",
    }
    kopf = str(Path(sys.executable).parent / "kopf")
    argv = [kopf, "run", "-m", "fencedlease.kopfapp", "--standalone", "-n", namespace]
    proc = ManagedProcess("kopf-run", argv, tmp_path / "kopf-run.log", env=env)
    ready_pods(cluster, namespace, "w-a")
    apply(cluster, lease("kr", namespace, duration=20))
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"http://127.0.0.1:{health}/readyz"):
            assert proc.alive() and time.monotonic() < deadline, proc.log_tail(60)
            time.sleep(0.2)
        status = wait_held(cluster, "kr", namespace)
        assert status["holder"] == "w-a"
        meta = (get(cluster, "fl", "kr", namespace) or {}).get("metadata") or {}
        assert meta.get("finalizers") == ["fencedlease.io/finalizer"], meta  # ours only
        assert not [k for k in meta.get("annotations") or {} if "kopf" in k], meta
        assert proc.proc is not None
        proc.proc.terminate()  # SIGTERM
        assert proc.proc.wait(30) == 0, proc.log_tail(60)
        log = proc.log_tail(200)
        assert log.index("released Lease") < log.index("controller stopping"), log
    finally:
        proc.stop()
