"""The krew manifest of ``kubectl fencedlease`` (client/krew/): built, validated with krew's own
rules (ported from sigs.k8s.io/krew ``internal/index/validation``), and installed as krew
installs it (the archive unpacked, the ``files`` operations applied, ``bin`` linked into a
``bin`` directory on ``PATH``), then run by the real kubectl against the local API server with
a bare Debian ``python3`` (no fencedlease, no httpx of its own)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "client" / "krew" / "fencedlease.yaml"

pytestmark = pytest.mark.timeout(600)

SEMVER = re.compile(
    r"v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?\Z"
)
WINDOWS_FORBIDDEN = (
    {"CON", "PRN", "AUX", "NUL"}
    | {f"COM{i}" for i in range(1, 10)}
    | {f"LPT{i}" for i in range(1, 10)}
)


def krew_problems(name: str, plugin: dict[str, Any]) -> list[str]:
    """krew's ValidatePlugin: what it would refuse in ``plugin`` (installed as ``name``)."""
    problems: list[str] = []
    spec = plugin.get("spec") or {}
    if plugin.get("apiVersion") != "krew.googlecontainertools.github.com/v1alpha2":
        problems.append(f"apiVersion {plugin.get('apiVersion')!r}")
    if plugin.get("kind") != "Plugin":
        problems.append(f"kind {plugin.get('kind')!r}")
    if not re.fullmatch(r"[\w-]+", name) or name.upper() in WINDOWS_FORBIDDEN:
        problems.append(f"unsafe name {name!r}")
    if (plugin.get("metadata") or {}).get("name") != name:
        problems.append("metadata.name is not the manifest's name")
    short = spec.get("shortDescription") or ""
    if not short or "\n" in short or "\r" in short:
        problems.append("shortDescription empty or multi-line")
    if not SEMVER.match(str(spec.get("version") or "")):
        problems.append(f"version {spec.get('version')!r} is not v-prefixed semver")
    platforms = spec.get("platforms") or []
    if not platforms:
        problems.append("no platforms")
    for platform in platforms:
        if not platform.get("uri"):
            problems.append("a platform without uri")
        if not re.fullmatch(r"[a-f0-9]{64}", str(platform.get("sha256") or "")):
            problems.append(f"sha256 {platform.get('sha256')!r}")
        if not platform.get("bin"):
            problems.append("a platform without bin")
        files = platform.get("files")
        if files is not None and (
            not files or any(not f.get("from") or not f.get("to") for f in files)
        ):
            problems.append("files: empty, or an operation without from/to")
        selector = platform.get("selector")
        if not selector or (
            not selector.get("matchLabels") and not selector.get("matchExpressions")
        ):
            problems.append("nil or empty selector")
        else:
            keys = list(selector.get("matchLabels") or {}) + [
                e.get("key") for e in selector.get("matchExpressions") or []
            ]
            problems.extend(f"selector key {k!r}" for k in keys if k not in ("os", "arch"))
    return problems


def pythons() -> list[Path]:
    """The oldest and the newest Python the client supports found on this machine (pyenv's,
    as make test-pythons finds them)."""
    found = []
    for minor in ("3.9", "3.13"):
        versions = sorted(Path.home().glob(f".pyenv/versions/{minor}.*/bin/python{minor}"))
        found += versions[-1:]
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("krew")
    oldest = pythons()[:1]  # lib/ from the oldest Python's pip, as make krew does
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "client" / "krew" / "build.py"),
            "--out",
            str(out),
            *(["--python", str(oldest[0])] if oldest else []),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (archive,) = out.glob("kubectl-fencedlease-*.tar.gz")
    return archive, yaml.safe_load((out / "fencedlease.yaml").read_text())


def test_the_template_is_only_missing_version_and_sha256() -> None:
    template = yaml.safe_load(TEMPLATE.read_text())
    problems = krew_problems("fencedlease", template)
    assert problems and all(p.startswith(("version", "sha256")) for p in problems), problems


