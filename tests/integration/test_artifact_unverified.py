"""Issue 31, "the class of defect", on FencedArtifacts: through the real API server and a
running controller.

The controller runs without the fence webhook (``--role controller``: every artifact write
reaches storage unchecked, as with the webhook bypassed) and an older FencedArtifact CRD that
validates neither spec nor status lets in what the shipped one refuses.  Each artifact below
must be reported ``UnverifiedToken``, its status rewritten from the verified token or cleared,
and the lease's high-water mark must stay at the one verified token.  Pure-logic versions of
the same cases are in ``tests/unit/test_artifact_recorder.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import (
    apply,
    crd_changed,
    events,
    get,
    lease,
    patch_status,
    ready_pods,
    running_operator,
    wait_for,
    wait_held,
)
from .store_checks import mark_of

pytestmark = pytest.mark.timeout(180)

ARTIFACT_CRD = Path(__file__).resolve().parents[2] / "crds" / "fencedartifacts.fencedlease.io.yaml"


@pytest.fixture(scope="module")
def controller(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    with running_operator(
        cluster, tmp_path_factory.mktemp("unverified-artifacts"), "--role", "controller"
    ) as proc:
        yield proc


def without_validation(crd: dict[str, Any]) -> None:
    """The FencedArtifact CRD with spec and status of any shape (a cluster whose CRD is older
    than the operator's)."""
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for part in ("spec", "status"):
        props[part] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def create(cluster: LocalCluster, namespace: str, name: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(body))


def reports(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    selector = f"reason=UnverifiedToken,involvedObject.name={name}"
    return [str(e["message"]) for e in events(cluster, namespace, selector)]


def status_of(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    return (get(cluster, "fa", name, namespace) or {}).get("status") or {}


def test_unverified_artifacts_are_reported_cleared_and_never_move_the_mark(
    cluster: LocalCluster, namespace: str, controller: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "ua-a", app="ua")
    apply(cluster, lease("job", namespace, app="ua"))
    token = int(wait_held(cluster, "job", namespace)["fencingToken"])
    forged = token + 10_000  # never issued
    names = ("no-lease", "forged", "boolean")
    try:
        with crd_changed(cluster, ARTIFACT_CRD, without_validation):
            # 1: no leaseRef and a token that is no integer: was skipped without a word.
            create(cluster, namespace, "no-lease", {"fencingToken": "12", "objectRef": "x"})
            # 2: a token never issued, and a status claiming it was accepted.
            spec = {"leaseRef": {"name": "job"}, "fencingToken": forged, "objectRef": "x"}
            create(cluster, namespace, "forged", spec)
            patch_status(cluster, "fa", "forged", namespace, {"acceptedFence": forged})
            # 3: the verified token, accepted; then its acceptedFence forged as a boolean.
            spec = {"leaseRef": {"name": "job"}, "fencingToken": token, "objectRef": "x"}
            create(cluster, namespace, "boolean", spec)
            wait_for(
                lambda: status_of(cluster, namespace, "boolean").get("acceptedFence") == token,
                what="the verified artifact accepted",
            )
            patch_status(cluster, "fa", "boolean", namespace, {"acceptedFence": True})

            no_lease = wait_for(
                lambda: reports(cluster, namespace, "no-lease"),
                what="an UnverifiedToken Event for the spec that does not parse",
            )
            assert any("spec.leaseRef.name" in m for m in no_lease), no_lease
            wait_for(
                lambda: any(
                    f"status.acceptedFence {forged}" in m
                    for m in reports(cluster, namespace, "forged")
                ),
                what="an UnverifiedToken Event for the forged acceptedFence",
            )
            wait_for(
                lambda: "acceptedFence" not in status_of(cluster, namespace, "forged"),
                what="the forged acceptedFence cleared",
            )
            wait_for(
                lambda: any(
                    "status.acceptedFence" in m for m in reports(cluster, namespace, "boolean")
                ),
                what="an UnverifiedToken Event for the boolean acceptedFence",
            )
            wait_for(
                lambda: status_of(cluster, namespace, "boolean").get("acceptedFence") == token,
                what="the boolean acceptedFence rewritten from the verified token",
            )
            assert mark_of(cluster, namespace, "job") == token  # nothing unverified moved it
            # Gone while this CRD still admits them (the controller lifts the finalizer).
            cluster.kubectl("delete", "fa", *names, "-n", namespace, "--wait=false")
            wait_for(
                lambda: all(get(cluster, "fa", n, namespace) is None for n in names),
                what="the artifacts deleted",
            )
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator log:\n{controller.log_tail(80)}") from error
