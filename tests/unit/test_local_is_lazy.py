"""``fencedlease run`` never loads the local machinery (binaries, local cluster, local up)."""

from __future__ import annotations

import subprocess
import sys


def test_the_run_path_does_not_import_fencedlease_local() -> None:
    probe = (
        "import sys\n"
        "import fencedlease.cli, fencedlease.app\n"
        "fencedlease.cli.build_parser().parse_args(['run'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('fencedlease.local')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"
