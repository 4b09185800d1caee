"""The examples as a user runs them, and per-item claims, on a real node (one cluster).

A node cluster of its own with the chart installed from the locally built images; the operator
image is also tagged ``ghcr.io/fencedlease/fencedlease:<appVersion>`` (the name the manifests
give, ``images.release_name``), so the files apply **verbatim**:

- ``docs/examples/lease.yaml`` and ``docs/examples/worker-pod.yaml`` (namespace ``default``):
  the worker reads its token from the downward-API files and publishes FencedArtifact
  ``report-july`` with it.
- ``examples/report-writer/manifests.yaml`` (``kubectl apply -n``): the holder publishes; frozen
  with ``ctr tasks pause`` it goes NotReady and the other writer is granted a greater token and
  publishes; the thawed writer's write with its old grant (README step 3, run in its own Pod)
  is refused with ``stale_fence``, exit 11, and the artifact keeps the new writer's object.
- Claims (docs/client.md, "Claims"): 10 worker Pods (``e2e/claims_worker.py``) process 1,000
  items under a template lease; one is frozen while it holds an item; the item is re-claimed
  by another Pod with a greater token and published; the thawed Pod's late write is refused
  (``stale_fence``). Every item is published exactly once (one applied write per item, each
  artifact at generation 1). Claim latency p50/p99 and items/s go to the e2e figures.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.node import RESULTS, ROOT, E2EError, NodeEnv, log
from e2e.scenarios import wait_for

pytestmark = pytest.mark.timeout(900)

DOCS = ROOT / "docs" / "examples"
WRITER = ROOT / "examples" / "report-writer"
RW_NS = "report-writer"
CLAIMS_NS = "claims"
TEMPLATE = "items"
WORKERS = 10
ITEMS = 1000
FROZEN = 3  # the worker frozen mid-item
# Its first item: no other worker can take it first (each does its own share before sweeping
# up the rest), and the others keep working while it is frozen.
HOLD_ITEM = f"item-{FROZEN:04d}"


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    started = time.monotonic()
    env = NodeEnv(state_root / "examples")
    try:
        with env.running():
            try:
                env.tag_release_image()
                env.helm_install()
                RESULTS["examples_cluster_ready_s"] = round(time.monotonic() - started, 1)
                yield env
            finally:
                print(explain(env))
    finally:
        RESULTS["examples_module_s"] = round(time.monotonic() - started, 1)


def explain(env: NodeEnv) -> str:
    """The examples' Pods, leases, artifacts and logs (printed after the module)."""
    if not env.kubeconfig.exists():
        return ""
    parts = []
    for args in (
        ("get", "pods,fencedleases,fencedclaims", "-A", "-o", "wide"),
        ("get", "fencedartifacts", "-n", "default"),
        ("get", "fencedartifacts", "-n", RW_NS),
        ("logs", "-n", "default", "report-writer-1", "--tail=20"),
        ("logs", "-n", RW_NS, "-l", "app=report-writer", "--tail=20", "--prefix"),
        ("logs", "-n", CLAIMS_NS, "-l", "app=claims-worker", "--tail=5", "--prefix"),
    ):
        got = env.kubectl(*args, check=False, timeout=30)
        parts.append(f"--- kubectl {' '.join(args)} ---\n{got.stdout[-4000:]}{got.stderr}")
    return "\n".join(parts)


def pods(env: NodeEnv, ns: str, selector: str) -> list[str]:
    got = env.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json")
    return [
        str(p["metadata"]["name"])
        for p in json.loads(got.stdout)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]


def holder(
    env: NodeEnv, ns: str, lease: str, exclude: str | None = None
) -> tuple[str, int, str] | None:
    """(holder Pod, token, lease id) of ``lease`` once Held by a live Pod other than
    ``exclude``."""
    status = (env.get("fencedleases.fencedlease.io", lease, namespace=ns) or {}).get("status")
    status = status or {}
    name, token = status.get("holder"), status.get("fencingToken")
    if status.get("phase") != "Held" or not name or name == exclude or not token:
        return None
    if env.get("pod", str(name), namespace=ns) is None:
        return None
    return str(name), int(token), str(status.get("leaseId"))


def artifact(env: NodeEnv, ns: str, name: str) -> dict[str, Any]:
    return dict(
        (env.get("fencedartifacts.fencedlease.io", name, namespace=ns) or {}).get("spec") or {}
    )


def container_id(env: NodeEnv, ns: str, pod: str) -> str:
    statuses = ((env.get("pod", pod, namespace=ns) or {}).get("status") or {}).get(
        "containerStatuses"
    ) or [{}]
    cid = str(statuses[0].get("containerID", "")).split("://", 1)[-1]
    if not cid:
        raise E2EError(f"no container of {pod}")
    return cid


def logs(env: NodeEnv, ns: str, pod: str) -> str:
    return env.kubectl("logs", "-n", ns, pod, check=False).stdout


# ---------------------------------------------------------------------- docs/examples


