"""Container images built on this machine, no registry: OCI archives imported into containerd.

- ``pause``: the sandbox image, a static Go program (reaps children, exits on SIGTERM/SIGINT);
- ``busybox``: a small worker base, Debian's ``busybox-static`` with its applets linked in
  ``/bin``.

The operator image is built from the repository's ``Dockerfile`` with buildah by
:func:`operator_archive`, on a Python base made here (:func:`python_base_archive`); the bundled
etcd's image is :func:`etcd_archive`. Every archive is cached in
``${FENCEDLEASE_CACHE:-~/.cache/fencedlease}/images/`` under a key derived from its inputs, so a
second run reuses it; importing into a node's containerd (``k8s.io`` namespace) is skipped when
the image is already there.

:func:`load_operator` also tags the operator image with the name a real cluster pulls (the
chart's default repository and ``appVersion``: :func:`release_name`), so the examples' manifests
apply verbatim on the local node (``imagePullPolicy: IfNotPresent``). For ``make run NODE=1``::

    sudo .venv/bin/python -m fencedlease.local.images [--state-dir D]
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fencedlease.local.binaries import BuildError, cache_root, go_tool
from fencedlease.local.buildah import (
    DEBIAN_SUITE,
    PYTHON_BASE_PACKAGES,
    build_lock,
    buildah_command,
    ca_bundle,
    debian_mirror,
    ensure_build_tools,
    run_build,
    unmount_under,
)
from fencedlease.local.cluster import ClusterError, default_state_dir
from fencedlease.local.runtime import Containerd

Say = Callable[[str], None]

PAUSE_IMAGE = "fencedlease.local/pause:1"
BUSYBOX_IMAGE = "fencedlease.local/busybox:1"

_PAUSE_GO = """\
// pause: the sandbox process of every Pod. Reaps children; exits 0 on SIGINT or SIGTERM.
package main

import (
\t"os"
\t"os/signal"
\t"syscall"
)

func main() {
\tsignals := make(chan os.Signal, 8)
\tsignal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
\tfor s := range signals {
\t\tif s != syscall.SIGCHLD {
\t\t\tos.Exit(0)
\t\t}
\t\tfor {
\t\t\tvar status syscall.WaitStatus
\t\t\tpid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
\t\t\tif pid <= 0 || err != nil {
\t\t\t\tbreak
\t\t\t}
\t\t}
\t}
}
"""


@dataclass
class Layer:
    """A deterministic filesystem layer: files, directories and symlinks, owned by root."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # path -> (data, mode)
    dirs: dict[str, int] = field(default_factory=dict)  # path -> mode
    links: dict[str, str] = field(default_factory=dict)  # path -> target

    def tar(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            entries: list[tuple[str, tarfile.TarInfo, bytes | None]] = []
            for path, mode in self.dirs.items():
                info = tarfile.TarInfo(path.strip("/"))
                info.type, info.mode = tarfile.DIRTYPE, mode
                entries.append((path, info, None))
            for path, target in self.links.items():
                info = tarfile.TarInfo(path.strip("/"))
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                entries.append((path, info, None))
            for path, (data, mode) in self.files.items():
                info = tarfile.TarInfo(path.strip("/"))
                info.size, info.mode = len(data), mode
                entries.append((path, info, data))
            for _, info, content in sorted(entries, key=lambda e: e[0]):
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(content) if content is not None else None)
        return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(name: str, layers: list[bytes], config: dict[str, object]) -> bytes:
    """An OCI image layout (as a tar) holding one image named ``name``."""
    blobs: dict[str, bytes] = {}
    layer_descs = []
    for layer in layers:
        digest = _digest(layer)
        blobs[digest] = layer
        layer_descs.append(
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": digest,
                "size": len(layer),
            }
        )
    image_config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in layer_descs]},
            "history": [{"created_by": "fencedlease.local.images"} for _ in layers],
        },
        sort_keys=True,
    ).encode()
    blobs[_digest(image_config)] = image_config
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(image_config),
                "size": len(image_config),
            },
            "layers": layer_descs,
        },
        sort_keys=True,
    ).encode()
    blobs[_digest(manifest)] = manifest
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    out = Layer(
        files={
            "oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644),
            "index.json": (index, 0o644),
            **{f"blobs/sha256/{d.split(':', 1)[1]}": (b, 0o644) for d, b in blobs.items()},
        },
        dirs={"blobs": 0o755, "blobs/sha256": 0o755},
    )
    return out.tar()


