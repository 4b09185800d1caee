"""Rendering the Helm chart with the helm built from Go modules (shared by the chart tests)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from fencedlease.local.binaries import binary_path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fencedlease"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(binary_path("helm")), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(release: str, namespace: str, *flags: str) -> list[dict[str, Any]]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *flags).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in kinds(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]
