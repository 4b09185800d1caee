"""``kubectl fencedlease``'s kubectl conventions (issue 34, item 3): ``-o table|wide|json|yaml``,
``-n`` / ``-A``, ``--context`` and ``--kubeconfig`` before or after the subcommand."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml

from fencedlease.client import kubectl
from fencedlease.client.api import lease_path


def lease(ns: str, name: str, token: int) -> dict[str, Any]:
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedLease",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"leaseDurationSeconds": 15, "fencingPolicy": "StrictlyGreater"},
        "status": {
            "phase": "Held",
            "holder": f"{name}-pod",
            "fencingToken": token,
            "leaseId": f"id{token}",
            "renewTime": "2026-07-01T12:00:00Z",
            "acquireTime": "2026-07-01T11:00:00Z",
            "transitions": 2,
        },
    }


class FakeKube:
    """What cmd_status reads: one namespaced list, the cluster-wide list, single leases."""

    def __init__(self) -> None:
        self.leases = [lease("a", "jobs", 41), lease("b", "reports", 57)]

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        for item in self.leases:
            meta = item["metadata"]
            if path == lease_path(meta["namespace"], meta["name"]):
                return item
            if path == lease_path(meta["namespace"]):
                return {
                    "items": [
                        i for i in self.leases if i["metadata"]["namespace"] == meta["namespace"]
                    ]
                }
        if path == "/apis/fencedlease.io/v1alpha1/fencedleases":
            return {"items": self.leases}
        return {"items": []}


def status(argv: list[str], capsys: pytest.CaptureFixture[str], ns: str = "a") -> str:
    args = kubectl.build_parser().parse_args(["status", *argv])
    assert kubectl.cmd_status(FakeKube(), ns, args) == 0  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_table_and_wide(capsys: pytest.CaptureFixture[str]) -> None:
    table = status([], capsys).splitlines()
    assert table[0].split() == ["NAME", "PHASE", "HOLDER", "TOKEN", "RENEWED"]
    assert table[1].split()[:4] == ["jobs", "Held", "jobs-pod", "41"] and len(table) == 2
    wide = status(["-o", "wide"], capsys).splitlines()
    assert wide[0].split()[5:] == ["LEASE-ID", "DURATION", "POLICY", "TRANSITIONS", "ACQUIRED"]
    assert "id41" in wide[1] and "StrictlyGreater" in wide[1] and "15s" in wide[1]
    every = status(["-A"], capsys).splitlines()
    assert every[0].split()[0] == "NAMESPACE"
    assert [r.split()[:2] for r in every[1:]] == [["a", "jobs"], ["b", "reports"]]


def test_json_and_yaml_are_the_objects(capsys: pytest.CaptureFixture[str]) -> None:
    one = json.loads(status(["jobs", "-o", "json"], capsys))
    assert one == lease("a", "jobs", 41)
    listing = yaml.safe_load(status(["-A", "-o", "yaml"], capsys))
    assert listing["kind"] == "List" and [
        i["status"]["fencingToken"] for i in listing["items"]
    ] == [
        41,
        57,
    ]
    assert json.loads(status(["-o", "json"], capsys, ns="empty"))["items"] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--kubeconfig", "k", "--context", "c", "-n", "ns", "status"],
        ["status", "--kubeconfig", "k", "--context", "c", "-n", "ns"],
        ["--kubeconfig", "k", "status", "--context", "c", "--namespace", "ns"],
    ],
)
def test_kubectl_flags_before_or_after_the_command(argv: list[str]) -> None:
    args = kubectl.build_parser().parse_args(argv)
    assert (args.kubeconfig, args.context, args.namespace) == ("k", "c", "ns")


def test_flags_not_given_are_absent() -> None:
    args = kubectl.build_parser().parse_args(["describe", "jobs", "-o", "yaml"])
    assert not hasattr(args, "namespace") and not hasattr(args, "context")
    assert isinstance(args, argparse.Namespace) and args.output == "yaml"


def test_all_namespaces_with_a_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl.main(["status", "jobs", "-A"]) == 2
    assert "across all namespaces" in capsys.readouterr().err


def test_unknown_output_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        kubectl.build_parser().parse_args(["status", "-o", "xml"])
    assert exited.value.code == 2


def test_describe_never_puts_a_forged_holder_into_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    """A status is written by others: ``holder: ../../secrets/x`` is shown, not requested."""
    forged = lease("a", "jobs", 41)
    forged["status"]["holder"] = "../../secrets/x"
    requested: list[str] = []

    class Kube(FakeKube):
        def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
            return forged if path == lease_path("a", "jobs") else {"items": []}

        def request(self, method: str, path: str, **kw: Any) -> Any:
            requested.append(path)
            from fencedlease.client.errors import RequestInfo
            from fencedlease.client.plans import Reply

            return Reply(RequestInfo(method, path), 200, {"items": []})

    args = kubectl.build_parser().parse_args(["describe", "jobs"])
    assert kubectl.cmd_describe(Kube(), "a", args) == 0  # type: ignore[arg-type]
    assert "not a Pod name" in capsys.readouterr().out
    assert not any("secrets" in p for p in requested), requested
