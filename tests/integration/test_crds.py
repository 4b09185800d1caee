"""The CRDs through the real API server: schema, defaults, validation, printer columns."""

from __future__ import annotations

import json

import pytest

from fencedlease.local.cluster import LocalCluster


def lease_manifest(name: str, namespace: str, **spec: object) -> str:
    body = {
        "leaseDurationSeconds": 15,
        "holderSelector": {"matchLabels": {"app": "worker"}},
    }
    body.update(spec)
    return json.dumps(
        {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencedLease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": body,
        }
    )


def test_create_and_read_lease_with_defaults(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=lease_manifest("report-july", namespace))
    got = json.loads(
        cluster.kubectl("get", "fl", "report-july", "-n", namespace, "-o", "json").stdout
    )
    assert got["spec"]["fencingPolicy"] == "AllowEqual"  # schema default
    assert got["spec"]["leaseDurationSeconds"] == 15
    table = cluster.kubectl("get", "fencedleases", "-n", namespace).stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "HOLDER", "TOKEN", "EXPIRES", "AGE"]


@pytest.mark.parametrize(
    ("name", "spec", "expected"),
    [
        ("bad-policy", {"fencingPolicy": "Sometimes"}, "Unsupported value"),
        ("too-short", {"leaseDurationSeconds": 0}, "should be greater than or equal to 1"),
        ("too-long", {"leaseDurationSeconds": 86401}, "should be less than or equal to 86400"),
        (
            "bad-expr",
            {"holderSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "values must be non-empty",
        ),
        ("x" * 64, {}, "at most 63 characters"),
    ],
)
def test_api_server_rejects_invalid_lease(
    cluster: LocalCluster, namespace: str, name: str, spec: dict[str, object], expected: str
) -> None:
    result = cluster.kubectl(
        "apply", "-f", "-", input=lease_manifest(name, namespace, **spec), check=False
    )
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


def test_artifact_rejects_token_below_one(cluster: LocalCluster, namespace: str) -> None:
    manifest = {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "catalog", "namespace": namespace},
        "spec": {"leaseRef": {"name": "report-july"}, "fencingToken": 0, "objectRef": "k"},
    }
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0
    assert "spec.fencingToken" in result.stderr


def test_explain_is_useful(cluster: LocalCluster) -> None:
    out = cluster.kubectl("explain", "fencedlease.spec.leaseDurationSeconds").stdout
    assert "monotonic clock" in out
    out = cluster.kubectl("explain", "fa.spec.objectRef").stdout
    assert "immutable object" in out
