"""Cluster-agnostic end-to-end scenario: handover with a greater token, stale publish refused.

Runs against any cluster with fencedlease installed (operator + fence webhook)::

    python -m e2e.scenarios --kubeconfig K [--namespace N] [--no-kubelet] [--kubectl PATH]

With a kubelet (kind), the holder Pods are the `e2e-worker` Deployment of e2e/manifests/: they
read their token through the downward API and publish the FencedArtifact themselves.  With
``--no-kubelet`` (the local control plane of `make test`: no nodes), the scenario creates the
candidate Pods as API objects, marks them Running/Ready through the status subresource, and
publishes on the holder's behalf with the token from the holder Pod's annotation.

Steps: wait for a holder and its token t1 (status and Pod annotation agree) and a publish with
t1; kill the holder; wait for a different holder with t2 > t1 and a publish with t2; then a
publish with t1 (update of the artifact, and create of a fresh artifact: the high-water mark is
per lease) must be refused with ``stale_fence``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

LEASE = "e2e-writer"
ARTIFACT = "e2e-report"
WORKER_LABEL = "app=e2e-worker"
T = TypeVar("T")


class ScenarioError(AssertionError):
    """A scenario step did not hold; the message says which."""


@dataclass
class Kube:
    kubeconfig: Path
    namespace: str
    kubectl_bin: str = "kubectl"

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl_bin, f"--kubeconfig={self.kubeconfig}", "-n", self.namespace, *args]
        result = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=60, check=False
        )
        if check and result.returncode != 0:
            raise ScenarioError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        result = self.run("get", kind, name, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def apply(self, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "-f", "-", input=json.dumps(obj), check=check)


def log(msg: str) -> None:
    print(f"[e2e] {msg}", file=sys.stderr, flush=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def lease_manifest(namespace: str, duration: int) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedLease",
        "metadata": {"name": LEASE, "namespace": namespace},
        "spec": {
            "leaseDurationSeconds": duration,
            "holderSelector": {"matchLabels": {"app": "e2e-worker"}},
        },
    }


def artifact_manifest(namespace: str, name: str, token: int, object_ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "leaseRef": {"name": LEASE},
            "fencingToken": token,
            "objectRef": object_ref,
            "operationId": f"{object_ref}-{uuid.uuid4().hex[:6]}",
        },
    }


def make_ready(kube: Kube, pod: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    status = {"status": {"phase": "Running", "startTime": now, "conditions": conditions}}
    kube.run("patch", "pod", pod, "--subresource=status", "--type=merge", "-p", json.dumps(status))


def create_candidates(kube: Kube, count: int) -> None:
    for i in range(count):
        name = f"e2e-worker-{i}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "e2e-worker"}},
            "spec": {"containers": [{"name": "worker", "image": "e2e.invalid/worker:none"}]},
        }
        kube.apply(pod)
        make_ready(kube, name)
        time.sleep(1.1)  # distinct creation timestamps: the oldest Ready candidate wins


def holder_of(kube: Kube, exclude: str | None = None) -> tuple[str, int] | None:
    lease = kube.get("fencedleases.fencedlease.io", LEASE)
    status = (lease or {}).get("status") or {}
    holder, token = status.get("holder"), status.get("fencingToken")
    if not holder or not token or holder == exclude or status.get("phase") != "Held":
        return None
    pod = kube.get("pod", holder) or {}
    annotations = pod.get("metadata", {}).get("annotations") or {}
    if annotations.get(f"token.fencedlease.io/{LEASE}") != str(token):
        return None  # the Pod has not been told yet
    if annotations.get(f"state.fencedlease.io/{LEASE}") != "held":
        return None
    return str(holder), int(token)


def publish(kube: Kube, name: str, token: int, object_ref: str) -> subprocess.CompletedProcess[str]:
    return kube.apply(artifact_manifest(kube.namespace, name, token, object_ref), check=False)


def artifact_token(kube: Kube) -> int | None:
    obj = kube.get("fencedartifacts.fencedlease.io", ARTIFACT)
    return int(obj["spec"]["fencingToken"]) if obj else None


def run(kube: Kube, no_kubelet: bool, timeout: float, duration: int) -> dict[str, Any]:
    kube.apply(lease_manifest(kube.namespace, duration))
    if no_kubelet:
        create_candidates(kube, 3)

    holder1, t1 = wait_for("a first holder", lambda: holder_of(kube), timeout)
    log(f"holder {holder1} has token {t1}")
    if no_kubelet:
        result = publish(kube, ARTIFACT, t1, f"reports/{holder1}-{t1}")
        if result.returncode != 0:
            raise ScenarioError(f"publish with the current token t1={t1} failed: {result.stderr}")
    wait_for(f"a publish with t1={t1}", lambda: artifact_token(kube) == t1 or None, timeout)

    log(f"killing holder {holder1}")
    delete = ["delete", "pod", holder1, "--wait=false"]
    kube.run(*delete, *(["--grace-period=0", "--force"] if no_kubelet else []))
    holder2, t2 = wait_for("a new holder", lambda: holder_of(kube, exclude=holder1), timeout * 2)
    log(f"handover to {holder2} with token {t2}")
    if holder2 == holder1 or t2 <= t1:
        raise ScenarioError(f"handover must give a greater token: t1={t1} t2={t2}")
    if no_kubelet:
        result = publish(kube, ARTIFACT, t2, f"reports/{holder2}-{t2}")
        if result.returncode != 0:
            raise ScenarioError(f"publish with the new token t2={t2} failed: {result.stderr}")
    wait_for(f"a publish with t2={t2}", lambda: artifact_token(kube) == t2 or None, timeout)

    stale_update = publish(kube, ARTIFACT, t1, f"reports/{holder1}-{t1}-late")
    stale_create = publish(kube, f"{ARTIFACT}-late", t1, f"reports/{holder1}-{t1}-late")
    for what, result in (("update", stale_update), ("create", stale_create)):
        if result.returncode == 0 or "stale_fence" not in result.stderr:
            raise ScenarioError(
                f"stale {what} with t1={t1} after t2={t2} was not refused with stale_fence: "
                f"rc={result.returncode} {result.stdout} {result.stderr}"
            )
        log(f"stale {what} refused: {result.stderr.strip().splitlines()[-1]}")
    if artifact_token(kube) != t2:
        raise ScenarioError("the artifact moved backwards")
    return {"holder1": holder1, "t1": t1, "holder2": holder2, "t2": t2}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", default="fencedlease-e2e")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument(
        "--no-kubelet",
        action="store_true",
        help="create candidate Pods as API objects and set their readiness (no nodes needed)",
    )
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--lease-duration", type=int, default=10)
    args = parser.parse_args(argv)
    kube = Kube(args.kubeconfig, args.namespace, args.kubectl)
    if args.no_kubelet and kube.get("namespace", args.namespace) is None:
        kube.run("create", "namespace", args.namespace)
    try:
        outcome = run(kube, args.no_kubelet, args.timeout, args.lease_duration)
    except ScenarioError as exc:
        log(f"FAILED: {exc}")
        return 1
    print(json.dumps(outcome))
    log("PASSED: handover with a greater token; stale publish refused with stale_fence")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
