"""e2e on a real local node (``make e2e``): needs root, containerd (installed when missing)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.node import RESULTS, NodeEnv


@pytest.fixture(scope="session")
def state_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("E2E_STATE_DIR")
    return Path(env) if env else tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session", autouse=True)
def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("make e2e needs root (containerd, cgroups, network devices)")


@pytest.fixture
def fresh_node(state_root: Path) -> Iterator[NodeEnv]:
    """A node of its own (not the chart's), stopped by the test."""
    env = NodeEnv(state_root / "fresh")
    yield env
    env.down()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESULTS:
        terminalreporter.section("e2e figures")
        terminalreporter.write_line(json.dumps(RESULTS, indent=1))
