"""``fencedlease run`` never loads the local machinery (binaries, local cluster, local up).

fencedlease-local adds ``local`` to the ``fencedlease`` command through an entry point, so its
small ``fencedlease.local.cli`` (the parser) is loaded by every invocation: nothing more."""

from __future__ import annotations

import subprocess
import sys


def test_the_run_path_does_not_import_the_local_machinery() -> None:
    probe = (
        "import sys\n"
        "import fencedlease.kopfapp\n"
        "from fencedlease.client import cli\n"
        "parser, runners = cli.build_parser(cli.installed_commands())\n"
        "assert {'run', 'local'} <= set(runners), runners\n"
        "parser.parse_args(['run'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('fencedlease.local')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "['fencedlease.local', 'fencedlease.local.cli']"
