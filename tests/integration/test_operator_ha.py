"""Two operator replicas against one API server and one etcd never grant one generation twice."""

from __future__ import annotations

import re
from pathlib import Path

from fencedlease.local.cluster import LocalCluster

from .k8s import (
    apply,
    events,
    lease,
    lease_status,
    pod_lease_annotations,
    ready_pods,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)


def granted_events(cluster: LocalCluster, namespace: str) -> list[tuple[int, str]]:
    out = []
    for ev in events(cluster, namespace, "reason=Granted"):
        m = re.search(r"fencing token (\d+) \(lease (\w+)", ev["message"])
        assert m, ev["message"]
        out.append((int(m.group(1)), m.group(2)))
    return out


def test_two_replicas_fifty_handovers(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    pods = ["w-a", "w-b", "w-c"]
    ready_pods(cluster, namespace, *pods)
    apply(cluster, lease("ha", namespace, duration=1))
    with (
        running_operator(cluster, tmp_path, "--role", "controller", name="replica-1"),
        running_operator(cluster, tmp_path, "--role", "controller", name="replica-2"),
    ):
        status = wait_held(cluster, "ha", namespace)
        tokens = [status["fencingToken"]]
        for i in range(50):
            holder = status["holder"]
            if i % 2 == 0:  # hand over by expiry: the holder stops being Ready
                for pod in pods:
                    set_ready(cluster, pod, namespace, pod != holder)
            else:  # hand over by an administrator's force release
                cluster.kubectl(
                    "annotate",
                    "fl",
                    "ha",
                    "-n",
                    namespace,
                    "--overwrite",
                    f"fencedlease.io/force-release={status['leaseId']}",
                )
            status = wait_for(
                lambda: (
                    (s := lease_status(cluster, "ha", namespace)).get("phase") == "Held"
                    and s.get("fencingToken", 0) > tokens[-1]
                    and s
                ),
                timeout=20,
                what=f"handover #{i + 1}",
            )
            tokens.append(status["fencingToken"])
            held = [
                p
                for p in pods
                if pod_lease_annotations(cluster, p, namespace, "ha").get("state") == "held"
            ]
            assert len(held) <= 1, held
    grants = granted_events(cluster, namespace)
    granted_tokens = [t for t, _ in grants]
    assert len(granted_tokens) == len(set(granted_tokens)), "a token was granted twice"
    assert len({lid for _, lid in grants}) == len(grants), "a lease id was granted twice"
    assert set(tokens) <= set(granted_tokens)
    assert tokens == sorted(set(tokens))
    assert len(tokens) == 51
