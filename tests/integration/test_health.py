"""Health that means something, through the real control plane: an operator (controller and
webhook in one process, registered with the real kube-apiserver) whose own etcd goes away
turns not ready, then not live with the etcd reason once the bound passed, and comes back
when etcd does (docs/operations.md, "Health")."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fencedlease.local.cluster import EtcdServer, LocalCluster, free_port

from .k8s import running_fence, wait_for

LIVENESS_BOUND = 4.0
PROBE_EVERY = 0.5


def probe(port: int, path: str) -> tuple[int, dict[str, Any] | None]:
    """``(status, JSON reasons or None)`` of ``GET path``; status 0 if nothing answered."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except OSError:
        return 0, None


def verbose_health(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?verbose", timeout=2) as resp:
            found: dict[str, Any] = json.loads(resp.read())
            return found
    except urllib.error.HTTPError as error:
        failing: dict[str, Any] = json.loads(error.read())
        return failing


def _signal(etcd: EtcdServer, sig: signal.Signals) -> None:
    assert etcd.process is not None and etcd.process.proc is not None
    os.kill(etcd.process.proc.pid, sig)


def _break(etcd: EtcdServer, fault: str) -> None:
    if fault == "stopped":  # connections refused
        etcd.stop()
    else:  # frozen: connections accepted, nothing answered (only the gRPC deadline ends calls)
        _signal(etcd, signal.SIGSTOP)


def _heal(etcd: EtcdServer, fault: str) -> None:
    if fault == "stopped":
        etcd.start()  # same data and ports
    else:
        _signal(etcd, signal.SIGCONT)


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_etcd_lost_fails_readiness_then_liveness_and_both_recover(
    cluster: LocalCluster, namespace: str, tmp_path: Path, fault: str
) -> None:
    etcd = EtcdServer(tmp_path / "etcd", tmp_path / "etcd.log")
    etcd.start()
    health = free_port()
    env = {
        "FENCEDLEASE_ETCD_TIMEOUT_SECONDS": "1",
        "FENCEDLEASE_HEALTH_ETCD_PROBE_SECONDS": str(PROBE_EVERY),
        "FENCEDLEASE_HEALTH_ETCD_READINESS_SECONDS": "1",
        "FENCEDLEASE_HEALTH_ETCD_LIVENESS_SECONDS": str(LIVENESS_BOUND),
    }
    try:
        with running_fence(
            cluster, tmp_path, namespace, env=env, etcd_endpoint=etcd.endpoint, health_port=health
        ) as (proc, _):
            verbose = wait_for(
                lambda: (
                    (r := verbose_health(health))["watches"].keys()
                    >= {"fencedleases", "pods", "fencedartifacts"}
                    and r
                ),
                timeout=30,
                what="Kopf's watches to be observed",
            )
            assert verbose["status"] == "ok" and verbose["webhookServing"] is True, verbose
            assert set(verbose["schedulers"]) == {"leases", "artifacts"}, verbose
            # Idle, but the probe keeps reading etcd: live and ready for several bounds.
            deadline = time.monotonic() + 2 * LIVENESS_BOUND
            while time.monotonic() < deadline:
                assert probe(health, "/healthz") == (200, None), proc.log_tail(40)
                assert probe(health, "/readyz") == (200, None), proc.log_tail(40)
                time.sleep(PROBE_EVERY)

            _break(etcd, fault)
            stopped = time.monotonic()
            _, body = wait_for(
                lambda: (r := probe(health, "/readyz"))[0] == 503 and r,
                timeout=15,
                what="/readyz to fail without etcd",
            )
            assert body is not None and body["reasons"][0].startswith("etcd:"), body
            _, body = wait_for(
                lambda: (r := probe(health, "/healthz"))[0] == 500 and r,
                timeout=LIVENESS_BOUND + 15,
                what="/healthz to fail with the etcd reason",
            )
            failed_after = time.monotonic() - stopped
            assert body is not None and body["status"] == "failing", body
            (reason,) = body["reasons"]
            assert reason.startswith("etcd: no successful round trip for"), reason
            assert f"bound {LIVENESS_BOUND:g}s" in reason, reason
            # not before the bound: the last success was at most a probe period before the stop
            assert failed_after >= LIVENESS_BOUND - 2 * PROBE_EVERY, failed_after
            assert proc.alive()

            _heal(etcd, fault)
            wait_for(
                lambda: probe(health, "/healthz") == (200, None),
                timeout=60,
                what="/healthz to recover with etcd",
            )
            wait_for(
                lambda: probe(health, "/readyz") == (200, None),
                timeout=30,
                what="/readyz to recover with etcd",
            )
    finally:
        if fault == "frozen" and etcd.process is not None and etcd.process.alive():
            _signal(etcd, signal.SIGCONT)
        etcd.stop()
