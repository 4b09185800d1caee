"""The chart and the operator image as a real cluster gets them: from a registry, by digest.

``make release`` (scripts/release.py) of the repository's version, its image pushed to a
loopback OCI registry (``crane registry serve``, local/registry.py) and its chart with ``helm
push``; ``helm install oci://<registry>/charts/fencedlease`` with ``image.digest``, so the node's
containerd pulls the image from the registry (it is not imported beforehand: checked). Used by
e2e/test_10_chart.py, whose scenarios then run on that install.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from e2e.node import RELEASE, RESULTS, ROOT, SYSTEM_NS, E2EError, NodeEnv, log
from fencedlease.local import registry as loopback
from fencedlease.local.binaries import binary_path

IMAGE_REPOSITORY = "fencedlease/fencedlease"  # the operator's repository in the registry


@dataclass(frozen=True)
class Published:
    """A release pushed to the loopback registry."""

    version: str
    image: str  # <registry>/fencedlease/fencedlease@sha256:...
    digest: str
    chart: str  # oci://<registry>/charts/fencedlease


def _release_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "scripts" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("release", module)
    spec.loader.exec_module(module)
    return module


def publish(registry: loopback.Registry, out: Path) -> Published:
    """``make release`` of the repository's version into ``out`` (unsigned), then its image and
    chart pushed to ``registry``; the digest the registry serves must be the release's."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    _release_script().release(version, out, log=log)
    t1 = time.monotonic()
    archive = out / f"fencedlease-image-{version}.oci.tar"
    released = (out / f"fencedlease-image-{version}.digest").read_text().strip()
    digest = registry.push_image(archive, IMAGE_REPOSITORY, version)
    if not released.endswith(f"@{digest}"):
        raise E2EError(f"the registry serves {digest}, the release says {released}")
    chart = registry.push_chart(binary_path("helm"), out / f"fencedlease-{version}.tgz")
    RESULTS["registry"] = {
        "release_seconds": round(t1 - t0, 1),
        "push_seconds": round(time.monotonic() - t1, 1),
    }
    log(f"pushed {registry.address}/{IMAGE_REPOSITORY}@{digest} and {chart}/fencedlease {version}")
    return Published(
        version, f"{registry.address}/{IMAGE_REPOSITORY}@{digest}", digest, f"{chart}/fencedlease"
    )


def images_with_digest(env: NodeEnv, digest: str) -> list[str]:
    """The images in the node's containerd (``k8s.io``) whose target is ``digest``."""
    listed = env.containerd.ctr("images", "ls", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed[1:] if digest in line.split()]


def install(env: NodeEnv, registry: loopback.Registry, published: Published) -> None:
    """``helm install`` of the pushed chart with the operator image by digest, pulled by the
    node's containerd from ``registry`` (plain HTTP: its hosts.toml). The bundled etcd's image
    and the scenarios' values are :meth:`NodeEnv.chart_values`'s; the operator image is
    ``published.image`` from now on."""
    loopback.containerd_hosts(env.containerd.registry_config_dir, registry.address)
    present = images_with_digest(env, published.digest)
    if present:
        raise E2EError(f"the operator image is in containerd before the install: {present}")
    # From here on the module's scenarios (their own Pods, `helm upgrade`) name the pulled
    # image by digest too (image.repository + image.digest; it is on the node then).
    env.images["operator"] = published.image
    try:
        env.helm(
            "install", RELEASE, published.chart, "--version", published.version, "--plain-http",
            "--namespace", SYSTEM_NS, "--create-namespace",
            # The node cluster applied the CRDs when it started (templates/crds.yaml).
            "--take-ownership",
            *env.chart_values(), "--set=image.pullPolicy=IfNotPresent",
            "--wait", "--timeout=6m",
        )  # fmt: skip
    except E2EError as exc:
        raise E2EError(f"{exc}\n{registry.logs()}") from None
