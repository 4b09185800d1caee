"""The fault campaign's short profile, with its fixed seed, against the real system
(docs/reliability.md; ``make chaos`` runs the full one).

Two runs on the session's control plane, each in its own namespace with its own 3-member etcd
for the grant authority: the fenced run must be safe with at least 1,000 writes sent and every
fault kind injected, and the same holders and nemesis against the unfenced control resource
must be called unsafe (a campaign that cannot fail proves nothing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster
from tests.chaos.campaign import FAULTS, PROFILES, Campaign, run_campaign
from tests.chaos.checker import Report
from tests.chaos.report import summary


def _explain(campaign: Campaign, report: Report, lines: list[str]) -> str:
    violations = "\n".join(f"  {v.kind}: {v.detail}" for v in report.violations[:20])
    return (
        f"{summary(campaign.profile, campaign.counts, campaign.history, report)}\n"
        f"violations:\n{violations}\nprogress:\n" + "\n".join(lines[-20:]) + "\n" + campaign.logs()
    )


@pytest.mark.timeout(540)
async def test_the_short_campaign_finds_no_violation(cluster: LocalCluster, tmp_path: Path) -> None:
    lines: list[str] = []
    profile = PROFILES["short"]
    campaign, _, report = await run_campaign(profile, cluster, tmp_path / "short", log=lines.append)
    explain = _explain(campaign, report, lines)
    assert report.safe, explain
    assert campaign.target_met, explain
    assert campaign.count_writes() >= profile.writes, explain
    for kind in FAULTS:
        assert campaign.counts.get(kind, 0) >= 1, f"{kind} never injected\n{explain}"


@pytest.mark.timeout(300)
async def test_the_checker_calls_the_unfenced_control_unsafe(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    lines: list[str] = []
    profile = PROFILES["control"]
    campaign, _, report = await run_campaign(
        profile, cluster, tmp_path / "control", log=lines.append
    )
    assert not report.safe, _explain(campaign, report, lines)
    kinds = {v.kind for v in report.violations}
    assert kinds & {"stale_overwrite", "visible_regressed"}, _explain(campaign, report, lines)
