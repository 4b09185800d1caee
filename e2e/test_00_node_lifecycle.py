"""`local up --node` starts a node that goes Ready and runs a Pod; `local down` leaves nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from e2e.node import NodeEnv
from e2e.scenarios import wait_for
from fencedlease.local import host, node

pytestmark = pytest.mark.timeout(600)


def machine_state(state_dir: Path) -> dict[str, object]:
    """What a node could leave behind on this machine."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    netns = Path("/var/run/netns")
    return {
        "processes": host.processes_under(state_dir),
        "mounts": [ln for ln in mountinfo.splitlines() if str(state_dir) in ln],
        "kubelet mounts": [ln for ln in mountinfo.splitlines() if "/var/lib/kubelet" in ln],
        "netns": sorted(p.name for p in netns.glob("cni-*")) if netns.exists() else [],
        "links": sorted(n for n in os.listdir("/sys/class/net") if n.startswith(("fl", "veth"))),
        "iptables": sorted(ln for ln in _iptables() if "KUBE-" in ln or "CNI-" in ln),
        "kubepods cgroups": [str(p) for p in host.cgroup_dirs("kubepods")],
        "outside paths": [p for p in node.OUTSIDE_PATHS if Path(p).exists()],
        "sysctls": {n: host.read_sysctl(n) for n in node.KUBELET_SYSCTLS},
    }


def _iptables() -> list[str]:
    lines: list[str] = []
    for command, tables in host.iptables_snapshot().items():
        for table, rules in tables.items():
            lines += [f"{command} {table} {rule}" for rule in rules]
    return lines


def test_node_ready_pod_runs_and_down_leaves_nothing(fresh_node: NodeEnv) -> None:
    before = machine_state(fresh_node.state_dir)
    fresh_node.up()
    try:
        got = fresh_node.kubectl("get", "node", node.NODE_NAME, "-o", "json")
        ready = [c for c in json.loads(got.stdout)["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "namespace": "default"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "probe",
                        "image": "fencedlease.local/busybox:1",
                        "imagePullPolicy": "Never",
                        "command": [
                            "sh",
                            "-c",
                            "nslookup kubernetes.default.svc.cluster.local && sleep 3600",
                        ],
                    }
                ],
            },
        }
        fresh_node.kubectl("apply", "-f", "-", input=json.dumps(pod))

        def resolved() -> bool:
            logs = fresh_node.kubectl("logs", "probe", "-n", "default", check=False).stdout
            return "10.96.0.1" in logs

        wait_for("the Pod to run and resolve the kubernetes Service", resolved, 120)
        during = machine_state(fresh_node.state_dir)
        assert during["processes"] and during["links"], during  # the probe sees a live node
    finally:
        down = fresh_node.down()
    assert down.returncode == 0, down.stderr
    assert machine_state(fresh_node.state_dir) == before


def test_down_cleans_up_after_a_killed_local_up(fresh_node: NodeEnv) -> None:
    """`local up` SIGKILLed with a Pod running: its shims and containers outlive it, and
    `local down` still removes everything (from the record in the state directory)."""
    before = machine_state(fresh_node.state_dir)
    fresh_node.up()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orphan", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "sleep",
                    "image": "fencedlease.local/busybox:1",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ]
        },
    }
    fresh_node.kubectl("apply", "-f", "-", input=json.dumps(pod))

    def running() -> bool:
        got = fresh_node.kubectl("get", "pod", "orphan", "-o", "json", check=False)
        return got.returncode == 0 and json.loads(got.stdout)["status"].get("phase") == "Running"

    wait_for("the Pod running", running, 120)
    pid = int((fresh_node.state_dir / "local-up.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for("local up gone", lambda: not Path(f"/proc/{pid}").exists() or None, 30)
    assert host.kubepods_processes(), "the container should outlive local up"
    down = fresh_node.down()
    assert down.returncode == 0, down.stderr
    assert "cleaning up after the node" in down.stderr
    assert machine_state(fresh_node.state_dir) == before
