"""A namespace holding fenced objects terminates with the real namespace controller (issue 42).

A node cluster of its own (``fencedlease local up --node``: kube-controller-manager runs the
namespace controller and the garbage collector), the chart installed with ConfigMaps among the
kinds its controller records. In a namespace a FencePolicy selects by label: a FencedLease held
by a Pod on the node, two ConfigMaps labelled ``fencedlease.io/lease`` carrying the grant's
token, and one labelled before the policy existed that carries no token. ``kubectl delete
namespace`` must then finish: the namespace controller deletes each kind as a collection, whose
items carry no ``request.name`` (the webhook names them from the stored object), and the
untokened one is a cluster deleter's delete of an object without a token (admitted at once).
Before that, the garbage collector deletes a fenced ConfigMap whose owner was deleted. The node's
kube-controller-manager runs each controller as its own service account, as kubeadm does.
docs/fenced-objects.md, "What is fenced, per subresource and writer". The API-server-level
version, by impersonation: tests/integration/test_fenced_object_paths.py.
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

NS = "nsdel-e2e"
LEASE = "nsdel"
APP = "nsdel-holder"
POLICY = "nsdel-e2e-configmaps"
SELECTED = "fencedlease-e2e/nsdel"
LEASE_LABEL = "fencedlease.io/lease"
TOKEN_ANNOTATION = "fencedlease.io/token"
DELETE_BOUND = 120.0


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    env = NodeEnv(state_root / "nsdel")
    with env.running():
        env.helm_install(
            '--set-json=fencedObjects.resources=[{"apiGroup":"","resources":["configmaps"]}]'
        )
        yield env


def apply(
    env: NodeEnv, obj: dict[str, Any], *flags: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return env.kubectl("apply", *flags, "-f", "-", input=json.dumps(obj), check=check)


def configmap(name: str, token: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {LEASE_LABEL: LEASE}}
    if token is not None:
        meta["annotations"] = {TOKEN_ANNOTATION: str(token)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}


def fence_policy() -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencePolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "resources": [{"apiGroup": "", "resources": ["configmaps"]}],
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
    """The API server's webhook configuration and namespace informer caught up: a labelled
    ConfigMap without a token is refused (server-side dry run: nothing is stored)."""
    probe = apply(env, configmap("probe", None), "--dry-run=server", check=False)
    return probe.returncode != 0


def grant(env: NodeEnv) -> tuple[str, int] | None:
    status = (env.get("fencedleases.fencedlease.io", LEASE, namespace=NS) or {}).get("status")
    status = status or {}
    holder, token = status.get("holder"), status.get("fencingToken")
    if status.get("phase") != "Held" or holder != APP or not token:
        return None
    return str(holder), int(token)


def gone(env: NodeEnv) -> bool:
    got = env.kubectl("get", "namespace", NS, "-o", "name", check=False)
    return got.returncode != 0 and "NotFound" in got.stderr


def stuck(env: NodeEnv) -> str:
    """Why the namespace (or an object in it) is still there: the namespace's conditions,
    what is left in it, the webhook's and the controller's logs about it."""
    parts = []
    conditions = env.kubectl(
        "get", "namespace", NS, "-o", "jsonpath={.status.conditions}", check=False
    )
    parts.append(f"conditions: {conditions.stdout.strip() or conditions.stderr.strip()}")
    left = env.kubectl(
        "get",
        "configmaps,pods,serviceaccounts,fencedleases.fencedlease.io",
        "-n",
        NS,
        "-o",
        "custom-columns=KIND:.kind,NAME:.metadata.name,LABELS:.metadata.labels,"
        "ANNOTATIONS:.metadata.annotations,FINALIZERS:.metadata.finalizers,"
        "DELETED:.metadata.deletionTimestamp",
        check=False,
    )
    parts.append(f"left:\n{left.stdout.strip() or left.stderr.strip()}")
    for component in ("webhook", "controller"):
        logs = env.kubectl(
            "logs",
            "-n",
            SYSTEM_NS,
            "-l",
            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}",
            "--tail=400",
            "--prefix",
            check=False,
        )
        about = [ln for ln in logs.stdout.splitlines() if NS in ln or "rror" in ln][-60:]
        parts.append(f"--- {component} logs about {NS} ---\n" + "\n".join(about))
    return "\n".join(parts)


def test_a_namespace_holding_fenced_configmaps_terminates(env: NodeEnv) -> None:
    env.kubectl("create", "namespace", NS)
    env.kubectl("label", "namespace", NS, f"{SELECTED}=yes")
    env.kubectl("create", "serviceaccount", "-n", NS, APP)
    apply(env, holder_pod())
    apply(env, k8s.lease(LEASE, NS, duration=30, app=APP))
    # Labelled before any policy existed: no token (issue 42 item 10).
    apply(env, configmap("untokened", None))
    apply(env, fence_policy())
    try:
        wait_for(f"FencePolicy {POLICY} Ready", lambda: policy_ready(env) or None, 120)
        wait_for("labelled ConfigMaps fenced in the namespace", lambda: enforced(env) or None, 60)
        env.kubectl("wait", "-n", NS, "--for=condition=Ready", f"pod/{APP}", "--timeout=180s")
        holder, token = wait_for(f"{APP} granted {LEASE}", lambda: grant(env), 120)
        log(f"{holder} holds {LEASE} with token {token}")
        # The admin writes with the holder's current token: an allowed writer
        # (chart_values: group:system:masters), as the shared scenarios publish.
        for name in ("fenced-1", "fenced-2"):
            apply(env, configmap(name, token))
        # The garbage collector deletes a fenced dependent of a deleted owner.
        env.kubectl("create", "configmap", "-n", NS, "owner")
        owner = env.get("configmap", "owner", namespace=NS) or {}
        owned = configmap("owned", token)
        owned["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": "owner",
                "uid": owner["metadata"]["uid"],
            }
        ]
        apply(env, owned)
        env.kubectl("delete", "configmap", "-n", NS, "owner")
        try:
            wait_for(
                "the GC deleting owned", lambda: not env.get("configmap", "owned", NS) or None, 60
            )
        except E2EError:
            raise E2EError(f"the garbage collector did not delete owned\n{stuck(env)}") from None
        stored = env.kubectl("get", "configmaps", "-n", NS, "-l", LEASE_LABEL, "-o", "json")
        tokens = {
            item["metadata"]["name"]: (item["metadata"].get("annotations") or {}).get(
                TOKEN_ANNOTATION
            )
            for item in json.loads(stored.stdout)["items"]
        }
        assert tokens == {"fenced-1": str(token), "fenced-2": str(token), "untokened": None}

        t0 = time.monotonic()
        env.kubectl("delete", "namespace", NS, "--wait=false")
        try:
            wait_for(f"namespace {NS} gone", lambda: gone(env) or None, DELETE_BOUND, every=1)
        except E2EError:
            raise E2EError(
                f"namespace {NS} not deleted in {DELETE_BOUND:.0f} s\n{stuck(env)}"
            ) from None
        RESULTS["namespace_with_fenced_objects_deleted_seconds"] = round(time.monotonic() - t0, 1)
    finally:
        env.kubectl(
            "delete", "fencepolicies.fencedlease.io", POLICY, "--ignore-not-found", check=False
        )
