"""The FencedLease operator end to end: real etcd, real kube-apiserver, Pods without a kubelet."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import (
    apply,
    create_pod,
    lease,
    lease_status,
    pod_lease_annotations,
    ready_pods,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    with running_operator(cluster, tmp_path_factory.mktemp("op"), "--role", "controller") as proc:
        yield proc


def held_pods(cluster: LocalCluster, pods: list[str], ns: str, lease_name: str) -> list[str]:
    return [
        p for p in pods if pod_lease_annotations(cluster, p, ns, lease_name).get("state") == "held"
    ]


def test_one_of_two_candidates_holds_with_status_token(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("report-july", namespace, duration=10))

    status = wait_held(cluster, "report-july", namespace)
    holder = status["holder"]
    assert holder in ("w-a", "w-b")
    assert isinstance(status["fencingToken"], int) and status["fencingToken"] > 0
    ann = wait_for(
        lambda: (
            (a := pod_lease_annotations(cluster, holder, namespace, "report-july")).get("state")
            == "held"
            and a
        ),
        what="holder annotations",
    )
    assert ann["token"] == str(status["fencingToken"])
    assert ann["lease_id"] == status["leaseId"]
    assert held_pods(cluster, ["w-a", "w-b"], namespace, "report-july") == [holder]
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Held"]["status"] == "True"
    assert conds["EtcdAvailable"]["status"] == "True"
    table = cluster.kubectl("get", "fl", "report-july", "-n", namespace).stdout
    assert holder in table and str(status["fencingToken"]) in table


def test_handover_when_holder_not_ready_tokens_increase(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    pods = ["w-a", "w-b"]
    ready_pods(cluster, namespace, *pods)
    apply(cluster, lease("jobs", namespace, duration=1))
    first = wait_held(cluster, "jobs", namespace)
    tokens = [first["fencingToken"]]
    holder = first["holder"]
    for _ in range(20):
        other = pods[1 - pods.index(holder)]
        set_ready(cluster, other, namespace, True)
        set_ready(cluster, holder, namespace, False)
        status = wait_for(
            lambda: (s := lease_status(cluster, "jobs", namespace)).get("holder") == other and s,
            timeout=15,
            what=f"handover to {other}",
        )
        assert status["fencingToken"] > tokens[-1]
        tokens.append(status["fencingToken"])
        wait_for(
            lambda: (
                pod_lease_annotations(cluster, holder, namespace, "jobs").get("state") == "lost"
            ),
            what="old holder reads lost",
        )
        assert len(held_pods(cluster, pods, namespace, "jobs")) <= 1
        holder = other
    assert tokens == sorted(set(tokens))
    assert lease_status(cluster, "jobs", namespace)["transitions"] >= 21


def test_force_release_needs_the_exact_lease_id(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("singleton", namespace, duration=300))
    status = wait_held(cluster, "singleton", namespace)
    annotate = ["annotate", "fl", "singleton", "-n", namespace, "--overwrite"]
    cluster.kubectl(*annotate, "fencedlease.io/force-release=not-the-current-id")
    wait_for(
        lambda: (
            "fencedlease.io/force-release"
            not in json.loads(
                cluster.kubectl("get", "fl", "singleton", "-n", namespace, "-o", "json").stdout
            )["metadata"].get("annotations", {})
        ),
        what="stale force release consumed",
    )
    same = lease_status(cluster, "singleton", namespace)
    assert (same["leaseId"], same["fencingToken"]) == (status["leaseId"], status["fencingToken"])

    cluster.kubectl(*annotate, f"fencedlease.io/force-release={status['leaseId']}")
    new = wait_for(
        lambda: (
            (s := lease_status(cluster, "singleton", namespace)).get("leaseId")
            not in (None, status["leaseId"])
            and s.get("phase") == "Held"
            and s
        ),
        timeout=10,
        what="immediate handover",
    )
    assert new["fencingToken"] > status["fencingToken"]
    assert new["holder"] != status["holder"]
    assert (
        pod_lease_annotations(cluster, status["holder"], namespace, "singleton")["state"] == "lost"
    )


def test_no_candidate_is_pending_and_deletion_cleans_annotations(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    apply(cluster, lease("nobody", namespace, duration=5, app="absent"))
    status = wait_for(lambda: (s := lease_status(cluster, "nobody", namespace)).get("phase") and s)
    assert status["phase"] == "Pending"
    held = {c["type"]: c for c in status["conditions"]}["Held"]
    assert held["status"] == "False" and held["reason"] == "NoCandidate"

    create_pod(cluster, "w-a", namespace, app="absent")
    set_ready(cluster, "w-a", namespace, True)
    wait_for(lambda: lease_status(cluster, "nobody", namespace).get("holder") == "w-a")
    wait_for(lambda: pod_lease_annotations(cluster, "w-a", namespace, "nobody"))
    cluster.kubectl("delete", "fl", "nobody", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_for(
        lambda: pod_lease_annotations(cluster, "w-a", namespace, "nobody") == {},
        what="annotations cleaned after delete",
    )


def test_operator_restart_keeps_tokens_increasing(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("restart", namespace, duration=1))
    seen: list[int] = []
    for round_ in range(3):
        with running_operator(cluster, tmp_path, "--role", "controller", name=f"op{round_}"):
            status = wait_held(cluster, "restart", namespace, timeout=20)
            if seen:  # the restarted operator adopted the live grant: same or newer, never older
                assert status["fencingToken"] >= seen[-1]
            holder = status["holder"]
            other = "w-b" if holder == "w-a" else "w-a"
            set_ready(cluster, other, namespace, True)
            set_ready(cluster, holder, namespace, False)
            new = wait_for(
                lambda: (
                    (s := lease_status(cluster, "restart", namespace)).get("holder") == other and s
                ),
                timeout=20,
                what="handover after restart",
            )
            assert new["fencingToken"] > max([*seen, status["fencingToken"]])
            seen.append(new["fencingToken"])
    assert seen == sorted(set(seen)), seen


def test_deleted_or_terminating_holder_is_not_renewed(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    for pod in ("w-a", "w-b", "w-c"):
        create_pod(cluster, pod, namespace)
        # A finalizer keeps a deleted Pod around as "terminating" (no kubelet to finish it).
        cluster.kubectl(
            "patch", "pod", pod, "-n", namespace, "--type=merge",
            "-p", json.dumps({"metadata": {"finalizers": ["test.fencedlease.io/hold"]}}),
        )  # fmt: skip
        set_ready(cluster, pod, namespace, True)
    apply(cluster, lease("terminating", namespace, duration=1))
    first = wait_held(cluster, "terminating", namespace)
    # Terminating (deletionTimestamp set) but still Ready: no longer a holder.
    cluster.kubectl("delete", "pod", first["holder"], "-n", namespace, "--wait=false")
    second = wait_for(
        lambda: (
            (s := lease_status(cluster, "terminating", namespace)).get("holder")
            not in (None, first["holder"])
            and s
        ),
        timeout=15,
        what="handover away from a terminating holder",
    )
    assert second["fencingToken"] > first["fencingToken"]
    # Deleted outright: its lease lapses and the last candidate takes over.
    cluster.kubectl(
        "patch", "pod", second["holder"], "-n", namespace, "--type=merge",
        "-p", json.dumps({"metadata": {"finalizers": None}}),
    )  # fmt: skip
    cluster.kubectl("delete", "pod", second["holder"], "-n", namespace, "--wait=true")
    third = wait_for(
        lambda: (
            (s := lease_status(cluster, "terminating", namespace)).get("holder")
            not in (None, first["holder"], second["holder"])
            and s
        ),
        timeout=15,
        what="handover away from a deleted holder",
    )
    assert third["fencingToken"] > second["fencingToken"]
    for pod in ("w-a", "w-b", "w-c"):
        cluster.kubectl(
            "patch", "pod", pod, "-n", namespace, "--type=merge",
            "-p", json.dumps({"metadata": {"finalizers": None}}), check=False,
        )  # fmt: skip
