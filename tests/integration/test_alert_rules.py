"""The chart's alerts, evaluated by Prometheus' own rule engine: ``promtool test rules`` (Debian's
promtool 2.42, or Prometheus 3.16's built from its Go module where apt cannot fetch it; both pass)
on the PrometheusRule the chart renders.

Each alert gets series that must make it fire (with its labels and its annotations, templates
expanded) and, where a single blip must not page anyone, series that must not.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.local.binaries import binary_path

from .chart import one, render

NS = "fl-system"


def _rules() -> list[dict[str, Any]]:
    docs = render("fencedlease", NS, "--set", "monitoring.enabled=true")
    groups: list[dict[str, Any]] = one(docs, "PrometheusRule")["spec"]["groups"]
    return groups


def _expanded(annotations: dict[str, str], labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus sends them: ``{{ $labels.x }}`` replaced."""

    def sub(text: str) -> str:
        return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)

    return {k: sub(v) for k, v in annotations.items()}


def _up(container: str, pod: str) -> str:
    """Prometheus' scrape-health series of one of the release's Pods (ServiceMonitor labels:
    job is the metrics Service, container the Pod's container)."""
    return (
        f'up{{namespace="fl-system",job="fencedlease-metrics",container="{container}",pod="{pod}"}}'
    )


