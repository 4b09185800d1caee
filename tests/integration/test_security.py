"""The adversarial review's defects, through the real API server and a running operator.

One operator (controller + webhook registered by URL, scoped to one namespace) serves the
module; each test names the defect it pins down and fails on the admission-time-advance
design.  Pure-logic versions of the same cases are in ``tests/unit/test_webhook_security.py``.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fencedlease.local.cluster import LocalCluster

from .k8s import (
    apply,
    crd_changed,
    events,
    get,
    lease,
    lease_status,
    patch_status,
    ready_pods,
    running_fence,
    set_ready,
    wait_for,
    wait_held,
    wait_token_above,
)
from .store_checks import mark_of

pytestmark = pytest.mark.timeout(180)


@dataclass
class Operator:
    cluster: LocalCluster
    namespace: str
    webhook_port: int
    ca_file: Path

    def post_review(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST straight to the webhook, as anyone on the network could."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.webhook_port}/fence",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def publish(self, name: str, lease_name: str, token: int, ref: str) -> tuple[bool, str]:
        spec = {"leaseRef": {"name": lease_name}, "fencingToken": token, "objectRef": ref}
        if get(self.cluster, "fa", name, self.namespace) is None:
            body = {
                "apiVersion": "fencedlease.io/v1alpha1",
                "kind": "FencedArtifact",
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": spec,
            }
            out = self.cluster.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
        else:
            out = self.cluster.kubectl(
                "patch",
                "fa",
                name,
                "-n",
                self.namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": spec}),
                check=False,
            )
        return out.returncode == 0, out.stderr


def start_operator(
    cluster: LocalCluster, tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[Operator]:
    namespace = f"sec-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    with running_fence(cluster, tmp_path, namespace, env) as (_, port):
        yield Operator(cluster, namespace, port, tmp_path / "webhook-pki" / "ca.crt")


@pytest.fixture(scope="module")
def op(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    yield from start_operator(cluster, tmp_path_factory.mktemp("security"))


def review(op: Operator, name: str, lease_name: str, token: int) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "resource": {
                "group": "fencedlease.io",
                "version": "v1alpha1",
                "resource": "fencedartifacts",
            },
            "operation": "CREATE",
            "namespace": op.namespace,
            "name": name,
            "object": {
                "metadata": {"name": name, "namespace": op.namespace},
                "spec": {"leaseRef": {"name": lease_name}, "fencingToken": token, "objectRef": "x"},
            },
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
        },
    }


# -------------------------------------------------------------------------------- tests


def test_a_forged_status_token_stops_no_grant(op: Operator) -> None:
    """Defect 1: one status write with 2^62 used to stop every grant of the operator."""
    ready_pods(op.cluster, op.namespace, "fs-a", app="fs")
    apply(op.cluster, lease("forged", op.namespace, app="fs"))
    wait_held(op.cluster, "forged", op.namespace)
    patch_status(op.cluster, "fl", "forged", op.namespace, {"fencingToken": 2**62})
    ready_pods(op.cluster, op.namespace, "fs-b", app="fs2")
    apply(op.cluster, lease("innocent", op.namespace, app="fs2"))
    held = wait_held(op.cluster, "innocent", op.namespace)
    assert held["fencingToken"] < 2**62
    reported = events(op.cluster, op.namespace, "reason=UnverifiedToken")
    assert any(e["involvedObject"]["name"] == "forged" for e in reported), reported
    # The operator puts back the signed truth for the lease whose status was forged.
    wait_for(
        lambda: lease_status(op.cluster, "forged", op.namespace).get("fencingToken", 2**62) < 2**62,
        what="the forged status token replaced by the etcd grant",
    )


LEASE_CRD = Path(__file__).resolve().parents[2] / "crds" / "fencedleases.fencedlease.io.yaml"


def patch_lease_status(op: Operator, name: str, status: dict[str, Any]) -> Any:
    return patch_status(op.cluster, "fl", name, op.namespace, status, check=False)


def without_the_phase_enum(crd: dict[str, Any]) -> None:
    """The FencedLease CRD as a cluster whose CRDs were not upgraded has it (revision 2:
    ``status.phase`` any string)."""
    phase = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"][
        "properties"
    ]["phase"]
    del phase["enum"]


def test_a_forged_status_that_does_not_parse_is_reported_and_rewritten(op: Operator) -> None:
    """Issue 31, defect 2: a forged token beside ``phase: Bogus`` made the status fail to
    parse; the controller kept an empty copy, reported nothing and never rewrote it. The
    shipped CRD refuses the phase; a cluster with an older CRD lets it in, and the operator
    must treat it as it treats any forged token."""
    ready_pods(op.cluster, op.namespace, "bogus-a", app="bogus")
    apply(op.cluster, lease("bogus", op.namespace, app="bogus"))
    held = wait_held(op.cluster, "bogus", op.namespace)
    forged = {"fencingToken": 2**62, "phase": "Bogus", "holder": "evil-pod"}
    refused = patch_lease_status(op, "bogus", forged)
    assert refused.returncode != 0 and "status.phase" in refused.stderr, refused
    with crd_changed(op.cluster, LEASE_CRD, without_the_phase_enum):
        wait_for(
            lambda: patch_lease_status(op, "bogus", forged).returncode == 0,
            what="the older CRD to accept phase Bogus",
        )

        def reported() -> list[dict[str, Any]]:
            selector = "reason=UnverifiedToken,involvedObject.name=bogus"
            return [
                e
                for e in events(op.cluster, op.namespace, selector)
                if "does not parse" in e["message"]
            ]

        found = wait_for(reported, what="an UnverifiedToken Event for the unparsable status")
        assert "status.phase" in found[0]["message"], found
        rewritten = wait_for(
            lambda: (
                (s := lease_status(op.cluster, "bogus", op.namespace)).get("phase") == "Held" and s
            ),
            what="the forged status replaced by the signed grant from etcd",
        )
        assert (rewritten["holder"], rewritten["fencingToken"]) == (
            held["holder"],
            held["fencingToken"],
        )


def test_a_signed_status_another_writer_puts_over_ours_is_put_right(op: Operator) -> None:
    """A replica of the previous release wrote ``phase: Unavailable`` over a held grant during
    ``helm upgrade`` (e2e/test_40_day2.py), its proof valid: the leader kept its own last
    write as the truth, no pass found anything to write and the lease showed Unavailable for
    good. The grant renews every 40 s here: only the status event itself can bring the
    rewrite within the bound."""
    ready_pods(op.cluster, op.namespace, "sw-a", app="sw")
    apply(op.cluster, lease("signed-writer", op.namespace, duration=120, app="sw"))
    held = wait_held(op.cluster, "signed-writer", op.namespace)
    assert patch_lease_status(op, "signed-writer", {**held, "phase": "Unavailable"}).returncode == 0
    rewritten = wait_for(
        lambda: (
            (s := lease_status(op.cluster, "signed-writer", op.namespace)).get("phase") == "Held"
            and s
        ),
        timeout=20,
        what="the status another writer put over ours put right",
    )
    assert (rewritten["fencingToken"], rewritten["leaseId"]) == (
        held["fencingToken"],
        held["leaseId"],
    )


def test_a_pod_recreated_under_the_holders_name_gets_a_new_token(op: Operator) -> None:
    """Defect 2: the grant belonged to the Pod name; a StatefulSet-style re-create kept it."""
    ready_pods(op.cluster, op.namespace, "sts-0", app="sts")
    apply(op.cluster, lease("sts", op.namespace, duration=2, app="sts"))
    first = wait_held(op.cluster, "sts", op.namespace)
    assert first["holder"] == "sts-0"
    op.cluster.kubectl("delete", "pod", "sts-0", "-n", op.namespace, "--wait=true")
    ready_pods(op.cluster, op.namespace, "sts-0", app="sts")  # same name, new UID
    second = wait_token_above(op.cluster, "sts", op.namespace, first["fencingToken"])
    assert second["holder"] == "sts-0" and second["leaseId"] != first["leaseId"]


def test_a_retried_admission_never_burns_a_strictly_greater_grant(op: Operator) -> None:
    """Defect 3: a PATCH that lost a write race was re-admitted and refused as stale."""
    ready_pods(op.cluster, op.namespace, "rg-a", "rg-b", app="rg")
    apply(op.cluster, lease("race", op.namespace, duration=1, app="rg", policy="StrictlyGreater"))
    status = wait_held(op.cluster, "race", op.namespace)
    ok, err = op.publish("race-cat", "race", status["fencingToken"], "v0")
    assert ok, err
    for round_ in range(4):
        set_ready(op.cluster, status["holder"], op.namespace, False)
        previous = status
        status = wait_token_above(op.cluster, "race", op.namespace, previous["fencingToken"])
        set_ready(op.cluster, previous["holder"], op.namespace, True)
        stop = threading.Event()

        def relabel(i: int) -> None:  # metadata writes racing the holder's spec write
            n = 0
            while not stop.is_set() and n < 20:
                n += 1
                op.cluster.kubectl(
                    "label",
                    "fa",
                    "race-cat",
                    "-n",
                    op.namespace,
                    f"r{i}={round_}-{n}",
                    "--overwrite",
                    check=False,
                )

        racers = [threading.Thread(target=relabel, args=(i,)) for i in range(3)]
        for t in racers:
            t.start()
        try:
            ok, err = op.publish("race-cat", "race", status["fencingToken"], f"v{round_ + 1}")
        finally:
            stop.set()
            for t in racers:
                t.join(30)
        assert ok, f"round {round_}: the holder's first write was refused: {err}"
        shown = get(op.cluster, "fa", "race-cat", op.namespace) or {}
        assert shown["spec"]["fencingToken"] == status["fencingToken"]


def test_a_forged_review_changes_no_fencing_state(op: Operator) -> None:
    """Defect 4: a review POSTed straight to /fence raised the mark and refused the holder."""
    ready_pods(op.cluster, op.namespace, "fr-a", app="fr")
    apply(op.cluster, lease("forge", op.namespace, app="fr", policy="StrictlyGreater"))
    token = wait_held(op.cluster, "forge", op.namespace)["fencingToken"]
    for _ in range(3):
        code, reply = op.post_review(json.dumps(review(op, "forge-cat", "forge", token)).encode())
        assert code == 200 and reply["response"]["allowed"] is True
    assert mark_of(op.cluster, op.namespace, "forge") is None  # nothing committed: no mark
    ok, err = op.publish("forge-cat", "forge", token, "real")
    assert ok, err  # the holder's first real write is admitted
    wait_for(
        lambda: mark_of(op.cluster, op.namespace, "forge") == token,
        what="the mark advanced from the committed write",
    )
    # Delete and re-create cannot slip below it: the finalizer holds until it is recorded.
    op.cluster.kubectl("delete", "fa", "forge-cat", "-n", op.namespace, "--wait=true")
    ok, err = op.publish("forge-cat", "forge", token, "again")
    assert not ok and "stale_fence" in err, err


def test_malformed_bodies_are_invalid_not_errors(op: Operator) -> None:
    """Defect 6: deep nesting raised RecursionError (HTTP 500); bad unicode was 'unavailable';
    v1beta1 reviews were answered."""
    deep = ("[" * 50_000 + "]" * 50_000).encode()
    code, reply = op.post_review(deep)
    assert code == 400 and reply["error"].startswith("invalid:")
    body = review(op, "x\ud800", "l", 5)
    code, reply = op.post_review(json.dumps(body).encode())
    assert code == 200 and reply["response"]["status"]["message"].startswith("invalid: name")
    body = review(op, "ok", "l", 5)
    body["apiVersion"] = "admission.k8s.io/v1beta1"
    code, reply = op.post_review(json.dumps(body).encode())
    assert code == 200 and not reply["response"]["allowed"]
    assert reply["response"]["status"]["message"].startswith("invalid:")


def test_non_pod_writers_are_refused_by_default(cluster: LocalCluster, tmp_path: Path) -> None:
    """Defect 5: any non-Pod identity could write with a valid (e.g. stolen) token."""
    for strict in start_operator(cluster, tmp_path, env={"FENCEDLEASE_ALLOWED_WRITERS": ""}):
        ready_pods(cluster, strict.namespace, "np-a", app="np")
        apply(cluster, lease("np", strict.namespace, app="np"))
        token = wait_held(cluster, "np", strict.namespace)["fencingToken"]
        ok, err = strict.publish("np-cat", "np", token, "x")
        assert not ok and "holder_mismatch" in err and "allowed writers" in err, err
