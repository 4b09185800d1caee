"""The loopback OCI registry of ``make e2e`` (local/registry.py), without a node: ``crane
registry serve`` starts on a port of its own, an OCI archive pushed to it is served under the
archive's own digest, a chart pushed with ``helm push`` installs from ``oci://`` (here: ``helm
show`` / ``helm template``), containerd's hosts.toml names it as plain HTTP, and a failed push
says why with the registry's log."""

from __future__ import annotations

import json
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fencedlease.local import registry as loopback
from fencedlease.local.binaries import binary_path
from fencedlease.local.images import Layer, oci_archive
from fencedlease.local.runtime import Containerd

from .chart import CHART

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[loopback.Registry]:
    log = tmp_path_factory.mktemp("registry") / "registry.log"
    with loopback.serving(log) as running:
        yield running
    assert not running.process or not running.process.alive()


def archive_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        (manifest,) = json.loads(index.read())["manifests"]
    return str(manifest["digest"])


def test_it_listens_on_loopback_and_answers_v2(reg: loopback.Registry) -> None:
    host, port = reg.address.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert reg.ready()


def test_an_oci_archive_is_served_under_its_own_digest(
    reg: loopback.Registry, tmp_path: Path
) -> None:
    layer = Layer(files={"hello.txt": (b"fencedlease\n", 0o644)}).tar()
    archive = tmp_path / "image.oci.tar"
    archive.write_bytes(oci_archive("example.test/probe:1", [layer], {"Cmd": ["/hello"]}))
    digest = reg.push_image(archive, "fencedlease/probe", "1.2.3")
    assert digest == archive_digest(archive)
    crane = str(binary_path("crane"))
    manifest = subprocess.run(
        [crane, "manifest", f"{reg.address}/fencedlease/probe@{digest}"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert json.loads(manifest)["layers"][0]["size"] == len(layer)


def test_a_pushed_chart_is_read_back_from_oci(reg: loopback.Registry, tmp_path: Path) -> None:
    helm = binary_path("helm")
    subprocess.run(
        [str(helm), "package", str(CHART), "--destination", str(tmp_path)],
        capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    (tgz,) = tmp_path.glob("fencedlease-*.tgz")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    url = reg.push_chart(helm, tgz)
    assert url == f"oci://{reg.address}/charts"
    shown = subprocess.run(
        [str(helm), "show", "chart", f"{url}/fencedlease", "--version", str(version),
         "--plain-http"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr + reg.logs()
    assert yaml.safe_load(shown.stdout)["version"] == version


def test_a_failed_push_says_why_with_the_registry_log(
    reg: loopback.Registry, tmp_path: Path
) -> None:
    (tmp_path / "broken.tar").write_bytes(Layer(files={"x": (b"x", 0o644)}).tar())
    with pytest.raises(loopback.RegistryError, match=r"(?s)crane push.*index.json.*registry log"):
        reg.push_image(tmp_path / "broken.tar", "fencedlease/broken", "0")


def test_containerd_is_told_the_registry_is_plain_http(tmp_path: Path) -> None:
    containerd = Containerd(tmp_path / "containerd", "pause:1", tmp_path / "cni")
    cri = tomllib.loads(containerd.config())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["registry"]["config_path"] == str(containerd.registry_config_dir)
    hosts = loopback.containerd_hosts(containerd.registry_config_dir, "127.0.0.1:5123")
    assert hosts == containerd.registry_config_dir / "127.0.0.1:5123" / "hosts.toml"
    text = hosts.read_text()
    assert 'server = "http://127.0.0.1:5123"' in text
    assert '[host."http://127.0.0.1:5123"]' in text and '"pull", "resolve"' in text
