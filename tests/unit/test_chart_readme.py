"""charts/fencedlease/README.md is generated from values.yaml's ``# --`` comments
(scripts/chart_readme.py): it is up to date, and the check fails when it is not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "chart_readme.py"
CHART = ROOT / "charts" / "fencedlease"


def check(chart: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--chart", str(chart), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_chart_readme_is_up_to_date() -> None:
    result = check(CHART)
    assert result.returncode == 0, result.stderr


def test_every_value_is_described_once() -> None:
    readme = (CHART / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    keys = [row.split("`")[1] for row in rows]
    assert len(keys) == len(set(keys)) and len(keys) > 100
    undescribed = [row.split("`")[1] for row in rows if row.rstrip().endswith("|  |")]
    assert undescribed == [], f"add a `# --` comment in values.yaml for {undescribed}"
    for key in ("global.imagePullSecrets", "crds.keep", "etcd.bundled.topologySpreadConstraints"):
        assert key in keys


def test_a_changed_comment_makes_the_check_fail(tmp_path: Path) -> None:
    copy = tmp_path / "fencedlease"
    shutil.copytree(CHART, copy, symlinks=True)
    values = copy / "values.yaml"
    values.write_text(values.read_text().replace("# -- Log format", "# -- The log format", 1))
    result = check(copy)
    assert result.returncode == 1 and "out of date" in result.stderr
    subprocess.run([sys.executable, str(SCRIPT), "--chart", str(copy)], check=True, timeout=60)
    assert check(copy).returncode == 0
    assert "The log format of the operator" in (copy / "README.md").read_text()
