"""The e2e harness on a real local node: `fencedlease local up --node`, images, Helm.

Used by the pytest scenarios in this directory (``make e2e``). Every wait is bounded; on a
failure :meth:`NodeEnv.diagnostics` gathers what explains it (etcd, kube-apiserver, kubelet,
containerd logs; Pods, events and the operator's logs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.scenarios import ScenarioError
from fencedlease.local import images, runtime
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import run_kubectl

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "fencedlease"
SYSTEM_NS = "fencedlease-system"
E2E_NS = "fencedlease-e2e"
RESULTS: dict[str, Any] = {}
"""Figures measured by the scenarios (timings, lag percentiles), printed at the end of the run."""


# One error type and one bounded wait for every e2e step (the kind script's scenarios too).
E2EError = ScenarioError


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class NodeEnv:
    state_dir: Path
    images: dict[str, str] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def containerd(self) -> runtime.Containerd:
        return runtime.Containerd(self.state_dir / "containerd", "", self.state_dir / "cni")

    def fencedlease(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        return subprocess.run(
            [sys.executable, "-m", "fencedlease", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )

    def up(self, fresh: bool = True) -> None:
        """Start the node cluster; ``fresh``: from an empty state directory (no old release)."""
        if fresh and self.state_dir.exists():
            self.down()
            shutil.rmtree(self.state_dir)
        result = self.fencedlease(
            "local", "up", "--node", "--no-operator", "--detach", "--state-dir", str(self.state_dir)
        )
        if result.returncode != 0:
            raise E2EError(f"local up --node failed:\n{result.stderr}\n{self.diagnostics()}")

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.fencedlease("local", "down", "--state-dir", str(self.state_dir), timeout=300)

    @contextmanager
    def running(self, timed: bool = False, operator_image: bool = True) -> Iterator[NodeEnv]:
        """A module's node: up from an empty state, the images loaded, etcd's volumes made;
        on a failure inside, :meth:`diagnostics` printed; down at the end (it must succeed).
        ``timed``: the start-up's durations go to RESULTS; ``operator_image``: see
        :meth:`load_images`."""
        t0 = time.monotonic()
        self.up()
        try:
            t1 = time.monotonic()
            self.load_images(operator_image)
            if timed:
                RESULTS["node_up_seconds"] = round(t1 - t0, 1)
                RESULTS["images_seconds"] = round(time.monotonic() - t1, 1)
            self.etcd_volumes()
            yield self
        except BaseException:
            print(self.diagnostics())
            raise
        finally:
            down = self.down()
            assert down.returncode == 0, down.stderr

    @property
    def kubectl_path(self) -> Path:
        return binary_path("kubectl")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = run_kubectl(self.kubeconfig, *args, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise E2EError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def get(self, kind: str, name: str, namespace: str = E2E_NS) -> dict[str, Any] | None:
        got = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(got.stdout) if got.returncode == 0 else None

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        cmd = [str(binary_path("helm")), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise E2EError(f"helm {' '.join(args)}: {result.stderr.strip()}\n{self.diagnostics()}")
        return result

    # ------------------------------------------------------------------ images and chart

    def load_images(self, operator_image: bool = True) -> None:
        """Build (first use; cached) and import the operator and etcd images; without
        ``operator_image`` the operator's is built but not imported (e2e/registry_release.py
        has the node pull a release's from a registry, and names that one instead)."""
        operator, operator_tar = images.operator_archive(ROOT, log)
        etcd, etcd_tar = images.etcd_archive(log)
        if operator_image:
            images.import_image(self.containerd, operator, operator_tar)
        images.import_image(self.containerd, etcd, etcd_tar)
        self.images = {"operator": operator, "etcd": etcd, "busybox": images.BUSYBOX_IMAGE}

    def tag_release_image(self) -> str:
        """Also name the operator image as a real cluster pulls it (the chart's default
        repository and appVersion), so the examples' manifests apply verbatim."""
        release = images.release_name(ROOT)
        images.tag_image(self.containerd, self.images["operator"], release)
        self.images["release"] = release
        return release

    def etcd_volumes(self, replicas: int = 3) -> None:
        """Static hostPath PersistentVolumes for the bundled etcd's members and its backup
        CronJob's snapshots (no provisioner here)."""
        for i in [*range(replicas), "backup"]:
            path = self.state_dir / "volumes" / f"etcd-{i}"
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, 65532, 65532)
            pv = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"fencedlease-e2e-etcd-{i}"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(path), "type": "Directory"},
                },
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(pv))

    def chart_values(self) -> list[str]:
        """The locally built images, and the scenarios' admin publisher named as an allowed
        writer (the workers publish as their own Pods; the shared scenarios, as on kind, also
        publish stale writes with the cluster admin's kubeconfig)."""
        operator = self.images["operator"]
        if "@" in operator:  # by digest: pulled from a registry (e2e/registry_release.py)
            repo, digest = operator.split("@", 1)
            image = [f"--set=image.repository={repo}", f"--set=image.digest={digest}"]
        else:
            repo, tag = operator.rsplit(":", 1)
            image = [f"--set=image.repository={repo}", f"--set=image.tag={tag}"]
        etcd_repo, etcd_tag = self.images["etcd"].rsplit(":", 1)
        return [
            *image,
            "--set=image.pullPolicy=Never",
            f"--set=etcd.bundled.image.repository={etcd_repo}",
            f"--set=etcd.bundled.image.tag={etcd_tag}",
            "--set=etcd.bundled.image.pullPolicy=Never",
            "--set=etcd.bundled.persistence.size=256Mi",
            "--set=etcd.backup.persistence.size=256Mi",
            '--set-json=allowedWriters=["group:system:masters"]',
        ]

    def helm_install(
        self, *extra: str, chart: Path | None = None, values: list[str] | None = None
    ) -> None:
        """``helm install`` of ``chart`` (this repository's by default) with ``values`` (by
        default :meth:`chart_values`) and then ``extra`` flags, waiting for every Pod. This
        chart takes over the CRDs the node cluster applied when it started (templates/crds.yaml;
        ``--take-ownership``, docs/install.md); an older chart's ``crds/`` finds them present."""
        self.helm(
            "install",
            RELEASE,
            str(chart or ROOT / "charts" / "fencedlease"),
            "--namespace",
            SYSTEM_NS,
            "--create-namespace",
            *(["--take-ownership"] if chart is None else []),
            *(self.chart_values() if values is None else values),
            *extra,
            "--wait",
            "--timeout=6m",
        )

    # ------------------------------------------------------------------ diagnostics

    def log_offset(self, name: str) -> int:
        """The current size of a node process's log (``etcd``, ``kubelet``, ``containerd``...)."""
        path = self.state_dir / "logs" / f"{name}.log"
        return path.stat().st_size if path.exists() else 0

    def log_since(self, name: str, offset: int, *needles: str, limit: int = 400) -> str:
        """The lines a node process logged after ``offset`` (:meth:`log_offset`): those that
        contain one of ``needles`` or look like errors (every line when no needle is given),
        the last ``limit`` of them."""
        path = self.state_dir / "logs" / f"{name}.log"
        if not path.exists():
            return f"(no {path})"
        with path.open("rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
        if needles:
            lines = [
                ln
                for ln in lines
                if any(n in ln for n in needles)
                or ln.startswith("E")  # klog's error lines
                or "error" in ln.lower()
            ]
        return "\n".join(lines[-limit:])

    def diagnostics(self) -> str:
        parts = []
        for name in ("etcd", "kube-apiserver", "kubelet", "containerd", "local-up"):
            path = self.state_dir / "logs" / f"{name}.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()
                interesting = [ln for ln in lines if " E" in ln[:30] or "error" in ln.lower()]
                parts.append(f"--- {path} (last errors) ---\n" + "\n".join(interesting[-25:]))
                parts.append(f"--- {path} (tail) ---\n" + "\n".join(lines[-15:]))
        selector = f"app.kubernetes.io/instance={RELEASE}"
        if self.kubeconfig.exists():
            for args in (
                ("get", "nodes,pods,pvc", "-A", "-o", "wide"),
                ("get", "events", "-A", "--sort-by=.lastTimestamp"),
                *(
                    (
                        "logs",
                        "-n",
                        SYSTEM_NS,
                        "-l",
                        f"{selector},app.kubernetes.io/component={c}",
                        "--tail=40",
                        "--prefix",
                    )
                    for c in ("controller", "webhook")
                ),
                ("logs", "-n", E2E_NS, "-l", "app=e2e-worker", "--tail=20", "--prefix"),
                ("logs", "-n", E2E_NS, "-l", "app=lag-probe", "--tail=10", "--prefix"),
                ("get", "fencedleases,fencedartifacts", "-A", "-o", "wide"),
            ):
                got = self.kubectl(*args, check=False, timeout=30)
                parts.append(f"--- kubectl {' '.join(args)} ---\n{got.stdout[-6000:]}{got.stderr}")
        return "\n".join(parts)
