"""Helpers for integration tests: Pods without a kubelet, waiting on conditions, operators."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port, operator_process
from fencedlease.models import pod_annotation_keys

from ..fence_servers import http_ok

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | Literal[False] | None], timeout: float = 30.0, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns a truthy value (a deadline, not a hoped-for interleaving)."""
    deadline = time.monotonic() + timeout
    last: T | Literal[False] | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def apply(cluster: LocalCluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def get(cluster: LocalCluster, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return None
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def lease(
    name: str, namespace: str, duration: int = 2, app: str = "worker", policy: str = "AllowEqual"
) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedLease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "leaseDurationSeconds": duration,
            "fencingPolicy": policy,
            "holderSelector": {"matchLabels": {"app": app}},
        },
    }


def create_pod(cluster: LocalCluster, name: str, namespace: str, app: str = "worker") -> None:
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
            "spec": {"containers": [{"name": "main", "image": "example.invalid/worker:1"}]},
        },
    )


def patch_status(
    cluster: LocalCluster,
    kind: str,
    name: str,
    namespace: str,
    status: Any,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """A merge patch of the status subresource (as a kubelet or a forger writes it)."""
    return cluster.kubectl(
        "patch",
        kind,
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=check,
    )


def set_ready(cluster: LocalCluster, name: str, namespace: str, ready: bool) -> None:
    """No kubelet runs: tests play its part through the status subresource."""
    status = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    patch_status(cluster, "pod", name, namespace, status)


def events(cluster: LocalCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The Events in ``namespace`` that field selector ``selector`` matches."""
    out = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", selector, "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


@contextmanager
def crd_changed(
    cluster: LocalCluster, path: Path, change: Callable[[dict[str, Any]], None]
) -> Iterator[None]:
    """The CRD shipped at ``path`` with ``change`` made to it (as a cluster whose CRD is older
    than the operator's has it); the shipped one is put back afterwards."""
    crd = yaml.safe_load(path.read_text())
    change(crd)
    try:
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd)
        )
        yield
    finally:
        cluster.apply_crds(path)


def ready_pods(cluster: LocalCluster, namespace: str, *names: str, app: str = "worker") -> None:
    """Create candidate Pods and mark them Running and Ready."""
    for name in names:
        create_pod(cluster, name, namespace, app=app)
        set_ready(cluster, name, namespace, True)


def wait_held(
    cluster: LocalCluster,
    name: str,
    namespace: str,
    timeout: float = 30.0,
    *,
    above: int | None = None,
    other_than: str | None = None,
) -> dict[str, Any]:
    """Wait until lease ``name`` is Held (by a generation with a token above ``above``, and
    whose lease id is not ``other_than``); return its status."""

    def held(s: dict[str, Any]) -> bool:
        return (
            s.get("phase") == "Held"
            and (above is None or s.get("fencingToken", 0) > above)
            and (other_than is None or s.get("leaseId") != other_than)
        )

    what = f"lease {name} held"
    what += "" if above is None else f" above token {above}"
    what += "" if other_than is None else f" by a generation other than {other_than}"
    return wait_for(
        lambda: held(s := lease_status(cluster, name, namespace)) and s, timeout=timeout, what=what
    )


def pod_lease_annotations(
    cluster: LocalCluster, pod: str, namespace: str, lease_name: str
) -> dict[str, str]:
    obj = get(cluster, "pod", pod, namespace) or {}
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    keys = pod_annotation_keys(lease_name)
    return {short: ann[full] for short, full in keys.items() if full in ann}


def lease_status(cluster: LocalCluster, name: str, namespace: str) -> dict[str, Any]:
    obj = get(cluster, "fl", name, namespace) or {}
    status: dict[str, Any] = obj.get("status") or {}
    return status


@contextmanager
def running_operator(
    cluster: LocalCluster,
    log_dir: Path,
    *args: str,
    name: str = "operator",
    env: dict[str, str] | None = None,
    etcd_endpoint: str | None = None,
    kubeconfig: Path | None = None,
    health_port: int | None = None,
) -> Iterator[ManagedProcess]:
    """A ``fencedlease run`` child process; yields once /readyz answers.

    ``kubeconfig``: the identity of the process (default: the cluster's admin kubeconfig).
    ``health_port``: where /healthz and /readyz answer (default: a free port).
    """
    health = health_port or free_port()
    # Tests publish with the admin kubeconfig (group system:masters) unless they say otherwise.
    proc = operator_process(
        kubeconfig or cluster.kubeconfig,
        etcd_endpoint or cluster.etcd_endpoint,
        log_dir / f"{name}.log",
        ["--health-port", str(health), "--metrics-port", "0", *args],
        env={"FENCEDLEASE_ALLOWED_WRITERS": "group:system:masters", **(env or {})},
    )
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while not http_ok(f"http://127.0.0.1:{health}/readyz"):
            if not proc.alive() or time.monotonic() > deadline:
                raise AssertionError(f"operator not ready:\n{proc.log_tail(60)}")
            time.sleep(0.2)
        yield proc
    finally:
        proc.stop()


def processes_using(state_dir: Path) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(state_dir) in cmdline:
            out.append(f"{pid}: {cmdline[:120]}")
    return out


@contextmanager
def running_fence(
    cluster: LocalCluster,
    tmp_path: Path,
    namespace: str,
    env: dict[str, str] | None = None,
    etcd_endpoint: str | None = None,
    health_port: int | None = None,
) -> Iterator[tuple[ManagedProcess, int]]:
    """Controller and webhook in one ``fencedlease run`` scoped to ``namespace``, the webhook
    registered by URL for that namespace only; yields the process and the webhook's port.
    The configuration is removed afterwards."""
    port = free_port()
    config_name = f"{namespace}.fencedlease.io"
    try:
        with running_operator(
            cluster,
            tmp_path,
            "--role",
            "all",
            "--namespace",
            namespace,  # the webhook configuration only selects this namespace
            "--webhook-registration",
            "url",
            "--webhook-port",
            str(port),
            "--webhook-cert-dir",
            str(tmp_path / "webhook-pki"),
            env={"FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME": config_name, **(env or {})},
            etcd_endpoint=etcd_endpoint,
            health_port=health_port,
        ) as proc:
            yield proc, port
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", config_name, "--ignore-not-found")


def wait_token_above(
    cluster: LocalCluster, name: str, namespace: str, token: int, timeout: float = 30.0
) -> dict[str, Any]:
    """Wait until lease ``name`` is Held by a generation with a token above ``token``."""
    return wait_held(cluster, name, namespace, timeout, above=token)
