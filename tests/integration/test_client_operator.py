"""fencedlease.client against the running operator: the grant read from the API (Pod
annotations, lease status), a grant scope that stops work on handover, and the kubectl plugin
(``kubectl fencedlease status|describe|force-release``, found by kubectl on PATH)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencedlease.client import (
    AsyncKubeClient,
    GrantLost,
    GrantScope,
    KubeClient,
    KubeConfig,
    LeaseStatusGrant,
    PodGrant,
)
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import (
    apply,
    lease,
    lease_status,
    ready_pods,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    with running_operator(
        cluster, tmp_path_factory.mktemp("client-op"), "--role", "controller"
    ) as proc:
        yield proc


def plugin(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl fencedlease ...``: kubectl finds ``kubectl-fencedlease`` on PATH."""
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return subprocess.run(
        [str(binary_path("kubectl")), "fencedlease", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def test_grant_from_the_api_and_scope_stops_on_handover(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("report-july", namespace, duration=3))
    status = await asyncio.to_thread(
        wait_for,
        lambda: (s := lease_status(cluster, "report-july", namespace)).get("phase") == "Held" and s,
        30.0,
        "lease held",
    )
    holder = status["holder"]
    config = KubeConfig.from_kubeconfig(cluster.kubeconfig)
    with KubeClient(config) as kube:
        pod_source = PodGrant("report-july", pod=holder, namespace=namespace, client=kube)
        grant = await asyncio.to_thread(
            wait_for, lambda: (g := pod_source.read()) is not None and g.held and g, 30.0, "grant"
        )
        assert grant.token == status["fencingToken"] and grant.lease_id == status["leaseId"]
        from_status = LeaseStatusGrant("report-july", pod=holder, namespace=namespace, client=kube)
        seen = from_status.read()
        assert seen is not None and seen.token == grant.token and seen.state == "held"

    async with AsyncKubeClient(config) as akube:
        source = PodGrant(
            "report-july", pod=holder, namespace=namespace, async_client=akube, poll_interval=0.2
        )
        started = asyncio.Event()

        async def work() -> None:
            async with GrantScope(source) as scope:
                assert scope.token == grant.token
                started.set()
                await asyncio.sleep(120)  # "rendering": cancelled when the grant is lost

        task = asyncio.create_task(work())
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.to_thread(set_ready, cluster, holder, namespace, False)
        with pytest.raises(GrantLost):
            await asyncio.wait_for(task, 60)
    after = await asyncio.to_thread(
        wait_for,
        lambda: (
            (s := lease_status(cluster, "report-july", namespace)).get("holder") != holder and s
        ),
        30.0,
        "handover",
    )
    assert after["fencingToken"] > grant.token


def test_kubectl_plugin_status_describe_force_release(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("jobs", namespace, duration=30))
    first = wait_for(
        lambda: (s := lease_status(cluster, "jobs", namespace)).get("phase") == "Held" and s,
        what="lease held",
    )
    out = plugin(cluster, "status", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert "jobs" in out.stdout and first["holder"] in out.stdout
    assert str(first["fencingToken"]) in out.stdout
    out = plugin(cluster, "status", "jobs", "-n", namespace, "-o", "json")
    assert json.loads(out.stdout)["status"]["leaseId"] == first["leaseId"]  # the object
    out = plugin(cluster, "-n", namespace, "status", "-o", "wide")  # flags before the command
    assert out.returncode == 0 and first["leaseId"] in out.stdout, out.stderr
    out = plugin(cluster, "describe", "jobs", "-n", namespace)
    assert out.returncode == 0, out.stderr
    assert f"Lease id:      {first['leaseId']}" in out.stdout
    assert "token: " + str(first["fencingToken"]) in out.stdout

    out = plugin(cluster, "force-release", "jobs", "-n", namespace, "--wait", "60")
    assert out.returncode == 0, out.stderr
    assert first["leaseId"] in out.stderr and "NOT stopped" in out.stderr
    second = wait_held(cluster, "jobs", namespace, other_than=first["leaseId"])
    assert second["fencingToken"] > first["fencingToken"]
    assert second["holder"] != first["holder"]  # the force-released holder is passed over

    out = plugin(cluster, "describe", "missing", "-n", namespace)
    assert out.returncode == 3, out.stderr
    set_ready(cluster, "w-a", namespace, False)
    set_ready(cluster, "w-b", namespace, False)
    wait_for(
        lambda: lease_status(cluster, "jobs", namespace).get("phase") != "Held",
        timeout=90,
        what="lease not held",
    )
    out = plugin(cluster, "force-release", "jobs", "-n", namespace)
    assert out.returncode == 4, out.stderr
