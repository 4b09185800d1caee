"""What ``fencedlease run`` loads: not the local machinery, not the synchronous kubernetes client.

fencedlease-local adds ``local`` to the ``fencedlease`` command through an entry point, so its
small ``fencedlease.local.cli`` (the parser) is loaded by every invocation: nothing more. Kopf
imports the synchronous ``kubernetes`` client's models whenever that package is installed
(about 36 MiB of RSS, docs/design.md "What is Kopf's and what is ours"): the run path imports
Kopf through ``cli.import_kopf``, which keeps it out."""

from __future__ import annotations

import subprocess
import sys


def run(probe: str) -> str:
    """What ``probe`` prints, run by a fresh interpreter (nothing imported yet)."""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


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
    assert run(probe) == "['fencedlease.local', 'fencedlease.local.cli']"


def loads_sync_kubernetes(import_kopf: str) -> bool:
    """Whether the run path's imports (``cli.cmd_run``) load ``kubernetes``, with Kopf
    imported first by ``import_kopf``."""
    probe = (
        "import sys\n"
        "from fencedlease import cli\n"
        f"{import_kopf}"
        "import fencedlease.app, fencedlease.kopfapp, kopf\n"
        "assert kopf.get_default_registry() is fencedlease.kopfapp.registry\n"
        "print('kubernetes' in sys.modules)\n"
    )
    return run(probe) == "True"


def test_the_run_path_does_not_load_the_synchronous_kubernetes_client() -> None:
    """Through ``cli.import_kopf`` Kopf's optional ``kubernetes.client`` import is not made,
    and the operator's registry has no fallback login that would import it later. Imported
    plainly, Kopf loads it: the probe tells the two apart."""
    assert loads_sync_kubernetes("cli.import_kopf()\n") is False
    assert loads_sync_kubernetes("") is True


def test_kubernetes_imports_as_usual_after_kopf_was_imported_without_it() -> None:
    probe = (
        "from fencedlease import cli\n"
        "cli.import_kopf()\n"
        "from kubernetes.client import V1ObjectMeta\n"
        "print(V1ObjectMeta.__name__)\n"
    )
    assert run(probe) == "V1ObjectMeta"
