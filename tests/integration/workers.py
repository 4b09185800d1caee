"""Worker Pods that call the API as themselves, shared by the client tests through the real
API server (``test_release.py``, ``test_claims.py``, ``test_client_publish.py``, and
``bench/claims.py``): Pods that
are API objects whose Ready condition the test sets, each with a Pod-bound token of service
account ``worker`` (``kubectl create token --bound-object-kind=Pod``), least privilege."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fencedlease.client import KubeConfig
from fencedlease.local.cluster import LocalCluster

from .k8s import apply, get, set_ready

Roles = dict[str, tuple[str, str]]
"""Role name -> (its verbs, its resource), e.g. ``{"claimer": ("create,get,delete",
"fencedclaims.fencedlease.io")}``."""


def worker_pods(
    cluster: LocalCluster, ns: str, roles: Roles, *names: str, token_duration: str = "10m"
) -> dict[str, tuple[str, str]]:
    """Ready ``app=worker`` Pods under service account ``worker``, allowed only ``roles``;
    per Pod its UID and a Pod-bound token (valid for ``token_duration``)."""
    cluster.kubectl("create", "serviceaccount", "worker", "-n", ns)
    for role, (verbs, resource) in roles.items():
        cluster.kubectl(
            "create", "role", role, "-n", ns, f"--verb={verbs}", f"--resource={resource}"
        )  # fmt: skip
        cluster.kubectl(
            "create", "rolebinding", role, "-n", ns, f"--role={role}",
            f"--serviceaccount={ns}:worker",
        )  # fmt: skip
    out = {}
    for name in names:
        apply(
            cluster,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": {"app": "worker"}},
                "spec": {
                    "serviceAccountName": "worker",
                    "containers": [{"name": "main", "image": "example.invalid/worker:1"}],
                },
            },
        )
        set_ready(cluster, name, ns, True)
        uid = (get(cluster, "pod", name, ns) or {})["metadata"]["uid"]
        token = cluster.kubectl(
            "create", "token", "worker", "-n", ns, "--bound-object-kind=Pod",
            f"--bound-object-name={name}", f"--bound-object-uid={uid}",
            f"--duration={token_duration}",
        ).stdout.strip()  # fmt: skip
        out[name] = (uid, token)
    return out


def claim_template(ns: str, name: str, duration: int) -> dict[str, Any]:
    """A template lease ``name`` for the ``app=worker`` Pods' claims (never granted itself)."""
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedLease",
        "metadata": {
            "name": name,
            "namespace": ns,
            "annotations": {"fencedlease.io/claim-template": "true"},
        },
        "spec": {
            "leaseDurationSeconds": duration,
            "fencingPolicy": "AllowEqual",
            "holderSelector": {"matchLabels": {"app": "worker"}},
        },
    }


def pod_config(cluster: LocalCluster, token: str, namespace: str) -> KubeConfig:
    """The client's configuration for a Pod's token."""
    return KubeConfig(
        server=cluster.api_url, ca_file=str(cluster.ca_file), token=token, namespace=namespace
    )


def kubeconfig_cluster(cluster: LocalCluster) -> dict[str, Any]:
    """The cluster's entry ``local`` of a kubeconfig's ``clusters``."""
    return {
        "name": "local",
        "cluster": {"server": cluster.api_url, "certificate-authority": str(cluster.ca_file)},
    }


def write_kubeconfig(path: Path, cluster: LocalCluster, token: str, namespace: str) -> Path:
    """A kubeconfig file for a Pod's token (for the CLI)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [kubeconfig_cluster(cluster)],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [
            {"name": "pod", "context": {"cluster": "local", "user": "pod", "namespace": namespace}}
        ],
        "current-context": "pod",
    }
    path.write_text(json.dumps(config))
    return path
