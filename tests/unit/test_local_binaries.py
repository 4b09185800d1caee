"""The binaries cache under concurrent callers (local/binaries.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from fencedlease.local import binaries


def test_concurrent_callers_build_a_tool_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two callers (say `make chaos` and a test run) both find etcd missing: one builds, the
    other waits for it and then finds the binaries, instead of a second build writing the same
    ``.partial`` directory."""
    monkeypatch.setenv("FENCEDLEASE_CACHE", str(tmp_path))
    tool = binaries.TOOLS["etcd"]
    building = threading.Event()
    release = threading.Event()
    builds: list[str] = []

    def fake_build(tool: binaries.Tool, out: Path) -> None:
        builds.append(threading.current_thread().name)
        building.set()
        assert release.wait(10), "the test never released the first build"
        out.mkdir(parents=True)
        for binary, _ in tool.binaries:
            (out / binary).write_text("built")

    monkeypatch.setattr(binaries, "_build", fake_build)
    results: dict[str, Path] = {}

    def call(name: str) -> None:
        results[name] = binaries.ensure("etcd")

    first = threading.Thread(target=call, args=("first",), name="first")
    first.start()
    assert building.wait(10), "the first caller never started its build"
    second = threading.Thread(target=call, args=("second",), name="second")
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second caller did not wait for the build in progress"
    release.set()
    first.join(10)
    second.join(10)
    assert builds == ["first"]
    assert results["first"] == results["second"] == binaries.tool_dir(tool)


def _fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str) -> Path:
    """An ``apt-get`` on PATH whose ``download`` drops a real .deb (built here with
    ``dpkg-deb -b``) holding ``inside``; the real ``dpkg-deb`` extracts it."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("no dpkg-deb on this machine")
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: prometheus\nVersion: 2.42.0+ds-5+deb12u1\nArchitecture: amd64\n"
        "Maintainer: test <t@example.org>\nDescription: test\n"
    )
    (root / inside).parent.mkdir(parents=True)
    (root / inside).write_text("#!/bin/sh\necho promtool from the package\n")
    (root / inside).chmod(0o755)
    deb = tmp_path / "prometheus.deb"
    subprocess.run(["dpkg-deb", "-b", str(root), str(deb)], check=True, capture_output=True)
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = download ] && cp {deb} ./x.deb\n'
    )
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_promtool_comes_from_its_pinned_debian_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEDLEASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(binaries, "_NO_DEBIAN", set())
    calls = _fake_apt(tmp_path, monkeypatch, "usr/bin/promtool")

    def no_go_build(tool: binaries.Tool, out: Path) -> None:
        raise AssertionError("promtool was built from Go although its package was there")

    monkeypatch.setattr(binaries, "_build", no_go_build)
    path = binaries.binary_path("promtool")
    assert (
        path
        == binaries.debian_dir(binaries.TOOLS["promtool"], binaries.PROMTOOL_DEBIAN) / "promtool"
    )
    assert subprocess.run([str(path)], capture_output=True, text=True).stdout.strip() == (
        "promtool from the package"
    )
    assert calls.read_text().split() == ["download", "-qq", "prometheus=2.42.0+ds-5+deb12u1"]
    binaries.binary_path("promtool")  # cached: apt is not asked again
    assert len(calls.read_text().splitlines()) == 1


def test_promtool_falls_back_to_its_go_build_where_the_package_cannot_be_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEDLEASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(binaries, "_NO_DEBIAN", set())
    calls = _fake_apt(tmp_path, monkeypatch, "usr/bin/not-promtool")  # a package without it
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # no `apt-get update` retry
    builds: list[str] = []

    def fake_build(tool: binaries.Tool, out: Path) -> None:
        builds.append(tool.name)
        out.mkdir(parents=True)
        (out / "promtool").write_text("built")

    monkeypatch.setattr(binaries, "_build", fake_build)
    tool = binaries.TOOLS["promtool"]
    assert binaries.binary_path("promtool") == binaries.tool_dir(tool) / "promtool"
    assert binaries.binary_path("promtool") == binaries.tool_dir(tool) / "promtool"
    assert builds == ["promtool"]
    assert len(calls.read_text().splitlines()) == 1  # tried once in this process
    assert not binaries.debian_dir(tool, binaries.PROMTOOL_DEBIAN).exists()


def test_helm_is_linked_with_the_kubernetes_version_of_its_client_go() -> None:
    """As helm's Makefile: k8s.io/client-go v0.X.Y -> Kubernetes 1.X, the default of helm's
    --kube-version (checked against Chart.yaml's kubeVersion)."""
    assert binaries.helm_kube_version("v0.37.0") == ("1", "37")
    assert binaries.helm_kube_version("v0.40.3") == ("1", "40")


def test_a_new_build_revision_is_a_new_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEDLEASE_CACHE", str(tmp_path))
    helm = binaries.TOOLS["helm"]
    assert helm.revision >= 1
    assert binaries.tool_dir(helm) == tmp_path / "bin" / f"helm-{helm.version}-r{helm.revision}"
    etcd = binaries.TOOLS["etcd"]
    assert binaries.tool_dir(etcd) == tmp_path / "bin" / f"etcd-{etcd.version}"


def test_crane_is_an_extra_tool_built_by_name() -> None:
    crane = binaries.TOOLS["crane"]
    assert "crane" not in binaries.default_tools() + binaries.default_tools(node=True)
    assert crane.binaries == (("crane", "github.com/google/go-containerregistry/cmd/crane"),)