def images_dir() -> Path:
    return cache_root() / "images"


def cached(slug: str, key: str, build: Callable[[], bytes], say: Say) -> Path:
    """The image archive ``slug`` of content ``key`` in :func:`images_dir`: ``build()`` on
    first use only, written atomically."""
    path = images_dir() / f"{slug}-{key[:16]}.tar"
    if path.exists():
        return path
    say(f"building image {slug} (first use only; cached in {path})")
    data = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.partial")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def go_version() -> str:
    """``go version`` of the machine's Go: part of the content key of every Go-built image."""
    return subprocess.run([go_tool(), "version"], capture_output=True, text=True, check=True).stdout


def pause_archive(say: Say) -> Path:
    key = hashlib.sha256((_PAUSE_GO + go_version()).encode()).hexdigest()

    def build() -> bytes:
        with tempfile.TemporaryDirectory(prefix="fencedlease-pause-") as tmp:
            src = Path(tmp)
            (src / "go.mod").write_text("module fencedlease.local/pause\n\ngo 1.26\n")
            (src / "main.go").write_text(_PAUSE_GO)
            env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
            result = subprocess.run(
                [go_tool(), "build", "-trimpath", "-ldflags=-s -w", "-o", "pause", "."],
                cwd=src,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise BuildError(f"building the pause image's program failed: {result.stderr}")
            binary = (src / "pause").read_bytes()
        layer = Layer(files={"pause": (binary, 0o755)})
        return oci_archive(PAUSE_IMAGE, [layer.tar()], {"Entrypoint": ["/pause"]})

    return cached("pause", key, build, say)


BUSYBOX = Path("/bin/busybox")


def busybox_archive(say: Say) -> Path:
    binary = BUSYBOX.read_bytes()
    key = hashlib.sha256(binary).hexdigest()

    def build() -> bytes:
        applets = subprocess.run(
            [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
        ).stdout.split()
        layer = Layer(
            files={
                "bin/busybox": (binary, 0o755),
                "etc/passwd": (b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:\n", 0o644),
                "etc/group": (b"root:x:0:\nnobody:x:65534:\n", 0o644),
            },
            dirs={"bin": 0o755, "etc": 0o755, "tmp": 0o1777, "root": 0o700},
            links={f"bin/{a}": "busybox" for a in applets if a != "busybox"},
        )
        env = ["PATH=/bin"]
        return oci_archive(BUSYBOX_IMAGE, [layer.tar()], {"Cmd": ["/bin/sh"], "Env": env})

    return cached("busybox", key, build, say)


def import_image(containerd: Containerd, name: str, archive: Path) -> None:
    """Import ``archive`` into containerd's ``k8s.io`` namespace unless ``name`` is there."""
    listed = containerd.ctr("images", "ls", "-q", check=False).stdout.split()
    if name in listed:
        return
    containerd.ctr("images", "import", str(archive), timeout=600)
    listed = containerd.ctr("images", "ls", "-q", check=False).stdout.split()
    if name not in listed:
        raise BuildError(f"importing {archive} did not create image {name} (have: {listed})")


def base_images(containerd: Containerd, say: Say) -> None:
    """Build (first use) and import the pause and busybox images."""
    import_image(containerd, PAUSE_IMAGE, pause_archive(say))
    import_image(containerd, BUSYBOX_IMAGE, busybox_archive(say))


# ------------------------------------------------------------------ the operator image

REPO_INPUTS = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "NOTICE",
    "operator",
    "client",
    "crds",
    "examples/report-writer/report_writer.py",
)


def python_base_archive(say: Say, log: Path) -> tuple[str, Path]:
    """A Python 3.11 base image made with debootstrap from Debian packages (name, archive)."""
    mirror = debian_mirror()
    key = hashlib.sha256(
        json.dumps([DEBIAN_SUITE, mirror, PYTHON_BASE_PACKAGES]).encode()
    ).hexdigest()
    name = f"fencedlease.local/python-base:{key[:12]}"

    def build() -> bytes:
        with tempfile.TemporaryDirectory(prefix="fencedlease-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            run_build(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PYTHON_BASE_PACKAGES)}",
                    DEBIAN_SUITE,
                    str(rootfs),
                    mirror,
                ],
                "debootstrap of the Python base image",
                log,
            )
            # The Dockerfile calls `python` (as the official python images provide it).
            (rootfs / "usr/local/bin/python").symlink_to("/usr/bin/python3")
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (rootfs / cache).glob("*"):
                    if item.is_file():
                        item.unlink()
            layer = subprocess.run(
                [
                    "tar",
                    "--numeric-owner",
                    "--sort=name",
                    "--mtime=@0",
                    "-C",
                    str(rootfs),
                    "-c",
                    ".",
                ],
                capture_output=True,
                check=True,
            ).stdout
        config: dict[str, object] = {
            "Env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
            ],
            "Cmd": ["python3"],
        }
        return oci_archive(name, [layer], config)

    return name, cached("python-base", key, build, say)


