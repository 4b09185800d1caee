"""A Pod watch scoped to candidates (``--pod-selector``), through a real kube-apiserver.

The operator talks to its own kube-apiserver on the shared etcd, so the test can restart it:
Kopf's watch then resumes from a version the new server's watch cache does not have, and
re-lists (``410 Gone`` or ``429`` while the cache warms up). A Pod that left the scope while
no watch was open must leave the controller's cache with that relist."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fencedlease.local.cluster import KubeAPIServer, LocalCluster, write_kubeconfig

from .chart import one, render
from .k8s import (
    apply,
    lease,
    lease_status,
    pod_lease_annotations,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)

pytestmark = pytest.mark.timeout(240)

SELECTOR = "fencedlease.io/candidate=true"


def pod(cluster: LocalCluster, name: str, namespace: str, *, candidate: bool) -> None:
    """A Ready ``app=worker`` Pod, labelled as a candidate or not."""
    labels = {"app": "worker", **({"fencedlease.io/candidate": "true"} if candidate else {})}
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/worker:1"}]},
        },
    )
    set_ready(cluster, name, namespace, True)


def holder(cluster: LocalCluster, name: str, namespace: str) -> str | None:
    status = lease_status(cluster, name, namespace)
    return status.get("holder") if status.get("phase") == "Held" else None


def told(cluster: LocalCluster, name: str, namespace: str, log: Path) -> None:
    """Pod ``name``, which left the watch while it held ``jobs``, reads ``lost`` by the time
    the next holder shows in the status (the handover marks it first)."""
    state = pod_lease_annotations(cluster, name, namespace, "jobs").get("state")
    if state != "lost":
        print(log.read_text(errors="replace")[-6000:])
        raise AssertionError(f"{name} reads {state!r}, not lost")


def test_only_labelled_pods_are_candidates_and_a_relist_drops_what_left(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    api = KubeAPIServer(tmp_path / "apiserver", cluster.etcd_endpoint)
    api.start()
    assert api.ca is not None and api.admin is not None
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, api.ca, api.admin)
    try:
        # w-a is not labelled: it wins every tie (name order), so only the scope keeps it out.
        pod(cluster, "w-a", namespace, candidate=False)
        pod(cluster, "w-b", namespace, candidate=True)
        with running_operator(
            cluster,
            tmp_path,
            "--role",
            "controller",
            "--namespace",
            namespace,
            "--no-leader-election",
            "--pod-selector",
            SELECTOR,
            kubeconfig=kubeconfig,
        ) as operator:
            apply(cluster, lease("jobs", namespace, duration=2))
            assert wait_held(cluster, "jobs", namespace)["holder"] == "w-b"

            # The labelled holder goes NotReady: the unlabelled Ready Pod is never granted.
            set_ready(cluster, "w-b", namespace, False)
            wait_for(
                lambda: lease_status(cluster, "jobs", namespace).get("phase") != "Held",
                what="the lease expired",
            )
            deadline = time.monotonic() + 4  # two lease durations
            while time.monotonic() < deadline:
                assert holder(cluster, "jobs", namespace) is None
                time.sleep(0.2)
            assert pod_lease_annotations(cluster, "w-a", namespace, "jobs") == {}

            # w-a gains the label: it is a candidate now.
            cluster.kubectl("label", "pod", "w-a", "-n", namespace, SELECTOR)
            wait_for(lambda: holder(cluster, "jobs", namespace) == "w-a", what="w-a holds")

            # The operator's API server goes away; meanwhile the holder leaves the scope
            # (still Ready) and a new candidate appears. Only a relist can tell.
            api.stop()
            cluster.kubectl("label", "pod", "w-a", "-n", namespace, "fencedlease.io/candidate-")
            pod(cluster, "w-c", namespace, candidate=True)
            api.start()
            wait_for(
                lambda: holder(cluster, "jobs", namespace) == "w-c",
                timeout=90,
                what="w-c holds after the relist",
            )
            log = operator.log_path.read_text(errors="replace")
            assert "cached Pods are gone or out of scope" in log and "/w-a" in log, log
            # The former holder still exists, out of the watch's scope: it is told.
            told(cluster, "w-a", namespace, operator.log_path)

            # With the watch open: the holder's label is removed (a DELETED event on the
            # scoped watch); the lease goes to the next candidate once it expires, and the
            # Pod that left reads lost, not held.
            set_ready(cluster, "w-b", namespace, True)
            cluster.kubectl("label", "pod", "w-c", "-n", namespace, "fencedlease.io/candidate-")
            wait_for(lambda: holder(cluster, "jobs", namespace) == "w-b", what="w-b holds")
            told(cluster, "w-c", namespace, operator.log_path)
            assert pod_lease_annotations(cluster, "w-b", namespace, "jobs")["state"] == "held"
    finally:
        api.stop()


def test_chart_sets_the_pod_selector_only_when_given() -> None:
    def controller_env(*flags: str) -> dict[str, str | None]:
        deployment = one(render("fencedlease", "fl-system", *flags), "Deployment", "-controller")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert "FENCEDLEASE_POD_SELECTOR" not in controller_env()
    selector = "fencedlease.io/candidate=true,tier in (a,b)"
    env = controller_env("--set-json", f"controller.podSelector={json.dumps(selector)}")
    assert env["FENCEDLEASE_POD_SELECTOR"] == selector