def test_docs_worker_pod_reads_its_token_and_publishes(env: NodeEnv) -> None:
    """The quick start on a node (docs/install.md): lease.yaml and worker-pod.yaml as they are."""
    env.kubectl("apply", "-f", str(DOCS / "lease.yaml"), "-f", str(DOCS / "worker-pod.yaml"))
    pod, token, _ = wait_for(
        "report-july held by report-writer-1", lambda: holder(env, "default", "report-july"), 240
    )
    assert pod == "report-writer-1"
    wait_for(
        f"FencedArtifact report-july published with token {token}",
        lambda: artifact(env, "default", "report-july").get("fencingToken") == token or None,
        120,
    )
    text = logs(env, "default", pod)
    assert f"grant: token {token}" in text, text  # read from /etc/fencedlease in the Pod
    assert f"applied: token {token}" in text, text
    RESULTS["docs_worker_pod"] = {"token": token}


# ---------------------------------------------------------------------- examples/report-writer


def test_report_writer_hands_over_and_the_old_writers_write_is_refused(env: NodeEnv) -> None:
    """examples/report-writer/README.md on a node: publish, hand over, stale refused."""
    env.kubectl("create", "namespace", RW_NS)
    env.kubectl("apply", "-n", RW_NS, "-f", str(WRITER / "manifests.yaml"))
    first, t1, id1 = wait_for(
        "a writer holding report-july", lambda: holder(env, RW_NS, "report-july"), 240
    )
    wait_for(
        f"{first} publishing with token {t1}",
        lambda: artifact(env, RW_NS, "report-july").get("fencingToken") == t1 or None,
        120,
    )
    cid = container_id(env, RW_NS, first)
    log(f"freezing writer {first} (token {t1}) with ctr tasks pause")
    env.containerd.ctr("tasks", "pause", cid)
    try:
        second, t2, _ = wait_for(
            "the other writer granted report-july",
            lambda: holder(env, RW_NS, "report-july", exclude=first),
            120,
        )
        assert t2 > t1
        wait_for(
            f"{second} publishing with token {t2}",
            lambda: artifact(env, RW_NS, "report-july").get("fencingToken") == t2 or None,
            120,
        )
    finally:
        env.containerd.ctr("tasks", "resume", cid, check=False)
    visible = artifact(env, RW_NS, "report-july")["objectRef"]
    late = env.kubectl(
        "exec", "-n", RW_NS, first, "--",
        "python", "/app/report_writer.py", "run", "--catalog", "artifact",
        "--store", "/tmp/objects", "--token", str(t1), "--lease-id", id1,
        check=False, timeout=60,
    )  # fmt: skip
    assert late.returncode == 11 and "stale_fence" in late.stderr, (late.returncode, late.stderr)
    after = artifact(env, RW_NS, "report-july")
    assert after["fencingToken"] == t2 and after["objectRef"] == visible, after
    assert f"applied: token {t2}" in logs(env, RW_NS, second)
    RESULTS["report_writer"] = {"frozen": first, "t1": t1, "holder": second, "t2": t2}


# ---------------------------------------------------------------------- claims


def claims_manifests() -> str:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencedLease",
            "metadata": {
                "name": TEMPLATE,
                "annotations": {"fencedlease.io/claim-template": "true"},
            },
            "spec": {
                "leaseDurationSeconds": 5,
                "holderSelector": {"matchLabels": {"app": "claims-worker"}},
            },
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "claims-worker"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "claims-worker"},
            "rules": [
                {
                    "apiGroups": ["fencedlease.io"],
                    "resources": ["fencedclaims"],
                    "verbs": ["create", "get", "delete"],
                },
                {
                    "apiGroups": ["fencedlease.io"],
                    "resources": ["fencedartifacts"],
                    "verbs": ["get", "list", "create", "update", "patch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "claims-worker"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "claims-worker",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "claims-worker"}],
        },
    ]
    env_from_pod = [
        {"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
        for n, f in (("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid"))
    ]
    for i in range(WORKERS):
        settings = {
            "WORKER_INDEX": str(i),
            "WORKERS": str(WORKERS),
            "ITEMS": str(ITEMS),
            "TEMPLATE": TEMPLATE,
            "HOLD_ITEM": HOLD_ITEM if i == FROZEN else "",
        }
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"claims-worker-{i}", "labels": {"app": "claims-worker"}},
                "spec": {
                    "serviceAccountName": "claims-worker",
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "worker",
                            "image": "ghcr.io/fencedlease/fencedlease:0.1.0",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python", "/code/claims_worker.py"],
                            "env": env_from_pod
                            + [{"name": k, "value": v} for k, v in settings.items()],
                            "readinessProbe": {
                                "httpGet": {"path": "/healthz", "port": 8080},
                                "periodSeconds": 1,
                                "failureThreshold": 2,
                                "timeoutSeconds": 1,
                            },
                            "volumeMounts": [{"name": "code", "mountPath": "/code"}],
                        }
                    ],
                    "volumes": [{"name": "code", "configMap": {"name": "claims-worker"}}],
                },
            }
        )
    return yaml.safe_dump_all(docs)


