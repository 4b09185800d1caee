"""A fenced Deployment lives with the real kube-controller-manager (issue 43 item 5).

A node cluster of its own (``fencedlease local up --node``: kube-controller-manager runs the
deployment, replicaset, garbage-collector and namespace controllers, each as its own service
account, as kubeadm does), the chart installed with Deployments among the kinds its controller
records (and its webhook reads, for scale writes). In a namespace a FencePolicy selects: a
FencedLease held by a Pod on the node, and a Deployment labelled ``fencedlease.io/lease``
carrying the grant's token (written by an admin among ``allowedWriters``, the way the shared
scenarios publish). Then, with nothing but the real controllers:

* it rolls out: the deployment controller writes its status (``UpdateStatus``: no token, not a
  Pod, admitted) and creates the ReplicaSet (its template carries no lease label);
* a rolling update (a new template, stamped) completes;
* an admin's ``kubectl scale`` (the ``scale`` subresource, not a Pod: admitted) reaches two
  ready replicas;
* ``kubectl delete namespace`` finishes: the namespace controller's collection delete of
  Deployments waits only until the mark covers the token, the garbage collector deletes the
  ReplicaSets and Pods.

docs/fenced-objects.md, "What is fenced, per subresource and writer", "Status writes", "Scale
writes". Through the API server alone (impersonated controllers):
tests/integration/test_fenced_objects.py and test_fenced_object_matrix.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration import k8s

from e2e.node import RELEASE, RESULTS, SYSTEM_NS, E2EError, NodeEnv, log
from e2e.scenarios import wait_for
from fencedlease.local import images

pytestmark = pytest.mark.timeout(1500)

NS = "fdeploy-e2e"
LEASE = "fdeploy"
APP = "fdeploy-holder"
POLICY = "fdeploy-e2e-deployments"
SELECTED = "fencedlease-e2e/fdeploy"
LEASE_LABEL = "fencedlease.io/lease"
TOKEN_ANNOTATION = "fencedlease.io/token"
BOUND = 180.0


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    env = NodeEnv(state_root / "fdeploy")
    with env.running():
        env.helm_install(
            '--set-json=fencedObjects.resources=[{"apiGroup":"apps","resources":["deployments"]}]'
        )
        yield env


def apply(
    env: NodeEnv, obj: dict[str, Any], *flags: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return env.kubectl("apply", *flags, "-f", "-", input=json.dumps(obj), check=check)


def deployment(token: int | None, version: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "web", "namespace": NS, "labels": {LEASE_LABEL: LEASE}}
    if token is not None:
        meta["annotations"] = {TOKEN_ANNOTATION: str(token)}
    pods = {"app": "web"}  # the lease label stays off the template (fenced-objects.md)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": pods},
            "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": pods},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "main",
                            "image": images.BUSYBOX_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sleep", "86400"],
                            "env": [{"name": "VERSION", "value": version}],
                        }
                    ],
                },
            },
        },
    }


def fence_policy() -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencePolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "resources": [{"apiGroup": "apps", "resources": ["deployments"]}],
            "namespaceSelector": {"matchLabels": {SELECTED: "yes"}},
        },
    }


def holder_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": APP, "namespace": NS, "labels": {"app": APP}},
        "spec": {
            "serviceAccountName": APP,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": images.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sleep", "86400"],
                }
            ],
        },
    }


def policy_ready(env: NodeEnv) -> bool:
    out = env.kubectl("get", "fencepolicies.fencedlease.io", POLICY, "-o", "json", check=False)
    got = json.loads(out.stdout) if out.returncode == 0 else {}
    conditions = (got.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def enforced(env: NodeEnv) -> bool:
    """A labelled Deployment without a token is refused (server-side dry run)."""
    return apply(env, deployment(None), "--dry-run=server", check=False).returncode != 0


def grant(env: NodeEnv) -> tuple[str, int] | None:
    status = (env.get("fencedleases.fencedlease.io", LEASE, namespace=NS) or {}).get("status")
    status = status or {}
    holder, token = status.get("holder"), status.get("fencingToken")
    if status.get("phase") != "Held" or holder != APP or not token:
        return None
    return str(holder), int(token)


def ready_replicas(env: NodeEnv) -> int:
    found = env.get("deployment", "web", namespace=NS) or {}
    status = found.get("status") or {}
    if status.get("observedGeneration") != (found.get("metadata") or {}).get("generation"):
        return -1
    if status.get("updatedReplicas") != status.get("replicas"):
        return -1  # a rollout still under way
    return int(status.get("readyReplicas") or 0)


def gone(env: NodeEnv) -> bool:
    got = env.kubectl("get", "namespace", NS, "-o", "name", check=False)
    return got.returncode != 0 and "NotFound" in got.stderr


def why(env: NodeEnv) -> str:
    """What the namespace, its workloads and the fence's logs say (on a failure)."""
    parts = []
    left = env.kubectl("get", "deployments,replicasets,pods", "-n", NS, "-o", "wide", check=False)
    parts.append(left.stdout.strip() or left.stderr.strip())
    described = env.kubectl("describe", "deployment", "-n", NS, "web", check=False)
    parts.append(described.stdout[-3000:])
    conditions = env.kubectl(
        "get", "namespace", NS, "-o", "jsonpath={.status.conditions}", check=False
    )
    parts.append(f"namespace conditions: {conditions.stdout.strip()}")
    for component in ("webhook", "controller"):
        logs = env.kubectl(
            "logs", "-n", SYSTEM_NS,
            "-l", f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}",
            "--tail=400", "--prefix", check=False,
        )  # fmt: skip
        about = [ln for ln in logs.stdout.splitlines() if NS in ln or "rror" in ln][-60:]
        parts.append(f"--- {component} logs about {NS} ---\n" + "\n".join(about))
    return "\n".join(parts)


