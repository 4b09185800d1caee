"""An installed wheel, not the source checkout, runs ``fencedlease local up`` and ``local down``.

The wheels are built from the repository (``python -m build``): the operator's, the client's
(fencedlease-client owns the ``fencedlease`` command) and fencedlease-local's (which adds
``local`` to it and carries the CRDs), and installed with
``--no-deps`` into a fresh venv in a temporary directory, run from a working directory outside
the checkout. Its dependencies come from the development venv through a ``.pth`` path entry (no
network, seconds instead of a full resolve); the package itself, its CRDs (package data) and its
console script come from the wheels. ``docs/install.md`` has the same check with a plain
``pip install``.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from . import distribution
from .k8s import processes_using, wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)


def run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    return distribution.run(*cmd, cwd=cwd, env=env).stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The operator's wheel, the client's (which owns the ``fencedlease`` command) and the
    local machinery's (``fencedlease local``, with the CRD manifests)."""
    out = tmp_path_factory.mktemp("wheel")
    distribution.build(out, ROOT, ROOT / "client", ROOT / "local")
    (built,) = out.glob("fencedlease-0*.whl")
    (client,) = out.glob("fencedlease_client-*.whl")
    (local,) = out.glob("fencedlease_local-*.whl")
    return built, client, local


@pytest.fixture(scope="module")
def wheel(wheels: tuple[Path, Path, Path]) -> Path:
    """The wheel that carries the CRD manifests: fencedlease-local's."""
    return wheels[2]


def test_every_wheel_and_sdist_carries_the_license(wheels: tuple[Path, Path, Path]) -> None:
    """Apache-2.0, declared (PEP 639 ``License-Expression``) and its LICENSE and NOTICE in each
    wheel's ``.dist-info/licenses/`` and each sdist's root (client/ and local/ link to the
    repository's files)."""
    expected = {name: (ROOT / name).read_bytes() for name in ("LICENSE", "NOTICE")}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            (info,) = {n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n}
            for name, data in expected.items():
                assert zf.read(f"{info}/licenses/{name}") == data, (wheel.name, name)
            metadata = zf.read(f"{info}/METADATA").decode()
        assert "License-Expression: Apache-2.0" in metadata, wheel.name
        assert {"License-File: LICENSE", "License-File: NOTICE"} <= set(metadata.splitlines())
    sdists = sorted(wheels[0].parent.glob("*.tar.gz"))
    assert len(sdists) == 3, sdists
    for sdist in sdists:
        with tarfile.open(sdist) as tar:
            top = sdist.name.removesuffix(".tar.gz")
            for name, data in expected.items():
                member = tar.extractfile(f"{top}/{name}")
                assert member is not None and member.read() == data, (sdist.name, name)


def test_the_operator_wheel_carries_no_local_machinery(wheels: tuple[Path, Path, Path]) -> None:
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.startswith(("fencedlease/local/", "fencedlease/crds/"))]
    assert not [n for n in names if n.startswith("fencedlease/client/")]
    assert "fencedlease/app.py" in names


def test_the_wheel_carries_the_repository_crds(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        packaged = {
            Path(n).name: zf.read(n)
            for n in zf.namelist()
            if n.startswith("fencedlease/crds/") and n.endswith(".yaml")
        }
    assert packaged == {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}


def test_installed_wheel_local_up_and_down(wheels: tuple[Path, Path, Path], tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", *wheels, cwd=tmp_path)
    site = Path(
        run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
        ).strip()
    )
    (site / "zz-dev-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "PYTHONPATH", "FENCEDLEASE_CRDS_DIR")
    }
    where = run(python, "-c", "import fencedlease; print(fencedlease.__file__)", cwd=tmp_path)
    assert Path(where.strip()).is_relative_to(venv), where

    state = tmp_path / "state"
    fencedlease = venv / "bin" / "fencedlease"
    try:
        up = run(
            fencedlease, "local", "up", "--detach", "--state-dir", state, cwd=tmp_path, env=env
        )
        assert "fencedlease is ready." in up
        log = (state / "logs" / "local-up.log").read_text()
        assert f"applying CRDs from {venv}" in log, log
    finally:
        down = run(fencedlease, "local", "down", "--state-dir", state, cwd=tmp_path, env=env)
    assert "stopped the local control plane" in down
    wait_for(lambda: not processes_using(state), timeout=30, what="no process left")
