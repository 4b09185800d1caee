"""The binaries cache under concurrent callers (local/binaries.py)."""

from __future__ import annotations

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
