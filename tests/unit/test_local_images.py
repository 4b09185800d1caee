"""Locally built images and the node's containerd config, checked without a runtime."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

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
