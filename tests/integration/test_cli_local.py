"""``fencedlease local up --detach`` / ``local down``: the embedded default as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fencedlease.local.binaries import binary_path

from .k8s import processes_using, wait_for


def fencedlease(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencedlease", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary_path("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_detach_ready_down_and_restart_keeps_data(tmp_path: Path) -> None:
    state = tmp_path / "state"
    up = fencedlease("local", "up", "--detach", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr
    assert "fencedlease is ready." in up.stdout
    kubeconfig = str(state / "kubeconfig")
    assert f"kubeconfig: {kubeconfig}" in up.stdout
    try:
        got = kubectl(kubeconfig, "get", "fencedleases", "-A")
        assert got.returncode == 0, got.stderr
        again = fencedlease("local", "up", "--detach", "--state-dir", str(state))
        assert again.returncode == 1 and "already runs" in again.stderr
        created = kubectl(
            kubeconfig, "create", "configmap", "survives-restart", "--from-literal=k=v"
        )
        assert created.returncode == 0, created.stderr
    finally:
        down = fencedlease("local", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    wait_for(lambda: not processes_using(state), timeout=30, what="no process left")

    up = fencedlease("local", "up", "--detach", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr
    try:
        got = kubectl(kubeconfig, "get", "configmap", "survives-restart", "-o", "json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["data"] == {"k": "v"}
    finally:
        fencedlease("local", "down", "--state-dir", str(state))
    wait_for(lambda: not processes_using(state), timeout=30, what="no process left")


def test_bad_settings_are_a_clear_error_not_a_traceback() -> None:
    result = fencedlease("run", "--metrics-port", "70000")
    assert result.returncode == 2
    assert "error: setting metrics_port" in result.stderr
    assert "Traceback" not in result.stderr


def test_down_without_up_is_harmless(tmp_path: Path) -> None:
    result = fencedlease("local", "down", "--state-dir", str(tmp_path))
    assert result.returncode == 0
    assert "nothing runs" in result.stdout


def test_run_without_a_cluster_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fencedlease", "run", "--metrics-port", "0", "--health-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)},
            "HOME": str(tmp_path),
        },
    )
    assert result.returncode == 1
    assert "no usable Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr
