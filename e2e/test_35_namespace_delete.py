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

pytestmark = pytest.mark.timeout(1500)

NS = "nsdel-e2e"
LEASE = "nsdel"
APP = "nsdel-holder"
POLICY = "nsdel-e2e-configmaps"
SELECTED = "fencedlease-e2e/nsdel"
DELETE_BOUND = 120.0


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    with fenced_objects_node(state_root / "nsdel", "", "configmaps") as env:
        yield env


def configmap(name: str, token: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {LEASE_LABEL: LEASE}}
    if token is not None:
        meta["annotations"] = {TOKEN_ANNOTATION: str(token)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": name}}


def enforced(env: NodeEnv) -> bool:
    """The API server's webhook configuration and namespace informer caught up: a labelled
    ConfigMap without a token is refused (server-side dry run: nothing is stored)."""
    probe = apply(env, configmap("probe", None), "--dry-run=server", check=False)
    return probe.returncode != 0


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
    parts += fence_logs_about(env, NS)
    return "\n".join(parts)


def test_a_namespace_holding_fenced_configmaps_terminates(env: NodeEnv) -> None:
    fenced = FencedNamespace(env, NS, LEASE, APP, POLICY, SELECTED, "", "configmaps")
    fenced.create()
    # Labelled before any policy existed: no token (issue 42 item 10).
    apply(env, configmap("untokened", None))
    apply(env, fenced.fence_policy())
    try:
        _, token = fenced.held("labelled ConfigMaps fenced in the namespace", lambda: enforced(env))
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
            wait_for(f"namespace {NS} gone", lambda: fenced.gone() or None, DELETE_BOUND, every=1)
        except E2EError:
            raise E2EError(
                f"namespace {NS} not deleted in {DELETE_BOUND:.0f} s\n{stuck(env)}"
            ) from None
        RESULTS["namespace_with_fenced_objects_deleted_seconds"] = round(time.monotonic() - t0, 1)
    finally:
        fenced.delete_policy()