def test_the_built_manifest_passes_krew_validation(built: tuple[Path, dict[str, Any]]) -> None:
    archive, manifest = built
    assert krew_problems("fencedlease", manifest) == []
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert manifest["spec"]["version"] == f"v{client['version']}"
    platforms = manifest["spec"]["platforms"]
    covered = {(p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"])
               for p in platforms}  # fmt: skip
    assert covered == {(o, a) for o in ("linux", "darwin") for a in ("amd64", "arm64")}
    for platform in platforms:  # one pure-Python archive for all of them
        assert platform["uri"].endswith(f"/v{client['version']}/{archive.name}")
        assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        assert platform["bin"] == "kubectl-fencedlease"  # kubectl's name for the plugin
    assert "python3 3.9 or newer" in manifest["spec"]["caveats"]
    with tarfile.open(archive) as tar:
        compiled = [n for n in tar.getnames() if n.endswith((".so", ".pyd", ".dylib"))]
    assert compiled == []


def test_the_archive_carries_the_license_and_krew_installs_it(
    built: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """krew's manifest has no license field: its index wants LICENSE in the archive, copied
    into the installed plugin by a ``files`` operation."""
    archive, manifest = built
    with tarfile.open(archive) as tar:
        for name in ("LICENSE", "NOTICE"):
            member = tar.extractfile(name)
            assert member is not None, name
            assert member.read() == (ROOT / name).read_bytes(), name
    assert "Apache-2.0" in manifest["spec"]["caveats"]
    for platform in manifest["spec"]["platforms"]:  # one archive, every platform installs it
        assert {"LICENSE", "NOTICE"} <= {op["from"] for op in platform["files"]}
    bindir = krew_install(archive, manifest, tmp_path / "krew")
    installed = (bindir / "kubectl-fencedlease").resolve().parent
    assert (installed / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()


def krew_install(archive: Path, manifest: dict[str, Any], krew_root: Path) -> Path:
    """What ``kubectl krew install --manifest --archive`` does: unpack, apply ``files``,
    link ``bin`` into ``<root>/bin``.  Returns that bin directory."""
    (platform,) = [
        p
        for p in manifest["spec"]["platforms"]
        if p["selector"]["matchLabels"] == {"os": "linux", "arch": "amd64"}
    ]
    unpacked = krew_root / "download"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    store = krew_root / "store" / "fencedlease" / manifest["spec"]["version"]
    store.mkdir(parents=True)
    for op in platform["files"]:
        for match in sorted(unpacked.iterdir()):
            if fnmatch.fnmatch(match.name, op["from"]):
                shutil.move(str(match), store / op["to"] / match.name)
    binary = store / platform["bin"]
    assert binary.is_file() and os.access(binary, os.X_OK), binary
    bindir = krew_root / "bin"
    bindir.mkdir()
    (bindir / "kubectl-fencedlease").symlink_to(binary)
    return bindir


def test_installed_as_krew_does_it_runs_under_kubectl(
    built: tuple[Path, dict[str, Any]], tmp_path: Path, cluster: LocalCluster
) -> None:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("no /usr/bin/python3 to run the plugin with")
    archive, manifest = built
    bindir = krew_install(archive, manifest, tmp_path / "krew")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    kubectl = str(binary_path("kubectl"))
    # Debian's bare python3, then the oldest and the newest supported Python as python3.
    for python in [Path("/usr/bin/python3"), *pythons()]:
        first = tmp_path / f"py-{python.name}-{abs(hash(str(python)))}"
        first.mkdir()
        (first / "python3").symlink_to(python)
        listed = subprocess.run(
            [kubectl, "fencedlease", "--kubeconfig", str(cluster.kubeconfig), "status", "-A",
             "-o", "json"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**env, "PATH": f"{first}:{env['PATH']}"},
        )  # fmt: skip
        assert listed.returncode == 0, (python, listed.stderr)
        assert json.loads(listed.stdout)["kind"] == "List"
    version = subprocess.run(
        [kubectl, "fencedlease", "--version"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("kubectl-fencedlease "), version
    missing = subprocess.run(
        [kubectl, "fencedlease", "--kubeconfig", str(tmp_path / "none"), "status"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert missing.returncode == 1 and "cannot read kubeconfig" in missing.stderr
    assert "Traceback" not in missing.stderr
