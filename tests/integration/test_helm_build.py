"""The helm built from its Go module (local/binaries.py) is linked as helm's own Makefile links
it: its default Kubernetes version (``.Capabilities.KubeVersion``, the default of
``--kube-version``) is its client-go's, not the v1.20 of its source, so ``helm lint`` and
``helm template`` of the chart pass Chart.yaml's ``kubeVersion`` without a workaround."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fencedlease.local.binaries import KUBERNETES_VERSION

from .chart import CHART, helm


def test_helm_defaults_to_the_kubernetes_of_its_client_go(tmp_path: Path) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: '{{ .Capabilities.KubeVersion.Version }}'}\n"
    )
    (doc,) = [d for d in yaml.safe_load_all(helm("template", "p", str(chart)).stdout) if d]
    match = re.fullmatch(r"v1\.(\d+)\.0", doc["data"]["kube"])
    assert match, doc["data"]
    # helm v3.22 builds with client-go v0.37, the Kubernetes minor the tests run.
    assert int(match.group(1)) == int(KUBERNETES_VERSION.split(".")[1]), doc["data"]


def test_the_chart_lints_and_renders_without_a_kube_version() -> None:
    helm("lint", "--strict", str(CHART))
    assert "kind: Deployment" in helm("template", "fl", str(CHART)).stdout
