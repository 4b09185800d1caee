"""The Go example's image (examples/go-controller, docs/go.md): a static controller-runtime
binary in a one-file layer, built with the machine's Go and no registry, like the ``pause``
image of :mod:`fencedlease.local.images`.

Cached under ``${FENCEDLEASE_CACHE:-~/.cache/fencedlease}/images/`` by the content of the
example's and the ``go/`` module's sources (``*.go`` but tests, ``go.mod``, ``go.sum``) and the
Go version: a second run rebuilds nothing. Go's own caches (``go env GOMODCACHE``/``GOCACHE``)
hold the modules and compiled packages, so a rebuild after an edit compiles only what changed.

:func:`load_go_controller` also tags the image with the name the example's manifests give
(:func:`release_name`), so they apply verbatim on the local node. For ``make run NODE=1``::

    sudo .venv/bin/python -m fencedlease.local.go_example [--state-dir D]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from fencedlease.local import images
from fencedlease.local.binaries import BuildError, go_tool
from fencedlease.local.images import Layer, Say, cached, go_version, oci_archive
from fencedlease.local.runtime import Containerd

EXAMPLE = Path("examples") / "go-controller"
SOURCES = (Path("go"), EXAMPLE)
BINARY = "go-controller"
USER = "65532:65532"
RELEASE_REPOSITORY = "ghcr.io/fencedlease/go-controller"
"""Where a release would push the example's image; ``examples/go-controller/manifests.yaml``
names it."""


def source_key(repo: Path) -> str:
    """The content key of every file the build reads (tests excluded), and the Go version."""
    digest = hashlib.sha256(go_version().encode())
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

    return name, cached(BINARY, key, build, say)


def release_name(repo: Path) -> str:
    """``ghcr.io/fencedlease/go-controller:<appVersion>``: the name the example's manifests
    give (the chart's ``appVersion``, as the operator image's :func:`images.release_name`)."""
    return f"{RELEASE_REPOSITORY}:{images.release_name(repo).rsplit(':', 1)[1]}"


def load_go_controller(containerd: Containerd, repo: Path, say: Say) -> tuple[str, str]:
    """Build (first use; cached), import and tag the example's image: (local name, the name
    :func:`release_name` gives, which now points at the same image)."""
    name, archive = go_controller_archive(repo, say)
    images.import_image(containerd, name, archive)
    release = release_name(repo)
    images.tag_image(containerd, name, release)
    return name, release


def main(argv: list[str] | None = None) -> int:
    """Load the Go example's image into a running ``local up --node``."""
    return images.load_main(
        argv, "python -m fencedlease.local.go_example", main.__doc__, load_go_controller
    )


if __name__ == "__main__":
    raise SystemExit(main())
