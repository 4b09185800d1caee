"""The tools that build the operator image on this machine, no registry: buildah (in its own
store under the cache, one build at a time) and debootstrap (the Python base), the Debian mirror
this machine's apt uses, the build log. :mod:`fencedlease.local.images` builds the images with
them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from fencedlease.local.binaries import BuildError
from fencedlease.local.runtime import apt_install

Say = Callable[[str], None]

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the Dockerfile's default base (python:3.11-slim-bookworm) provides that it uses.
PYTHON_BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
BUILD_PACKAGES = {"buildah": "/usr/bin/buildah", "debootstrap": "/usr/sbin/debootstrap"}


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    sources = Path("/etc/apt/sources.list")
    if sources.exists():
        for line in sources.read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[1] if not parts[1].startswith("[") else parts[2]
    return DEBIAN_MIRROR


def ensure_build_tools(say: Say) -> None:
    apt_install(BUILD_PACKAGES, "building the operator image", say)


def run_build(cmd: list[str], step: str, log: Path, timeout: float = 1800) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise BuildError(f"{step} failed (exit {rc}); log {log}:\n{tail}")


def ca_bundle() -> Path:
    env = os.environ.get("SSL_CERT_FILE")
    return Path(env) if env and Path(env).is_file() else Path("/etc/ssl/certs/ca-certificates.crt")


@contextlib.contextmanager
def build_lock(store: Path) -> Iterator[None]:
    """One image build at a time in the shared buildah store (several work trees, or ``make
    e2e`` beside a helper, share the cache): held across the build and its clean-up."""
    store.mkdir(parents=True, exist_ok=True)
    with (store / ".build.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def unmount_under(root: Path) -> None:
    """Unmount every mount point under ``root``, deepest first."""
    prefix = str(root.resolve())
    points = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4] == prefix or line.split()[4].startswith(prefix + "/")
    ]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True, check=False)


def buildah_command(store: Path) -> list[str]:
    """``buildah`` with its root, run root and storage driver in ``store`` (the shared cache)."""
    root, run = str(store / "root"), str(store / "run")
    return ["buildah", "--root", root, "--runroot", run, "--storage-driver", "overlay"]