def _repo_key(repo: Path, base: str) -> str:
    digest = hashlib.sha256(base.encode())
    for top in REPO_INPUTS:
        root = repo / top
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if any(part.endswith(".egg-info") for part in path.parts):
                continue  # an editable install's metadata: not an input of the wheel
            digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def operator_archive(repo: Path, say: Say) -> tuple[str, Path]:
    """The operator image built from ``repo``'s Dockerfile with buildah (name, archive).

    The Dockerfile's base (``PYTHON_IMAGE``) cannot be pulled without a registry, so it is
    :func:`python_base_archive`. Cached by the content of every file the build reads.
    """
    log = cache_root() / "images" / "build.log"
    ensure_build_tools(say)
    base_name, base_archive = python_base_archive(say, log)
    key = _repo_key(repo, base_name)
    name = f"fencedlease.local/fencedlease:{key[:12]}"
    store = cache_root() / "buildah"
    buildah = buildah_command(store)

    def build() -> bytes:
        pulled = subprocess.run(
            [*buildah, "pull", "-q", f"oci-archive:{base_archive}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if pulled.returncode != 0 or not pulled.stdout.strip():
            raise BuildError(f"buildah pull of {base_archive} failed: {pulled.stderr[-2000:]}")
        image_id = pulled.stdout.split()[-1]
        run_build([*buildah, "tag", image_id, base_name], "buildah tag (base)", log)
        bud = [
            *buildah,
            "bud",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--layers",
            "--pull-never",
            # This machine's trust store (it may hold a proxy's CA that Debian's lacks), for
            # the builder stage's downloads (pip wheel from the package index).
            "--volume",
            f"{ca_bundle()}:/etc/ssl/certs/ca-certificates.crt:ro",
            "--build-arg",
            f"PYTHON_IMAGE={base_name}",
            # The content key as the revision: it changes the runtime stage's LABEL, so no
            # cached layer of an older build is reused (buildah's layer cache does not see
            # through `RUN --mount=from=builder`).
            "--build-arg",
            f"REVISION=content-{key[:12]}",
            "-t",
            name,
            "-f",
            str(repo / "Dockerfile"),
            str(repo),
        ]
        step = "buildah bud (the operator image from the Dockerfile)"
        try:
            run_build(bud, step, log)
        except BuildError:
            # buildah (1.28) cannot bind-mount a stage whose every step came from its layer
            # cache (`--mount=from=builder`: "couldn't find .../merged/wheels"): build again
            # without the cache.
            say("the image build failed; once more without buildah's layer cache")
            run_build([*buildah, "bud", "--no-cache", *bud[len(buildah) + 1 :]], step, log)
        with tempfile.TemporaryDirectory(prefix="fencedlease-image-") as tmp:
            out = Path(tmp) / "image.tar"
            run_build([*buildah, "push", name, f"oci-archive:{out}:{name}"], "buildah push", log)
            return out.read_bytes()

    with build_lock(store):
        try:
            return name, cached("fencedlease", key, build, say)
        finally:
            # No build container or storage mount stays behind (the layer cache stays on disk).
            # Under the lock: `rm --all` would remove another build's containers mid-step.
            subprocess.run([*buildah, "rm", "--all"], capture_output=True, check=False)
            unmount_under(store)


def etcd_archive(say: Say) -> tuple[str, Path]:
    """The bundled etcd's image: the Go-built etcd, etcdctl and etcdutl (static) in
    /usr/local/bin, as in the upstream image (the chart's backup CronJob runs etcdctl, its
    restore Pods etcdutl)."""
    from fencedlease.local.binaries import ETCD_VERSION, binary_path

    tools = {b: binary_path(b).read_bytes() for b in ("etcd", "etcdctl", "etcdutl")}
    key = hashlib.sha256(b"".join(hashlib.sha256(t).digest() for t in tools.values())).hexdigest()
    name = f"fencedlease.local/etcd:{ETCD_VERSION}"

    def build() -> bytes:
        layer = Layer(
            files={f"usr/local/bin/{b}": (data, 0o755) for b, data in tools.items()},
            dirs={d: 0o755 for d in ("usr", "usr/local", "usr/local/bin", "var", "var/lib")}
            | {"tmp": 0o1777, "var/lib/etcd": 0o700},
        )
        return oci_archive(name, [layer.tar()], {"Entrypoint": ["/usr/local/bin/etcd"]})

    return name, cached("etcd", key, build, say)


# ------------------------------------------------------------------ the name a cluster pulls

RELEASE_REPOSITORY = "ghcr.io/fencedlease/fencedlease"
"""The chart's default ``image.repository`` (charts/fencedlease/values.yaml)."""


def release_name(repo: Path) -> str:
    """``ghcr.io/fencedlease/fencedlease:<appVersion>``: the chart's default image, which the
    examples' manifests name."""
    chart = (repo / "charts" / "fencedlease" / "Chart.yaml").read_text()
    for line in chart.splitlines():
        if line.startswith("appVersion:"):
            return f"{RELEASE_REPOSITORY}:{line.split(':', 1)[1].strip().strip(chr(34))}"
    raise BuildError("charts/fencedlease/Chart.yaml has no appVersion")


def tag_image(containerd: Containerd, source: str, target: str) -> None:
    """Point ``target`` at ``source``'s image in containerd (replacing an older ``target``; the
    content stays, ``source`` references it)."""
    containerd.ctr("images", "rm", target, check=False)
    containerd.ctr("images", "tag", source, target)


def load_operator(containerd: Containerd, repo: Path, say: Say) -> tuple[str, str]:
    """Build (first use; cached), import and tag the operator image: (local name, the name
    :func:`release_name` gives, which now points at the same image)."""
    name, archive = operator_archive(repo, say)
    import_image(containerd, name, archive)
    release = release_name(repo)
    tag_image(containerd, name, release)
    return name, release


def git_tree(repo: Path, commit: str, dest: Path) -> Path:
    """The files of ``commit`` (``git archive`` of ``repo``) extracted into ``dest``, for an
    earlier release's image: its own Dockerfile and sources, nothing of the work tree."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise BuildError(
            f"git archive {commit} failed (the build needs the git history): "
            f"{archive.stderr.decode(errors='replace').strip()}"
        )
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def operator_archive_at(repo: Path, commit: str, say: Say) -> tuple[str, Path]:
    """The operator image of an earlier ``commit`` (name, archive): :func:`operator_archive`
    of its ``git archive``, so it is cached by the content key of that tree like any build."""
    with tempfile.TemporaryDirectory(prefix=f"fencedlease-{commit[:12]}-") as tmp:
        return operator_archive(git_tree(repo, commit, Path(tmp)), say)


def main(argv: list[str] | None = None) -> int:
    """Load the operator image (with the examples' worker) into a running ``local up --node``."""
    return load_main(argv, "python -m fencedlease.local.images", main.__doc__, load_operator)


def load_main(
    argv: list[str] | None,
    prog: str,
    description: str | None,
    load: Callable[[Containerd, Path, Say], tuple[str, str]],
) -> int:
    """The command line of a module loading an image into a running ``local up --node``:
    ``[--state-dir D] [--repo R]``; ``load(containerd, repo, print)`` gives (local name,
    release name). 2: no node running; 1: the build or the import failed."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the checkout to build")
    args = parser.parse_args(argv)
    state = args.state_dir or default_state_dir()
    containerd = Containerd(state / "containerd", "", state / "cni")
    if not containerd.socket.exists():
        print(f"no node running under {state} (make run NODE=1 first)", file=sys.stderr)
        return 2
    try:
        name, release = load(containerd, args.repo, print)
    except (BuildError, ClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"loaded {name} as {release}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