# alert → (input series, eval time, the labels it fires with; None: it must not fire)
CASES: list[tuple[str, list[dict[str, str]], str, dict[str, str] | None]] = [
    (
        "FencedLeaseStaleFenceRejected",
        [
            {
                "series": 'fencedlease_fence_results_total{result="stale_fence",'
                'operation="update",namespace="fl-system"}',
                "values": "0 1 2 2 2",
            }
        ],
        "2m",
        {"namespace": "fl-system", "operation": "update", "severity": "warning"},
    ),
    (
        "FencedLeaseChurnSpike",
        [{"series": 'fencedlease_grants_total{namespace="fl-system"}', "values": "0+5x30"}],
        "20m",
        {"namespace": "fl-system", "severity": "warning"},
    ),
    (
        "FencedLeaseChurnSpike",  # a grant every 2 minutes: 5 in 10 minutes
        [{"series": 'fencedlease_grants_total{namespace="fl-system"}', "values": "0+0.5x30"}],
        "20m",
        None,
    ),
    (
        "FencedLeaseEtcdUnavailable",
        [{"series": 'fencedlease_etcd_errors_total{operation="renew"}', "values": "0+3x10"}],
        "8m",
        {"severity": "critical"},
    ),
    (
        "FencedLeaseEtcdUnavailable",  # one transient error does not page
        [{"series": 'fencedlease_etcd_errors_total{operation="renew"}', "values": "0 1 1 1 1 1 1"}],
        "3m",
        None,
    ),
    (
        "FencedLeaseRestoreGuard",
        [
            {
                "series": 'fencedlease_acquire_unavailable_total{code="restore_guard"}',
                "values": "0 4 8",
            }
        ],
        "2m",
        {"severity": "critical"},
    ),
    (
        "FencedLeaseControllerNoLeader",
        [
            {
                "series": 'fencedlease_controller_leader{namespace="fl-system",pod="a"}',
                "values": "0x5",
            },
            {
                "series": 'fencedlease_controller_leader{namespace="fl-system",pod="b"}',
                "values": "0x5",
            },
        ],
        "3m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseControllerNoLeader",
        [
            {
                "series": 'fencedlease_controller_leader{namespace="fl-system",pod="a"}',
                "values": "1x5",
            },
            {
                "series": 'fencedlease_controller_leader{namespace="fl-system",pod="b"}',
                "values": "0x5",
            },
        ],
        "3m",
        None,
    ),
    (
        "FencedLeaseControllerNoLeader",  # every Pod gone: no series at all
        [{"series": 'fencedlease_grants_total{namespace="fl-system"}', "values": "0x5"}],
        "3m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseControllerNoLeader",  # another release's leader does not count here
        [
            {
                "series": 'fencedlease_controller_leader{namespace="other",pod="a"}',
                "values": "1x5",
            },
            {
                "series": 'fencedlease_controller_leader{namespace="fl-system",pod="b"}',
                "values": "0x5",
            },
        ],
        "3m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseControllerDown",  # both replicas stop being scraped (evicted together)
        [
            {"series": _up("controller", "c-1"), "values": "1 1 1 stale"},
            {"series": _up("controller", "c-2"), "values": "1 1 1 0 0 0 0 0"},
            {"series": _up("webhook", "w-1"), "values": "1x8"},
        ],
        "7m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseControllerDown",  # one replica left: a drain, not an outage
        [
            {"series": _up("controller", "c-1"), "values": "1 1 1 stale"},
            {"series": _up("controller", "c-2"), "values": "1x8"},
        ],
        "7m",
        None,
    ),
    (
        "FencedLeaseControllerDown",  # a blip shorter than its `for` does not page
        [{"series": _up("controller", "c-1"), "values": "1 1 1 0 1 1 1 1"}],
        "7m",
        None,
    ),
    (
        "FencedLeaseEtcdBackupMissing",  # the last success 4 hours ago
        [
            {
                "series": 'kube_cronjob_status_last_successful_time{namespace="fl-system",'
                'cronjob="fencedlease-etcd-backup"}',
                "values": "0x300",
            }
        ],
        "4h",
        {"namespace": "fl-system", "cronjob": "fencedlease-etcd-backup", "severity": "warning"},
    ),
    (
        "FencedLeaseEtcdBackupMissing",  # hourly successes
        [
            {
                "series": 'kube_cronjob_status_last_successful_time{namespace="fl-system",'
                'cronjob="fencedlease-etcd-backup"}',
                "values": "0x59 3600x60 7200x60 10800x60 14400x60",
            }
        ],
        "4h",
        None,
    ),
    (
        "FencedLeaseWebhookDown",  # no webhook target at all (e.g. the Deployment deleted)
        [{"series": _up("controller", "c-1"), "values": "1x8"}],
        "5m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseWebhookDown",  # another release's webhook does not count here
        [
            {
                "series": 'up{namespace="fl-system",job="other-metrics",container="webhook"}',
                "values": "1x8",
            }
        ],
        "5m",
        {"namespace": "fl-system", "severity": "critical"},
    ),
    (
        "FencedLeaseWebhookDown",
        [{"series": _up("webhook", "w-1"), "values": "1x8"}],
        "5m",
        None,
    ),
    (
        "FencedLeaseRenewalsFailing",
        [
            {
                "series": 'fencedlease_renewals_total{result="unavailable",namespace="fl-system"}',
                "values": "0+2x20",
            }
        ],
        "15m",
        {"namespace": "fl-system", "severity": "warning"},
    ),
    (
        "FencedLeaseRenewalsFailing",  # one failed renewal (retried at once) does not fire
        [
            {
                "series": 'fencedlease_renewals_total{result="unavailable",namespace="fl-system"}',
                "values": "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
            }
        ],
        "4m",  # still in its 5-minute window: a shorter ``for`` would be firing now
        None,
    ),
    (
        "FencedLeaseGrantsStalled",
        [
            {
                "series": 'fencedlease_leases{phase="Pending",namespace="fl-system"}',
                "values": "2x30",
            },
            {"series": 'fencedlease_grants_total{namespace="fl-system"}', "values": "7x30"},
        ],
        "25m",
        {"namespace": "fl-system", "severity": "warning"},
    ),
    (
        "FencedLeaseGrantsStalled",  # Pending leases, but grants happen
        [
            {
                "series": 'fencedlease_leases{phase="Pending",namespace="fl-system"}',
                "values": "2x30",
            },
            {"series": 'fencedlease_grants_total{namespace="fl-system"}', "values": "7+1x30"},
        ],
        "25m",
        None,
    ),
    (
        "FencedLeaseWebhookConfigurationUnrestorable",
        [
            {
                "series": 'fencedlease_webhook_configuration_restores_total{reason="unrestorable"}',
                "values": "0 1 1",
            }
        ],
        "2m",
        {"severity": "critical"},
    ),
    (
        "FencedLeaseWebhookConfigurationLoosened",
        [
            {
                "series": 'fencedlease_webhook_configuration_restores_total{reason="altered",'
                'webhook="fence"}',
                "values": "0 0 1 1",
            }
        ],
        "5m",
        {"severity": "warning", "webhook": "fence"},
    ),
    (
        "FencedLeaseWebhookConfigurationLoosened",  # a FencePolicy's entry put back
        [
            {
                "series": 'fencedlease_webhook_configuration_restores_total{reason="altered",'
                'webhook="policy"}',
                "values": "0 0 1 1",
            },
            {
                "series": 'fencedlease_webhook_configuration_restores_total{reason="altered",'
                'webhook="fence"}',
                "values": "0 0 0 0",
            },
        ],
        "5m",
        {"severity": "warning", "webhook": "policy"},
    ),
    (
        "FencedLeaseWebhookConfigurationLoosened",  # only unrestorable: the critical alert's
        [
            {
                "series": 'fencedlease_webhook_configuration_restores_total{reason="unrestorable"}',
                "values": "0 1 1 1",
            }
        ],
        "5m",
        None,
    ),
    (
        "FencedLeaseWebhookSlow",  # every answer between 2.5 s and 5 s: p99 ~4.98 s > 4 s
        [
            {"series": 'fencedlease_admission_latency_seconds_bucket{le="2.5"}', "values": "0x20"},
            {
                "series": 'fencedlease_admission_latency_seconds_bucket{le="5.0"}',
                "values": "0+60x20",
            },
            {
                "series": 'fencedlease_admission_latency_seconds_bucket{le="+Inf"}',
                "values": "0+60x20",
            },
        ],
        "15m",
        {"severity": "warning"},
    ),
    (
        "FencedLeaseWebhookSlow",  # every answer under 10 ms
        [
            {
                "series": 'fencedlease_admission_latency_seconds_bucket{le="0.01"}',
                "values": "0+60x20",
            },
            {
                "series": 'fencedlease_admission_latency_seconds_bucket{le="+Inf"}',
                "values": "0+60x20",
            },
        ],
        "15m",
        None,
    ),
]


