"""The CRDs through the real API server: schema, defaults, validation, printer columns, and the
status conditions the operator writes (API conventions: observedGeneration, a Ready summary)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import apply, lease, ready_pods, running_operator, wait_for


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
    assert header == ["NAME", "PHASE", "HOLDER", "TOKEN", "DURATION", "AGE"]


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


def columns(table: str) -> list[dict[str, str]]:
    """Rows of a kubectl table keyed by header (a header may hold one space: LEASE ID)."""
    header, *lines = table.splitlines()
    found = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]
    bounds = [start for _, start in found] + [None]
    return [
        {
            name: line[a:b].strip()
            for (name, _), a, b in zip(found, bounds, bounds[1:], strict=False)
        }
        for line in lines
    ]


def test_artifact_default_view_leaves_the_object_key_to_wide(
    cluster: LocalCluster, namespace: str
) -> None:
    key = "reports/2026/july/" + "x" * 200 + ".parquet"
    manifest = {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "catalog", "namespace": namespace},
        "spec": {
            "leaseRef": {"name": "report-july"},
            "fencingToken": 7,
            "objectRef": key,
            "operationId": "op-1",
        },
    }
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))
    plain = cluster.kubectl("get", "fa", "-n", namespace).stdout
    assert plain.split("\n")[0].split() == ["NAME", "LEASE", "TOKEN", "ACCEPTED", "AGE"]
    assert key not in plain
    (row,) = columns(cluster.kubectl("get", "fa", "-n", namespace, "-o", "wide").stdout)
    assert (row["OBJECT"], row["OPERATION"], row["TOKEN"]) == (key, "op-1", "7")


def test_artifact_status_declares_no_conditions(cluster: LocalCluster) -> None:
    """Nothing writes artifact conditions, so the schema does not declare (or keep) any."""
    crd = json.loads(
        cluster.kubectl("get", "crd", "fencedartifacts.fencedlease.io", "-o", "json").stdout
    )
    (version,) = crd["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert set(status) == {"acceptedFence", "acceptedAt", "observedGeneration", "kopf"}


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"type": "Ready", "status": "Maybe"}, "Unsupported value"),
        ({"type": "Ready", "status": "True"}, "lastTransitionTime: Required value"),
        (
            {
                "type": "Ready",
                "status": "True",
                "reason": "not camel case",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
            "status.conditions[0].reason",
        ),
        (
            {
                "type": "Ready",
                "status": "True",
                "reason": "Held",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": -1,
            },
            "observedGeneration",
        ),
    ],
)
def test_condition_fields_are_validated_by_the_schema(
    cluster: LocalCluster, namespace: str, condition: dict[str, object], expected: str
) -> None:
    cluster.kubectl("apply", "-f", "-", input=lease_manifest("checked", namespace))
    result = cluster.kubectl(
        "patch",
        "fl",
        "checked",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [condition]}}),
        check=False,
    )
    assert result.returncode != 0, f"{condition} was accepted"
    assert expected in result.stderr, result.stderr


def test_explain_describes_the_condition_fields(cluster: LocalCluster) -> None:
    out = cluster.kubectl("explain", "fl.status.conditions.observedGeneration").stdout
    assert "out of date" in out
    out = cluster.kubectl("explain", "fl.status.conditions").stdout
    assert "Ready" in out and "summary" in out


# ------------------------------------------------------- status written by the operator


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    with running_operator(
        cluster, tmp_path_factory.mktemp("crd-op"), "--role", "controller"
    ) as proc:
        yield proc


def ready_at_generation(cluster: LocalCluster, name: str, namespace: str, generation: int) -> Any:
    def probe() -> dict[str, object] | None:
        got = json.loads(cluster.kubectl("get", "fl", name, "-n", namespace, "-o", "json").stdout)
        status = got.get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions") or []}
        ready = conds.get("Ready") or {}
        ok = (
            got["metadata"]["generation"] == generation
            and ready.get("status") == "True"
            and ready.get("observedGeneration") == generation
            and status.get("observedGeneration") == generation
        )
        return got if ok else None

    return wait_for(probe, timeout=30, what=f"{name} Ready at generation {generation}")


def test_held_lease_is_ready_at_its_generation_and_shows_wide_columns(
    cluster: LocalCluster, namespace: str, operator: ManagedProcess
) -> None:
    ready_pods(cluster, namespace, "w-a")
    apply(cluster, lease("report-july", namespace, duration=30))
    got = ready_at_generation(cluster, "report-july", namespace, 1)
    status = got["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Held" and conds["Held"]["status"] == "True"
    assert conds["Ready"]["reason"] == "Held" and "w-a" in conds["Ready"]["message"]
    for c in conds.values():  # every condition describes the generation it was computed from
        assert c["observedGeneration"] == 1, c
        assert c["reason"] and c["lastTransitionTime"]

    # A spec change: a new generation, and the operator says it acted on it.
    cluster.kubectl(
        "patch", "fl", "report-july", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"leaseDurationSeconds": 20}}),
    )  # fmt: skip
    got = ready_at_generation(cluster, "report-july", namespace, 2)
    assert {c["observedGeneration"] for c in got["status"]["conditions"]} == {2}

    plain = cluster.kubectl("get", "fl", "report-july", "-n", namespace).stdout
    assert plain.splitlines()[0].split() == ["NAME", "PHASE", "HOLDER", "TOKEN", "DURATION", "AGE"]
    wide = cluster.kubectl("get", "fl", "report-july", "-n", namespace, "-o", "wide").stdout
    (row,) = columns(wide)
    assert list(row) == [
        "NAME", "PHASE", "HOLDER", "TOKEN", "DURATION", "AGE",
        "READY", "LEASE ID", "TRANSITIONS", "RENEWED",
    ]  # fmt: skip
    status = got["status"]
    assert row["READY"] == "True"
    assert row["LEASE ID"] == status["leaseId"]
    assert row["TRANSITIONS"] == str(status["transitions"]) == "1"
    assert row["RENEWED"] and row["RENEWED"] != "<none>"  # an age such as 3s
