"""The FencedLease operator end to end: real etcd, real kube-apiserver, Pods without a kubelet."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess
from fencedlease.models import pod_annotation_keys

from .k8s import (
    apply,
    create_pod,
    get,
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


def _watch(cluster: LocalCluster, path: str, version: str, seconds: int) -> subprocess.Popen[str]:
    """Every change to the object at ``path`` from ``version`` on, for ``seconds``: one watch
    event per write the API server committed."""
    query = f"watch=1&resourceVersion={version}&timeoutSeconds={seconds}"
    argv = [str(binary_path("kubectl")), f"--kubeconfig={cluster.kubeconfig}"]
    argv += ["get", "--raw", f"{path}&{query}"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_steady_state_renewal_is_one_pod_write_and_no_lease_write(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    """Counted by the API server itself (watch events are committed writes): each renewal
    writes the holder Pod's valid-until and nothing else; the lease object does not move,
    and its status still says who holds it, since when, and how it is renewed."""
    ready_pods(cluster, namespace, "w-a")
    apply(cluster, lease("steady", namespace, duration=6))
    wait_for(
        lambda: any(
            c["type"] == "Held" and c["reason"] == "Renewed"
            for c in lease_status(cluster, "steady", namespace).get("conditions") or []
        ),
        timeout=30,
        what="the first renewal",
    )
    time.sleep(0.5)  # the first renewal's status write settles
    fl = get(cluster, "fl", "steady", namespace) or {}
    pod = get(cluster, "pod", "w-a", namespace) or {}
    window = 9
    pods = _watch(
        cluster,
        f"/api/v1/namespaces/{namespace}/pods?fieldSelector=metadata.name%3Dw-a",
        pod["metadata"]["resourceVersion"],
        window,
    )
    leases = _watch(
        cluster,
        f"/apis/fencedlease.io/v1alpha1/namespaces/{namespace}/fencedleases"
        "?fieldSelector=metadata.name%3Dsteady",
        fl["metadata"]["resourceVersion"],
        window,
    )
    pod_events = [json.loads(line) for line in pods.communicate(timeout=60)[0].splitlines()]
    lease_events = [json.loads(line) for line in leases.communicate(timeout=60)[0].splitlines()]
    keys = pod_annotation_keys("steady")
    before = pod["metadata"]["annotations"]
    untils = [e["object"]["metadata"]["annotations"][keys["valid_until"]] for e in pod_events]
    assert len(pod_events) >= 3, pod_events  # a renewal every 2 s for 9 s
    assert len(set(untils)) == len(untils) and min(untils) > before[keys["valid_until"]]
    for event in pod_events:  # nothing but the deadline moved
        shown = dict(event["object"]["metadata"]["annotations"])
        shown.pop(keys["valid_until"])
        assert shown == {k: v for k, v in before.items() if k != keys["valid_until"]}
    assert lease_events == []
    # No framework bookkeeping on either object (an older operator ran Kopf): watch-only.
    for obj in (get(cluster, "fl", "steady", namespace), get(cluster, "pod", "w-a", namespace)):
        meta = (obj or {}).get("metadata") or {}
        assert not [k for k in meta.get("annotations") or {} if "kopf" in k or "last-handled" in k]
        assert not [f for f in meta.get("finalizers") or [] if "kopf" in f]
    status = lease_status(cluster, "steady", namespace)
    conds = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Held" and status["holder"] == "w-a"
    assert status["leaseDurationSeconds"] == 6 and status["renewIntervalSeconds"] == 2
    assert status["acquireTime"] and status["renewTime"] and "expireTime" not in status
    assert conds["Ready"]["status"] == "True" and conds["Held"]["reason"] == "Renewed"
    assert all(c["observedGeneration"] == 1 for c in conds.values())
