"""The Go example's image (examples/go-controller, docs/go.md): a static controller-runtime
binary in a one-file layer, built with the machine's Go and no registry, like the ``pause``
image of :mod:`fencedlease.local.images`.

Cached under ``${FENCEDLEASE_CACHE:-~/.cache/fencedlease}/images/`` by the content of the
example's and the ``go/`` module's sources (``*.go`` but tests, ``go.mod``, ``go.sum``) and the
Go version: a second run rebuilds nothing. Go's own caches (``go env GOMODCACHE``/``GOCACHE``)
hold the modules and compiled packages, so a rebuild after an edit compiles only what changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from fencedlease.local.binaries import BuildError, go_tool
from fencedlease.local.images import Layer, Say, _cached, _go_version, oci_archive

EXAMPLE = Path("examples") / "go-controller"
SOURCES = (Path("go"), EXAMPLE)
BINARY = "go-controller"
USER = "65532:65532"


def source_key(repo: Path) -> str:
    """The content key of every file the build reads (tests excluded), and the Go version."""
    digest = hashlib.sha256(_go_version().encode())
    for top in SOURCES:
        for path in sorted((repo / top).rglob("*")):
            name = path.name
            if not path.is_file() or name.endswith("_test.go"):
                continue
            if name.endswith(".go") or name in ("go.mod", "go.sum"):
                digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_binary(repo: Path, out: Path) -> None:
    """``go build`` of the example: static, trimmed, go.mod and go.sum as they are."""
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    result = subprocess.run(
        [go_tool(), "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."],
        cwd=repo / EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if result.returncode != 0:
        raise BuildError(f"building {EXAMPLE} failed: {result.stderr[-4000:]}")


def go_controller_archive(repo: Path, say: Say) -> tuple[str, Path]:
    """The example controller's image (name, OCI archive): ``/go-controller`` as its
    entrypoint, run as ``65532:65532``; nothing else in it (no shell)."""
    key = source_key(repo)
    name = f"fencedlease.local/go-controller:{key[:12]}"

    def build() -> bytes:
        with tempfile.TemporaryDirectory(prefix="fencedlease-go-controller-") as tmp:
            out = Path(tmp) / BINARY
            build_binary(repo, out)
            binary = out.read_bytes()
        layer = Layer(files={BINARY: (binary, 0o755)}, dirs={"tmp": 0o1777})
        config: dict[str, object] = {"Entrypoint": [f"/{BINARY}"], "User": USER}
        return oci_archive(name, [layer.tar()], config)

    return name, _cached(BINARY, key, build, say)
