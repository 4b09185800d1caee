"""Locally built images and the node's containerd config, checked without a runtime."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from fencedlease.local import images
from fencedlease.local.images import Layer, oci_archive
from fencedlease.local.runtime import Containerd


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out[m.name] = f.read() if f else b""
        return out


def test_oci_archive_is_deterministic_and_named() -> None:
    layer = Layer(files={"bin/x": (b"x", 0o755)}, dirs={"bin": 0o755}, links={"bin/y": "x"})
    a = oci_archive("fencedlease.local/x:1", [layer.tar()], {"Entrypoint": ["/bin/x"]})
    b = oci_archive("fencedlease.local/x:1", [layer.tar()], {"Entrypoint": ["/bin/x"]})
    assert a == b  # same inputs, same bytes: the image cache key is stable
    files = members(a)
    index = json.loads(files["index.json"])
    annotations = index["manifests"][0]["annotations"]
    assert annotations["io.containerd.image.name"] == "fencedlease.local/x:1"
    manifest = files["blobs/sha256/" + index["manifests"][0]["digest"].split(":")[1]]
    layer_digest = json.loads(manifest)["layers"][0]["digest"].split(":")[1]
    rootfs = members(files[f"blobs/sha256/{layer_digest}"])
    assert rootfs["bin/x"] == b"x" and "bin/y" in rootfs


def test_containerd_keeps_everything_under_its_base(tmp_path: Path) -> None:
    config = Containerd(tmp_path, "fencedlease.local/pause:1", tmp_path / "cni").config()
    assert "restrict_oom_score_adj = true" in config
    for line in config.splitlines():
        if line.strip().startswith(("root", "state", "address", "path", "Root")) and '"/' in line:
            assert str(tmp_path) in line, line


def test_two_operator_builds_never_overlap_in_the_shared_buildah_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second build's clean-up (`buildah rm --all`) once removed the first build's containers
    mid-step ("identifier is not a container"): builds sharing the store take turns."""
    events: list[str] = []
    second: list[threading.Thread] = []

    def fake_run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        if "rm" in cmd:
            events.append("rm --all")
        return subprocess.CompletedProcess(cmd, 0, stdout="base-id\n", stderr="")

    def fake_build(cmd: list[str], step: str, log: Path, timeout: float = 0) -> None:
        if "bud" in cmd:
            events.append("bud start")
            if not second:  # the first build: a second one starts while it runs
                repo = make_repo(tmp_path / "b", "b")
                second.append(threading.Thread(target=images.operator_archive, args=(repo, say)))
                second[0].start()
                second[0].join(timeout=1.0)  # with the lock it is still waiting
            events.append("bud end")
        if "push" in cmd:
            Path(cmd[-1].split(":")[1]).write_bytes(b"image")

    def say(_: str) -> None:
        pass

    def make_repo(root: Path, content: str) -> Path:
        (root / "operator").mkdir(parents=True)
        (root / "operator" / "x.py").write_text(content)
        return root

    monkeypatch.setattr(images, "cache_root", lambda: tmp_path / "cache")
    monkeypatch.setattr(images, "images_dir", lambda: tmp_path / "cache" / "images")
    monkeypatch.setattr(images, "ensure_build_tools", say)
    monkeypatch.setattr(images, "python_base_archive", lambda *_: ("base:1", tmp_path / "b.tar"))
    monkeypatch.setattr(images, "unmount_under", lambda _: None)
    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(images, "run_build", fake_build)
    images.operator_archive(make_repo(tmp_path / "a", "a"), say)
    second[0].join(timeout=10)
    assert not second[0].is_alive()
    assert events == ["bud start", "bud end", "rm --all", "bud start", "bud end", "rm --all"]
