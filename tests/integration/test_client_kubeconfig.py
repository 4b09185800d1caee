"""The client's credentials against the real kube-apiserver (issue 34, item 2): an ``exec``
credential plugin, several ``$KUBECONFIG`` files with ``--context``, and the in-cluster
service-account path.

The exec plugin is a script printing an ``ExecCredential`` with a service-account token from
``kubectl create token`` (the local API server verifies those with its service-account key, as
any cluster does), and counting its runs.  Who the API server thinks we are is asked with a
``SelfSubjectReview``, so a request that silently went out without credentials would fail."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.client import KubeClient, KubeConfig
from fencedlease.local.cluster import LocalCluster

from .workers import kubeconfig_cluster

pytestmark = pytest.mark.timeout(180)

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def whoami(config: KubeConfig) -> str:
    with KubeClient(config) as kube:
        reply = kube.request(
            "POST",
            REVIEW,
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        ).raise_for_status()
    return str(reply.json()["status"]["userInfo"]["username"])


def service_account(cluster: LocalCluster, namespace: str, name: str) -> str:
    """A service account allowed to list FencedLeases in ``namespace``; returns a token."""
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    cluster.kubectl(
        "create", "role", f"{name}-leases", "--verb=get,list",
        "--resource=fencedleases.fencedlease.io", "-n", namespace,
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", f"{name}-leases", f"--role={name}-leases",
        f"--serviceaccount={namespace}:{name}", "-n", namespace,
    )  # fmt: skip
    return cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()


def exec_plugin(directory: Path, token: str) -> tuple[Path, Path]:
    """A plugin printing ``token`` as an ExecCredential, appending a line to a counter file per
    run; a token file named ``fail`` makes it fail as a real plugin does (stderr, exit 1)."""
    runs = directory / "runs"
    (directory / "token").write_text(token)
    script = directory / "credential-plugin"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, pathlib, sys\n"
        f"here = pathlib.Path({str(directory)!r})\n"
        "with open(here / 'runs', 'a') as f: f.write('run\\n')\n"
        "token = (here / 'token').read_text()\n"
        "if token == 'fail':\n"
        "    print('error: the SSO session has expired', file=sys.stderr); sys.exit(1)\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1',\n"
        "  'kind': 'ExecCredential', 'status': {'token': token}}))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, runs


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def split_kubeconfig(directory: Path, cluster: LocalCluster, plugin: Path, namespace: str) -> str:
    """Two files, as a user's ``$KUBECONFIG`` often is: the cluster in one (with a context for an
    admin that does not exist here), the exec user and its context in the other."""
    clusters = write(
        directory / "clusters.yaml",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [kubeconfig_cluster(cluster)],
            "current-context": "worker",
        },
    )
    users = write(
        directory / "users.yaml",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "users": [
                {
                    "name": "exec-user",
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1",
                            "command": str(plugin),
                            "interactiveMode": "Never",
                        }
                    },
                },
                {"name": "nobody", "user": {"token": "not-a-valid-token"}},
            ],
            "contexts": [
                {
                    "name": "worker",
                    "context": {"cluster": "local", "user": "exec-user", "namespace": namespace},
                },
                {"name": "anonymous", "context": {"cluster": "local", "user": "nobody"}},
            ],
            "current-context": "anonymous",  # the first file's current-context wins
        },
    )
    return os.pathsep.join([str(clusters), str(users)])


def cli(
    *argv: str, kubeconfig: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "POD_NAMESPACE"}
    environ.update(env or {}, KUBECONFIG=kubeconfig)
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=environ, timeout=120
    )


def test_exec_plugin_several_files_and_context(cluster: LocalCluster, tmp_path: Path) -> None:
    namespace = f"kc-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    token = service_account(cluster, namespace, "worker")
    plugin, runs = exec_plugin(tmp_path, token)
    kubeconfig = split_kubeconfig(tmp_path, cluster, plugin, namespace)

    config = KubeConfig.from_kubeconfig(kubeconfig)  # context "worker": the first file's
    assert config.namespace == namespace
    assert whoami(config) == f"system:serviceaccount:{namespace}:worker"
    assert runs.read_text().count("run") >= 1  # the token came from the plugin

    anonymous = KubeConfig.from_kubeconfig(kubeconfig, context="anonymous")
    with KubeClient(anonymous) as kube:
        assert kube.request("POST", REVIEW, body={}).status_code == 401

    # The kubectl plugin through the same files: the exec user may list leases here.
    cluster.kubectl(
        "apply", "-f", "-",
        input=json.dumps({
            "apiVersion": "fencedlease.io/v1alpha1", "kind": "FencedLease",
            "metadata": {"name": "report-july", "namespace": namespace},
            "spec": {"leaseDurationSeconds": 15,
                     "holderSelector": {"matchLabels": {"app": "x"}}},
        }),
    )  # fmt: skip
    listed = cli("-m", "fencedlease.client.kubectl", "status", "-o", "json", kubeconfig=kubeconfig)
    assert listed.returncode == 0, listed.stderr
    listing = json.loads(listed.stdout)
    assert listing["kind"] == "List"
    assert [lease["metadata"]["name"] for lease in listing["items"]] == ["report-july"]
    other = cli(
        "-m", "fencedlease.client.kubectl", "--context", "anonymous", "status",
        "-n", namespace, kubeconfig=kubeconfig,
    )  # fmt: skip
    assert other.returncode == 1 and other.stderr.count("\n") == 1, other.stderr
    assert "401" in other.stderr and "Traceback" not in other.stderr

    # The plugin fails (an expired SSO session): one line, exit code 1, the plugin's reason.
    (tmp_path / "token").write_text("fail")
    for argv in (
        ("-m", "fencedlease.client.kubectl", "status"),
        ("-m", "fencedlease.client", "publish", "cat", "--lease", "report-july",
         "--object-ref", "o", "--token", "5"),
    ):  # fmt: skip
        failed = cli(*argv, kubeconfig=kubeconfig)
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
        assert "the SSO session has expired" in failed.stderr, failed.stderr


def test_in_cluster_service_account_token(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a Pod sees: KUBERNETES_SERVICE_HOST/PORT and the mounted token, CA and namespace."""
    namespace = f"ic-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    token = service_account(cluster, namespace, "pod-sa")
    mount = tmp_path / "serviceaccount"
    mount.mkdir()
    (mount / "token").write_text(token)
    (mount / "ca.crt").write_bytes(cluster.ca_file.read_bytes())
    (mount / "namespace").write_text(namespace)
    host, port = cluster.api_url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host.strip("[]"))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    config = KubeConfig.in_cluster(mount)
    assert config.namespace == namespace
    assert whoami(config) == f"system:serviceaccount:{namespace}:pod-sa"
