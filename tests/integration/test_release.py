"""A holder gives its lease back, through the real API server, webhook and etcd: the operator
(controller and webhook in one process, ``running_fence``) and Pods that are API objects whose
Ready condition the test sets. Each worker Pod releases with its own Pod-bound
service-account token (``kubectl create token --bound-object-kind=Pod``), whose Role allows
only ``create``, ``get`` and ``delete`` on ``fencedreleases``.

- the next holder is granted a greater token without waiting for expiry (SDK, sync);
- a delayed release of an older generation is refused and changes nothing (CLI, exit 14);
- another Pod cannot release the holder's generation (webhook, exit 12);
- the releasing Pod is not granted again until it asks again (``rejoin``);
- ``async with GrantScope(..., release_on_exit=AsyncReleaser(...))`` gives the lease back.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fencedlease.client import (
    AsyncKubeClient,
    AsyncReleaser,
    GrantScope,
    KubeClient,
    PodGrant,
    Released,
    Releaser,
    ReleaseRefused,
)
from fencedlease.client.cli_common import EXIT_NOT_CURRENT, EXIT_OK, EXIT_REJECTED
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import apply, lease, lease_status, wait_for, wait_held, wait_token_above
from .workers import pod_config, worker_pods, write_kubeconfig

pytestmark = pytest.mark.timeout(240)

ROLES = {
    "releaser": ("create,get,delete", "fencedreleases.fencedlease.io"),
    "pod-reader": ("get", "pods"),
}


def release_cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POD_")}
    env["KUBECONFIG"] = str(path)
    return subprocess.run(
        [sys.executable, "-m", "fencedlease", "release", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_release_hands_over_at_once_and_a_delayed_one_changes_nothing(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess, tmp_path: Path
) -> None:
    ns = namespace
    pods = worker_pods(cluster, ns, ROLES, "w-a", "w-b")
    apply(cluster, lease("jobs", ns, duration=120))  # expiry plays no part below
    first = wait_held(cluster, "jobs", ns)
    assert first["holder"] == "w-a"
    uid_a, token_a = pods["w-a"]
    uid_b, token_b = pods["w-b"]

    # Another Pod cannot give w-a's lease back: the webhook refuses, nothing is created.
    b_config = write_kubeconfig(tmp_path / "b.json", cluster, token_b, ns)
    out = release_cli(
        b_config, "jobs", "--lease-id", first["leaseId"], "--token", str(first["fencingToken"]),
        "--pod", "w-b", "--wait", "5",
    )  # fmt: skip
    assert out.returncode == EXIT_REJECTED, out.stderr
    assert "holder_mismatch" in out.stderr and "Traceback" not in out.stderr
    with KubeClient(pod_config(cluster, token_b, ns)) as kube:
        forged = Releaser(kube, pod_uid=uid_a).release(
            "jobs", lease_id=first["leaseId"], token=first["fencingToken"], pod="w-a", wait=5
        )
    assert isinstance(forged, ReleaseRefused) and forged.reason == "holder_mismatch", forged

    # The holder releases: w-b is granted a greater token long before the 120 s expiry.
    with KubeClient(pod_config(cluster, token_a, ns)) as kube:
        result = Releaser(kube).release(  # its UID read from its own Pod
            "jobs", lease_id=first["leaseId"], token=first["fencingToken"], pod="w-a", wait=20
        )
    assert isinstance(result, Released), result
    second = wait_token_above(cluster, "jobs", ns, first["fencingToken"], timeout=20)
    assert second["holder"] == "w-b" and second["leaseId"] != first["leaseId"]

    # A delayed copy of w-a's release (the same generation, sent again after w-a rejoined so
    # its request is new): admitted (w-a did hold it), refused by etcd's compare, no change.
    a_config = write_kubeconfig(tmp_path / "a.json", cluster, token_a, ns)
    out = release_cli(a_config, "jobs", "--lease-id", first["leaseId"], "--rejoin")
    assert out.returncode == EXIT_OK, out.stderr
    out = release_cli(
        a_config, "jobs", "--lease-id", first["leaseId"], "--token", str(first["fencingToken"]),
        "--pod", "w-a", "--pod-uid", uid_a, "--wait", "20",
    )  # fmt: skip
    assert out.returncode == EXIT_NOT_CURRENT, out.stdout + out.stderr
    assert "not current" in out.stderr
    after = lease_status(cluster, "jobs", ns)
    assert (after["holder"], after["leaseId"], after["fencingToken"]) == (
        "w-b",
        second["leaseId"],
        second["fencingToken"],
    )
    assert uid_b  # w-b's UID is what etcd recorded for its generation (shown by the handover)


def test_a_release_naming_a_path_is_refused_invalid_never_a_500(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess, tmp_path: Path
) -> None:
    """``leaseRef: lr/status`` from the Pod the release names once reached the store's key
    builder: ValueError, HTTP 500 and a traceback in the webhook."""
    ns = namespace
    pods = worker_pods(cluster, ns, ROLES, "w-p")
    uid, token = pods["w-p"]
    config = write_kubeconfig(tmp_path / "p.json", cluster, token, ns)
    for name in ("lr/status", "../lr", "lr#x"):
        spec = {"leaseRef": {"name": name}, "leaseId": "g", "fencingToken": 5}
        spec.update({"holder": "w-p", "holderUID": uid})
        body: dict[str, Any] = {"apiVersion": "fencedlease.io/v1alpha1", "kind": "FencedRelease"}
        body.update({"metadata": {"generateName": "r-", "namespace": ns}, "spec": spec})
        out = subprocess.run(
            [str(binary_path("kubectl")), f"--kubeconfig={config}", "create", "-f", "-"],
            input=json.dumps(body),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode != 0
        assert "invalid: spec.leaseRef.name" in out.stderr, out.stderr
        assert "500" not in out.stderr and "Internal" not in out.stderr, out.stderr


def test_the_releasing_pod_waits_until_it_asks_again(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess
) -> None:
    ns = namespace
    pods = worker_pods(cluster, ns, ROLES, "solo")
    apply(cluster, lease("solo-job", ns, duration=2))
    first = wait_held(cluster, "solo-job", ns)
    uid, token = pods["solo"]
    with KubeClient(pod_config(cluster, token, ns)) as kube:
        releaser = Releaser(kube, pod_uid=uid)
        result = releaser.release(
            "solo-job", lease_id=first["leaseId"], token=first["fencingToken"], pod="solo"
        )
        assert isinstance(result, Released), result
        wait_for(
            lambda: lease_status(cluster, "solo-job", ns).get("phase") == "Released",
            timeout=20,
            what="lease released",
        )
        # Three lease durations later the only candidate still has not been granted again.
        deadline_passes = 3 * 2.0
        with pytest.raises(AssertionError):
            wait_token_above(
                cluster, "solo-job", ns, first["fencingToken"], timeout=deadline_passes
            )
        assert releaser.rejoin("solo-job", first["leaseId"])
    again = wait_token_above(cluster, "solo-job", ns, first["fencingToken"], timeout=20)
    assert again["holder"] == "solo"


async def test_a_grant_scope_releases_on_exit_when_asked(
    cluster: LocalCluster, namespace: str, fence_process: ManagedProcess
) -> None:
    ns = namespace
    pods = await asyncio.to_thread(worker_pods, cluster, ns, ROLES, "w-a", "w-b")
    await asyncio.to_thread(apply, cluster, lease("scoped", ns, duration=120))
    first = await asyncio.to_thread(wait_held, cluster, "scoped", ns)
    uid, token = pods[first["holder"]]
    async with AsyncKubeClient(pod_config(cluster, token, ns)) as akube:
        source = PodGrant(
            "scoped", pod=first["holder"], namespace=ns, async_client=akube, poll_interval=0.2
        )
        releaser = AsyncReleaser(akube, pod=first["holder"], pod_uid=uid)
        scope = GrantScope(source, release_on_exit=releaser)
        async with scope:
            assert scope.token == first["fencingToken"]  # the work, done
        assert isinstance(scope.released, Released), scope.released
    second = await asyncio.to_thread(
        wait_token_above, cluster, "scoped", ns, first["fencingToken"], 20.0
    )
    assert second["holder"] != first["holder"]
