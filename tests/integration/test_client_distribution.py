"""fencedlease-client installs alone, and the operator's wheel adds its commands to it.

The client's wheel is built from client/ and installed, with its real dependency resolution
(PyPI, as a user's ``pip install fencedlease-client`` does), into a fresh venv in a temporary
directory, run from outside the checkout: nothing of the operator's stack (Kopf, gRPC, the etcd
client, uvloop, pydantic, kubernetes_asyncio) may be installed, and the SDK, the ``fencedlease``
command and the kubectl plugin work.  Then the operator's wheel is installed on top (its own
dependencies through a ``.pth`` path entry to the development venv, as in
test_installed_wheel.py): the two distributions share the ``fencedlease`` package and the
``fencedlease`` command gains ``run`` through the entry point (``local`` needs fencedlease-local).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from . import distribution

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)

OPERATOR_STACK = {
    "kopf",
    "grpcio",
    "aetcd",
    "uvloop",
    "pydantic",
    "pydantic-core",
    "kubernetes-asyncio",
    "protobuf",
    "aiohttp",
    "fencedlease",
    "fencedlease-local",
}


def run(*cmd: str | Path, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PYTHONPATH")}
    return distribution.run(*cmd, cwd=cwd, env=env, check=check)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    distribution.build(out, ROOT / "client", ROOT)
    (client,) = out.glob("fencedlease_client-*.whl")
    (operator,) = out.glob("fencedlease-0*.whl")
    return {"client": client, "operator": operator}


def installed(python: Path, cwd: Path) -> set[str]:
    listing = run(python, "-m", "pip", "list", "--format=json", cwd=cwd).stdout
    return {str(d["name"]).lower().replace("_", "-") for d in json.loads(listing)}


def test_the_client_installs_alone_and_the_operator_adds_its_commands(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    run(python, "-m", "pip", "install", "-q", wheels["client"], cwd=tmp_path)

    names = installed(python, tmp_path)
    assert "fencedlease-client" in names and "httpx" in names
    assert names & OPERATOR_STACK == set(), names & OPERATOR_STACK

    probe = (
        "import sys, fencedlease.client as c\n"
        "from fencedlease.client import SqlFence, Publisher, DirectoryGrant\n"
        "print(c.__file__)\n"
        "print(sorted(m for m in ('kopf', 'pydantic', 'grpc', 'aetcd') if m in sys.modules))\n"
    )
    where, heavy = run(python, "-c", probe, cwd=tmp_path).stdout.split("\n")[:2]
    assert Path(where).is_relative_to(venv), where
    assert heavy == "[]"

    fencedlease = bin_dir / "fencedlease"
    usage = run(fencedlease, "--help", cwd=tmp_path).stdout
    assert "{token,publish,sql,release}" in usage and "run and etcd come with the" in usage
    empty = tmp_path / "grant"
    empty.mkdir()
    absent = run(fencedlease, "token", "--dir", empty, cwd=tmp_path, check=False)
    assert absent.returncode == 3 and absent.stderr.startswith("absent:"), absent.stderr
    no_operator = run(fencedlease, "run", cwd=tmp_path, check=False)
    assert no_operator.returncode == 2, no_operator.stderr
    assert no_operator.stderr == (
        "error: 'fencedlease run' comes with fencedlease: pip install fencedlease\n"
    )
    no_etcd = run(fencedlease, "etcd", "restore", cwd=tmp_path, check=False)  # no install hint
    assert no_etcd.returncode == 2, no_etcd.stderr  # before (issue 42): argparse's usage
    assert (
        no_etcd.stderr
        == "error: 'fencedlease etcd' comes with fencedlease: pip install fencedlease\n"
    )
    plugin = run(bin_dir / "kubectl-fencedlease", "--help", cwd=tmp_path).stdout
    assert "force-release" in plugin

    # The operator on top: its wheel (no deps: they come from the development venv).
    run(python, "-m", "pip", "install", "-q", "--no-deps", wheels["operator"], cwd=tmp_path)
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path)
    (Path(site.stdout.strip()) / "zz-dev-dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n"
    )
    both = run(
        python,
        "-c",
        "import fencedlease, fencedlease.client, fencedlease.models as m\n"
        "print(fencedlease.__file__); print(fencedlease.client.__file__); print(m.GROUP)",
        cwd=tmp_path,
    ).stdout.split("\n")
    assert all(Path(p).is_relative_to(venv) for p in both[:2]), both
    assert both[2] == "fencedlease.io"
    usage = run(fencedlease, "--help", cwd=tmp_path).stdout
    assert "{token,publish,sql,release,run,etcd}" in usage, usage
    assert "--etcd-endpoints" in run(fencedlease, "run", "--help", cwd=tmp_path).stdout
    no_local = run(fencedlease, "local", "up", cwd=tmp_path, check=False)
    assert no_local.returncode == 2 and "pip install fencedlease-local" in no_local.stderr
    # The operator's wheel carries neither the client nor the local machinery.
    record = run(python, "-m", "pip", "show", "-f", "fencedlease", cwd=tmp_path).stdout
    assert "fencedlease/client/" not in record and "bin/fencedlease" not in record
    assert "fencedlease/local/" not in record
