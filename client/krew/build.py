"""Build the krew archive of ``kubectl fencedlease`` and its manifest (``make krew``).

The archive holds a launcher ``kubectl-fencedlease`` (``#!/usr/bin/env python3``), ``LICENSE``
and ``NOTICE`` (krew has no license field: its index wants the file in the archive, copied by a
``files`` operation), and ``lib/``:
fencedlease-client and its dependencies installed by the pip of ``--python`` (the oldest Python
the client supports, 3.9, so that the versions and markers chosen hold for it and every newer
one), then stripped of compiled extensions (PyYAML and charset-normalizer fall back to their
pure-Python code): one archive for every platform the manifest lists (Linux and macOS, amd64
and arm64), run by any python3 >= 3.9.  The launcher puts ``lib/`` first and leaves the
interpreter's own site-packages out, so the user's installed packages never mix with it.  The
tarball is deterministic for a given ``lib/`` (sorted entries, fixed times and owners).  The
manifest template (client/krew/fencedlease.yaml) gets the version and the archive's sha256.

Usage: python client/krew/build.py --out DIR [--wheel fencedlease_client-X-py3-none-any.whl]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
CLIENT = HERE.parent
REPO = CLIENT.parent
LICENSE_FILES = ("LICENSE", "NOTICE")  # Apache-2.0 and its notice, from the repository's root
MTIME = 1_700_000_000  # fixed: the same lib/ gives the same archive

LAUNCHER = '''#!/usr/bin/env python3
"""kubectl fencedlease, installed by krew: fencedlease-client with its dependencies in lib/."""
import os
import sys

if sys.version_info < (3, 9):
    sys.exit("error: kubectl fencedlease needs python3 >= 3.9, not %d.%d" % sys.version_info[:2])
LIB = os.path.join(os.path.dirname(os.path.realpath(__file__)), "lib")
sys.path[:] = [LIB] + [p for p in sys.path if not p.endswith(("site-packages", "dist-packages"))]

from fencedlease.client.kubectl import main  # noqa: E402

sys.exit(main())
'''


def version() -> str:
    return str(tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["version"])


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(CLIENT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("fencedlease_client-*.whl")
    return wheel


COMPILED = ("*.so", "*.pyd", "*.dylib")
"""Compiled extensions, removed from ``lib/``: each has a pure-Python fallback, and a
platform's binary would not load on the others (nor on another Python)."""


def stage(wheel: Path, root: Path, python: str = sys.executable) -> None:
    lib = root / "lib"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(lib),
         str(wheel)],
        check=True,
    )  # fmt: skip
    shutil.rmtree(lib / "bin", ignore_errors=True)  # console scripts: the launcher replaces them
    for cache in list(lib.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    for pattern in COMPILED:
        for binary in list(lib.rglob(pattern)):
            binary.unlink()
    for name in LICENSE_FILES:  # krew's index wants the license in the archive and installed
        shutil.copyfile(REPO / name, root / name)
    launcher = root / "kubectl-fencedlease"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)


def archive(root: Path, target: Path) -> str:
    """A deterministic .tar.gz of ``root``'s contents; returns its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "", ""
            if path.is_file():
                info.mode = 0o755 if path.stat().st_mode & 0o100 else 0o644
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            elif path.is_dir():
                info.mode = 0o755
                tar.addfile(info)
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    target.write_bytes(packed.getvalue())
    return hashlib.sha256(packed.getvalue()).hexdigest()


def render(template: str, ver: str, sha256: str) -> str:
    return template.replace("vVERSION", f"v{ver}").replace("SHA256", sha256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheel", type=Path, help="fencedlease-client's wheel (default: build)")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the Python whose pip installs lib/ (make krew: the oldest supported, 3.9)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ver = version()
    with tempfile.TemporaryDirectory(prefix="fencedlease-krew-") as tmp:
        wheel = args.wheel or build_wheel(Path(tmp) / "wheel")
        root = Path(tmp) / "root"
        root.mkdir()
        stage(wheel, root, args.python)
        target = args.out / f"kubectl-fencedlease-v{ver}.tar.gz"
        sha256 = archive(root, target)
    manifest = args.out / "fencedlease.yaml"
    manifest.write_text(render((HERE / "fencedlease.yaml").read_text(), ver, sha256))
    print(f"{target}\n{manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