def _test_file(groups: list[dict[str, Any]], rules_file: Path) -> dict[str, Any]:
    annotations = {r["alert"]: r["annotations"] for g in groups for r in g["rules"]}
    tests = []
    for alert, series, at, labels in CASES:
        expected = (
            []
            if labels is None
            else [{"exp_labels": labels, "exp_annotations": _expanded(annotations[alert], labels)}]
        )
        tests.append(
            {
                "name": f"{alert} {'fires' if labels else 'stays quiet'}",
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}],
            }
        )
    return {"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests}


def _promtool_test(
    tmp_path: Path, groups: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(yaml.safe_dump(_test_file(groups, rules)))
    return subprocess.run(
        [str(binary_path("promtool")), "test", "rules", spec.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_alert_is_covered_by_a_firing_case() -> None:
    alerts = {r["alert"] for g in _rules() for r in g["rules"]}
    firing = {alert for alert, _, _, labels in CASES if labels is not None}
    assert alerts == firing, f"alerts without a promtool case: {alerts - firing}"


def test_promtool_evaluates_the_charts_alerts_as_documented(tmp_path: Path) -> None:
    groups = _rules()
    rules = tmp_path / "check.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    check = subprocess.run(
        [str(binary_path("promtool")), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    result = _promtool_test(tmp_path, groups)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_reports_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    """The check bites: with the NoLeader rule's threshold broken, its firing case fails."""
    groups = _rules()
    for group in groups:
        for rule in group["rules"]:
            if rule["alert"] == "FencedLeaseControllerNoLeader":
                rule["expr"] = rule["expr"].replace("< 1", "< 0")
    result = _promtool_test(tmp_path, groups)
    assert result.returncode != 0
    assert "FencedLeaseControllerNoLeader" in result.stdout + result.stderr


@pytest.fixture(autouse=True, scope="module")
def _promtool_built() -> None:
    binary_path("promtool")  # built once from its Go module (cached outside the repo)
