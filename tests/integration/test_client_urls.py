"""Names into URLs, through the real API server (issue 42, items 15, 20, 21): the reproductions
of the path traversal that deleted a ConfigMap (``fencedlease release --rejoin --lease-id
'a/../../..'`` and ``Claimer.done('t', 'a/../..#')``) are refused before any request and the
victims survive; a missing CRD is said as such; ``fencedlease etcd restore-pods`` for a missing
StatefulSet and ``restore --from-cluster`` with a broken kubeconfig say one line.

No operator runs: the traversal needs none (httpx would resolve the path to the ConfigMap
itself), and refusing it must not depend on anything but the client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fencedlease.client import Claimer, KubeClient, KubeConfig, Releaser
from fencedlease.client.cli_common import EXIT_ERROR, EXIT_USAGE
from fencedlease.client.validation import InvalidInput
from fencedlease.local.cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)


def victim(cluster: LocalCluster, namespace: str, name: str) -> None:
    cluster.kubectl("create", "configmap", name, "-n", namespace, "--from-literal=k=v")


def exists(cluster: LocalCluster, namespace: str, name: str) -> bool:
    out = cluster.kubectl("get", "configmap", name, "-n", namespace, "--ignore-not-found", "-o",
                          "name", check=False)  # fmt: skip
    return out.stdout.strip() == f"configmap/{name}"


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POD_")}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "fencedlease", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_release_rejoin_cannot_delete_a_configmap(cluster: LocalCluster, namespace: str) -> None:
    victim(cluster, namespace, "victim")
    lease_id = f"a/../../../../../../../api/v1/namespaces/{namespace}/configmaps/victim"
    out = cli(cluster, "release", "x", "--rejoin", "--lease-id", lease_id, "-n", namespace)
    assert out.returncode == EXIT_USAGE, out.stderr
    assert "invalid lease id" in one_line(out)
    # The SDK, which takes no argparse type: refused where the request is built.
    config = KubeConfig.load(cluster.kubeconfig)
    with KubeClient(config) as kube:
        with pytest.raises(InvalidInput):
            Releaser(kube, pod="p", pod_uid="u").rejoin("x", lease_id, namespace=namespace)
        # The path itself, as a caller could build it: refused too (the one check).
        with pytest.raises(InvalidInput):
            kube.request(
                "DELETE",
                f"/apis/fencedlease.io/v1alpha1/namespaces/{namespace}/fencedreleases/x-{lease_id}",
            )
    assert exists(cluster, namespace, "victim")


def test_claim_done_cannot_delete_a_configmap(cluster: LocalCluster, namespace: str) -> None:
    victim(cluster, namespace, "victim2")
    item = f"a/../../../../../../../api/v1/namespaces/{namespace}/configmaps/victim2#"
    with KubeClient(KubeConfig.load(cluster.kubeconfig)) as kube:
        claimer = Claimer(kube, pod="p", pod_uid="u")
        with pytest.raises(InvalidInput):
            claimer.done("t", item, namespace=namespace)
        with pytest.raises(InvalidInput):
            claimer.claim("t", item, namespace=namespace, wait=0)
    assert exists(cluster, namespace, "victim2")


def test_a_missing_crd_is_said(cluster: LocalCluster, namespace: str) -> None:
    """The API server's answer for a type it does not serve (here a version no CRD has)."""
    with KubeClient(KubeConfig.load(cluster.kubeconfig)) as kube:
        reply = kube.request(
            "GET", f"/apis/fencedlease.io/v9/namespaces/{namespace}/fencedleases/x"
        )
        assert "fencedleases.fencedlease.io is not installed" in (reply.not_installed() or "")
        lease = kube.request(
            "GET", f"/apis/fencedlease.io/v1alpha1/namespaces/{namespace}/fencedleases/absent"
        )
        assert lease.status_code == 404 and lease.not_installed() is None


def test_etcd_restore_errors_are_one_line(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    out = cli(cluster, "etcd", "restore-pods", "-n", namespace, "--statefulset", "missing",
              "--snapshot", "s.db", "--kubeconfig", str(cluster.kubeconfig))  # fmt: skip
    assert out.returncode == 6, out.stderr
    line = one_line(out)
    assert f"StatefulSet {namespace}/missing not found" in line, line
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nclusters: 5\ncontexts: [\n")
    snapshot = tmp_path / "snap.db"
    snapshot.write_bytes(b"\x01" * 64)
    out = cli(cluster, "etcd", "restore", str(snapshot), "--data-dir", str(tmp_path / "d"),
              "--from-cluster", "--kubeconfig", str(broken))  # fmt: skip
    assert out.returncode in (3, 6), out.stderr  # the snapshot is checked first
    one_line(out)


def test_etcd_restore_from_cluster_with_a_broken_kubeconfig(tmp_path: Path) -> None:
    """A valid snapshot, then a kubeconfig that cannot be used: exit code 6, one line (an
    ``etcdutl`` that only reports the snapshot's revision: the kubeconfig is read next)."""
    import hashlib

    body = b"\x01" * 1024
    snapshot = tmp_path / "good.db"
    snapshot.write_bytes(body + hashlib.sha256(body).digest())
    etcdutl = tmp_path / "etcdutl"
    etcdutl.write_text("#!/bin/sh\necho '{\"revision\": 7}'\n")
    etcdutl.chmod(0o755)
    for text in ("apiVersion: v1\ncontexts: [\n", "apiVersion: v1\ncontexts: 5\nusers: 7\n"):
        broken = tmp_path / "broken"
        broken.write_text(text)
        out = subprocess.run(
            [sys.executable, "-m", "fencedlease", "etcd", "restore", str(snapshot), "--data-dir",
             str(tmp_path / "d"), "--from-cluster", "--kubeconfig", str(broken),
             "--etcdutl", str(etcdutl)],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
        assert out.returncode == 6, out.stderr
        assert one_line(out).startswith("error: cannot read tokens from the Kubernetes API")


def test_no_traceback_and_rc_1_for_a_refused_api(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: x}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "fencedlease.client.kubectl", "--kubeconfig", str(config), "status"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == EXIT_ERROR
    assert "cannot connect to the API server" in one_line(out)