def until(env: NodeEnv, what: str, check: Any, bound: float = BOUND) -> Any:
    try:
        return wait_for(what, check, bound, every=1)
    except E2EError:
        raise E2EError(f"timed out waiting for {what}\n{why(env)}") from None


def test_a_fenced_deployment_rolls_out_scales_and_goes_with_its_namespace(env: NodeEnv) -> None:
    env.kubectl("create", "namespace", NS)
    env.kubectl("label", "namespace", NS, f"{SELECTED}=yes")
    env.kubectl("create", "serviceaccount", "-n", NS, APP)
    apply(env, holder_pod())
    apply(env, k8s.lease(LEASE, NS, duration=30, app=APP))
    apply(env, fence_policy())
    try:
        wait_for(f"FencePolicy {POLICY} Ready", lambda: policy_ready(env) or None, 120)
        wait_for("labelled Deployments fenced in the namespace", lambda: enforced(env) or None, 60)
        env.kubectl("wait", "-n", NS, "--for=condition=Ready", f"pod/{APP}", "--timeout=180s")
        holder, token = wait_for(f"{APP} granted {LEASE}", lambda: grant(env), 120)
        log(f"{holder} holds {LEASE} with token {token}")

        apply(env, deployment(token))
        until(env, "the fenced Deployment rolled out", lambda: ready_replicas(env) == 1 or None)
        t0 = time.monotonic()
        apply(env, deployment(token, version="2"))  # a rolling update, stamped
        until(env, "the rolling update done", lambda: ready_replicas(env) == 1 or None)
        found = env.get("deployment", "web", namespace=NS) or {}
        (container,) = found["spec"]["template"]["spec"]["containers"]
        assert container["env"] == [{"name": "VERSION", "value": "2"}]
        replicasets = env.kubectl("get", "replicasets", "-n", NS, "-o", "json")
        assert len(json.loads(replicasets.stdout)["items"]) == 2  # old and new
        RESULTS["fenced_deployment_rolling_update_seconds"] = round(time.monotonic() - t0, 1)
        stale = apply(env, deployment(token - 1, version="3"), check=False)
        assert stale.returncode != 0, "a write with a lower token was admitted"

        env.kubectl("scale", "deployment", "-n", NS, "web", "--replicas=2")  # an admin: admitted
        until(env, "two ready replicas after the scale", lambda: ready_replicas(env) == 2 or None)

        t0 = time.monotonic()
        env.kubectl("delete", "namespace", NS, "--wait=false")
        until(env, f"namespace {NS} gone", lambda: gone(env) or None)
        RESULTS["namespace_with_fenced_deployment_deleted_seconds"] = round(
            time.monotonic() - t0, 1
        )
    finally:
        env.kubectl(
            "delete", "fencepolicies.fencedlease.io", POLICY, "--ignore-not-found", check=False
        )
