"""Child processes of the local cluster (``ManagedProcess``): started without running Python
between fork and exec, and stopped when the process that started them dies."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fencedlease.local.cluster import ManagedProcess


def test_children_start_without_python_between_fork_and_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``preexec_fn`` made subprocess fork (not vfork) a parent with gRPC threads and run
    gRPC's fork handlers; a child then never reached its exec (a flaky integration test)."""
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, argv: list[str], **kwargs: Any) -> None:
            seen["argv"], seen["kwargs"] = argv, kwargs

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    process = ManagedProcess("child", ["true"], tmp_path / "child.log")
    process.start()
    assert seen["kwargs"].get("preexec_fn") is None
    assert seen["argv"][-1] == "true"
    if shutil.which("setpriv"):
        assert seen["argv"][:4] == [shutil.which("setpriv"), "--pdeathsig", "TERM", "--"]
        assert seen["argv"][4:6] == ["/bin/sh", "-c"] and f"= {os.getpid()} ]" in seen["argv"][6]
    assert process._log is not None
    process._log.close()


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux's setpriv")
@pytest.mark.parametrize("setpriv_late", [False, True], ids=["setpriv", "parent-gone-first"])
def test_a_child_dies_with_the_process_that_started_it(tmp_path: Path, setpriv_late: bool) -> None:
    """``parent-gone-first``: a ``setpriv`` that reaches its ``prctl`` only after the parent
    died (a loaded machine's schedule, made certain by a second's sleep before it): the child
    must not be left running (it was, until the shell's parent check)."""
    pidfile = tmp_path / "child.pid"
    child = 0
    env = dict(os.environ)
    if setpriv_late:
        late = tmp_path / "bin" / "setpriv"
        late.parent.mkdir()
        late.write_text(f'#!/bin/sh\nsleep 1\nexec {shutil.which("setpriv")} "$@"\n')
        late.chmod(0o755)
        env["PATH"] = f"{late.parent}:{env['PATH']}"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from fencedlease.local.cluster import ManagedProcess\n"
            "p = ManagedProcess('sleeper', ['sleep', '300'], Path(sys.argv[1]) / 'c.log')\n"
            "p.start()\n"
            "assert p.proc is not None\n"
            "Path(sys.argv[2]).write_text(str(p.proc.pid))\n"
            "time.sleep(300)\n",
            str(tmp_path),
            str(pidfile),
        ],
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() or not pidfile.read_text():
            assert parent.poll() is None and time.monotonic() < deadline, "no child started"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _running(child):
            assert time.monotonic() < deadline, f"child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child and _running(child):
            os.kill(child, signal.SIGKILL)  # a failed run leaves no sleeper behind


def _running(pid: int) -> bool:
    """Alive and not a zombie (the orphan is reaped by init, maybe not at once)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
