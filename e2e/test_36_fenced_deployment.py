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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.node import RESULTS, E2EError, NodeEnv
from e2e.scenarios import wait_for
from e2e.writers import (
    LEASE_LABEL,
    TOKEN_ANNOTATION,
    FencedNamespace,
    apply,
    fence_logs_about,
    fenced_objects_node,
)
from fencedlease.local import images

pytestmark = pytest.mark.timeout(1500)

NS = "fdeploy-e2e"
LEASE = "fdeploy"
APP = "fdeploy-holder"
POLICY = "fdeploy-e2e-deployments"
SELECTED = "fencedlease-e2e/fdeploy"
BOUND = 180.0


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    with fenced_objects_node(state_root / "fdeploy", "apps", "deployments") as env:
        yield env


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


def enforced(env: NodeEnv) -> bool:
    """A labelled Deployment without a token is refused (server-side dry run)."""
    return apply(env, deployment(None), "--dry-run=server", check=False).returncode != 0


def ready_replicas(env: NodeEnv) -> int:
    found = env.get("deployment", "web", namespace=NS) or {}
    status = found.get("status") or {}
    if status.get("observedGeneration") != (found.get("metadata") or {}).get("generation"):
        return -1
    if status.get("updatedReplicas") != status.get("replicas"):
        return -1  # a rollout still under way
    return int(status.get("readyReplicas") or 0)


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
    parts += fence_logs_about(env, NS)
    return "\n".join(parts)


def until(env: NodeEnv, what: str, check: Any, bound: float = BOUND) -> Any:
    try:
        return wait_for(what, check, bound, every=1)
    except E2EError:
        raise E2EError(f"timed out waiting for {what}\n{why(env)}") from None


def test_a_fenced_deployment_rolls_out_scales_and_goes_with_its_namespace(env: NodeEnv) -> None:
    fenced = FencedNamespace(env, NS, LEASE, APP, POLICY, SELECTED, "apps", "deployments")
    fenced.create()
    apply(env, fenced.fence_policy())
    try:
        _, token = fenced.held(
            "labelled Deployments fenced in the namespace", lambda: enforced(env)
        )

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
        until(env, f"namespace {NS} gone", lambda: fenced.gone() or None)
        RESULTS["namespace_with_fenced_deployment_deleted_seconds"] = round(
            time.monotonic() - t0, 1
        )
    finally:
        fenced.delete_policy()