def phases(env: NodeEnv) -> dict[str, str]:
    got = env.kubectl("get", "pods", "-n", CLAIMS_NS, "-l", "app=claims-worker", "-o", "json")
    return {
        p["metadata"]["name"]: p["status"].get("phase", "") for p in json.loads(got.stdout)["items"]
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def test_claims_every_item_once_and_a_frozen_workers_late_write_refused(env: NodeEnv) -> None:
    frozen = f"claims-worker-{FROZEN}"
    env.kubectl("create", "namespace", CLAIMS_NS)
    env.kubectl(
        "create", "configmap", "claims-worker", "-n", CLAIMS_NS,
        f"--from-file={ROOT / 'e2e' / 'claims_worker.py'}",
    )  # fmt: skip
    started = time.monotonic()
    env.kubectl("apply", "-n", CLAIMS_NS, "-f", "-", input=claims_manifests())

    def holding() -> int | None:
        for line in logs(env, CLAIMS_NS, frozen).splitlines():
            if line.startswith(f"HOLDING {HOLD_ITEM} token "):
                return int(line.rsplit(" ", 1)[1])
        return None

    t1 = wait_for(f"{frozen} holding {HOLD_ITEM}", holding, 240)
    cid = container_id(env, CLAIMS_NS, frozen)
    log(f"freezing {frozen} holding {HOLD_ITEM} (token {t1}) with ctr tasks pause")
    env.containerd.ctr("tasks", "pause", cid)
    try:
        taken = wait_for(
            f"{HOLD_ITEM} re-claimed and published by another worker",
            lambda: artifact(env, CLAIMS_NS, f"out-{HOLD_ITEM}") or None,
            420,  # the others sweep it up after their own shares: most of the run
        )
    finally:
        env.containerd.ctr("tasks", "resume", cid, check=False)
    t2 = int(taken["fencingToken"])
    assert t2 > t1 and not str(taken["objectRef"]).endswith(f"@{frozen}"), (t1, taken)
    env.kubectl("exec", "-n", CLAIMS_NS, frozen, "--", "touch", "/tmp/release")
    wait_for(
        "every worker done",
        lambda: (
            (lambda p: len(p) == WORKERS and set(p.values()) <= {"Succeeded", "Failed"})(
                phases(env)
            )
            or None
        ),
        420,
        every=2,
    )
    wall = time.monotonic() - started
    reports = {}
    for pod in sorted(phases(env)):
        text = logs(env, CLAIMS_NS, pod)
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"{pod} printed no RESULT:\n{text[-3000:]}"
        reports[pod] = json.loads(lines[-1].removeprefix("RESULT "))
    assert set(phases(env).values()) == {"Succeeded"}, phases(env)

    # The frozen worker's late write was attempted, with its old token, and refused.
    late = reports[frozen]["late"]
    assert late == {"item": HOLD_ITEM, "token": t1, "code": "stale_fence"}, late

    # Every item applied exactly once, each artifact written once, under its item lease.
    applied: dict[str, tuple[str, int]] = {}
    for pod, report in reports.items():
        for item, token in report["applied"].items():
            assert item not in applied, f"{item} applied by {applied[item][0]} and {pod}"
            applied[item] = (pod, token)
    items = [f"item-{i:04d}" for i in range(ITEMS)]
    assert sorted(applied) == items
    assert applied[HOLD_ITEM][1] == t2 and applied[HOLD_ITEM][0] != frozen
    got = env.kubectl("get", "fencedartifacts", "-n", CLAIMS_NS, "-o", "json", timeout=60)
    arts = {a["metadata"]["name"]: a for a in json.loads(got.stdout)["items"]}
    assert sorted(arts) == sorted(f"out-{i}" for i in items)
    for item in items:
        art = arts[f"out-{item}"]
        assert art["metadata"]["generation"] == 1, art
        assert art["spec"]["leaseRef"]["name"] == f"{TEMPLATE}-{item}"
        assert art["spec"]["fencingToken"] == applied[item][1]
        assert art["spec"]["objectRef"] == f"{item}@{applied[item][0]}"

    claims = [ms for r in reports.values() for ms in r["claims_ms"]]
    begin = min(r["start"] for r in reports.values())
    end = max(r["end"] for r in reports.values())
    RESULTS["claims"] = {
        "workers": WORKERS,
        "items": ITEMS,
        "claim_ms_p50": round(statistics.median(claims), 1),
        "claim_ms_p99": round(pct(claims, 0.99), 1),
        "claims_granted": len(claims),
        "items_per_s": round(ITEMS / (end - begin), 1),
        "wall_s": round(wall, 1),
        "frozen": {"pod": frozen, "item": HOLD_ITEM, "t1": t1, "t2": t2},
    }
    log(f"claims: {RESULTS['claims']}")
