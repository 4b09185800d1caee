"""Building and installing the distributions in a throwaway venv, shared by
``test_client_distribution.py`` and ``test_installed_wheel.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(
    *cmd: str | Path, cwd: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (``env``: the whole environment, default this process's); with ``check``,
    a non-zero exit fails the test with both outputs."""
    result = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"{cmd}: {result.stdout}\n{result.stderr}"
    return result


def build(out: Path, *sources: Path) -> None:
    """Each source's sdist, then the wheel from it (``python -m build``), into ``out``: never
    a stale build/ directory."""
    for source in sources:
        run(sys.executable, "-m", "build", "--outdir", out, source, cwd=out)
