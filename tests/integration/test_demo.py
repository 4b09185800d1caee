"""``make demo`` (``fencedlease local demo``): the article's story against the real API server,
the operator and its fence webhook, and the timeline it prints.

The story (:class:`fencedlease.local.demo.Story`) runs against the session's control plane with
the operator and webhook of ``running_fence``; the whole command, which starts and stops a
control plane of its own, runs once as a user runs it and must leave no process behind.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fencedlease.client import KubeClient, KubeConfig
from fencedlease.local.cluster import LocalCluster
from fencedlease.local.demo import REPORT_A, REPORT_B, Story, Timeline

from .k8s import processes_using, running_fence

pytestmark = pytest.mark.timeout(240)


def check_timeline(timeline: Timeline, lines: list[str]) -> None:
    a, b = timeline.token_a, timeline.token_b
    assert a is not None and b is not None and a < b, (a, b)
    assert timeline.b_result == "applied"
    assert timeline.a_result == "stale_fence"
    assert timeline.refusal.startswith(f"stale_fence: token {a} is below the high-water mark {b}")
    assert (timeline.kept_ref, timeline.kept_token) == (REPORT_B, b)
    assert timeline.fenced
    # The printout tells the story in order: A granted, A frozen, B granted, B's write, A's
    # late write refused, the artifact keeping B's report.
    markers = [
        f"granted report-july: token {a}",
        "FREEZES",
        f"granted token {b} (> {a})",
        f"-> {REPORT_B} with token {b}: applied",
        f"THAWS and sends its queued write: report-july -> {REPORT_A}, token {a}",
        f"REFUSED: stale_fence: token {a} is below the high-water mark {b}",
        f"report-july -> {REPORT_B} (token {b})",
    ]
    text = "\n".join(lines)
    positions = [text.find(m) for m in markers]
    assert all(p >= 0 for p in positions), (markers, text)
    assert positions == sorted(positions), text
    times = [s.at for s in timeline.steps]
    assert times == sorted(times)


def test_the_story_ends_with_the_stale_write_refused(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    config = KubeConfig.from_kubeconfig(cluster.kubeconfig)
    with running_fence(cluster, tmp_path, namespace), KubeClient(config) as kube:
        timeline = Story(kube, namespace, lines.append).run()
    check_timeline(timeline, lines)


def test_the_command_starts_tells_and_stops_everything(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "fencedlease", "local", "demo", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "REFUSED: stale_fence: token " in out and "is below the high-water mark" in out, out
    assert "That is the fence." in out and "stopping the local control plane" in out, out
    assert processes_using(state) == []
