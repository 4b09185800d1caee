"""The in-cluster restore's manifests refuse what is not the chart's etcd or not a cluster size
(the manifests themselves are checked against the chart and the API server in
tests/integration/test_chart_day2.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fencedlease.etcdbackup import pods

STS: dict[str, Any] = {
    "metadata": {"name": "fl-etcd", "namespace": "ns"},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/instance": "fl"}},
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["RWO"]}}],
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "etcd",
                        "image": "etcd:1",
                        "args": [
                            "--data-dir=/var/lib/etcd/data",
                            "--initial-cluster=fl-etcd-0=https://a,fl-etcd-1=https://b,fl-etcd-2=https://c",
                            "--initial-cluster-token=fl-ns",
                            "--initial-advertise-peer-urls=https://$(POD_NAME).h:2380",
                        ],
                        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
                    }
                ]
            }
        },
    },
}
VOLUME = {"persistentVolumeClaim": {"claimName": "b"}}


def test_a_statefulset_without_the_charts_flags_is_refused() -> None:
    broken = copy.deepcopy(STS)
    broken["spec"]["template"]["spec"]["containers"][0]["args"].pop(2)
    with pytest.raises(pods.ManifestError, match="--initial-cluster-token"):
        pods.read_statefulset(broken, "helper:1")
    other = copy.deepcopy(STS)
    other["spec"]["template"]["spec"]["containers"][0]["name"] = "db"
    with pytest.raises(pods.ManifestError, match="no container named etcd"):
        pods.read_statefulset(other, "helper:1")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"members": 4}, "1, 3, 5 or 7"),
        ({"only": 3}, "between 0 and 2"),
        ({"snapshot": "../x.db"}, "file name"),
        ({"stamp": "a b"}, "alphanumeric"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict[str, Any], message: str) -> None:
    etcd = pods.read_statefulset(STS, "helper:1")
    args: dict[str, Any] = {"snapshot": "s.db", "stamp": "t1", **kwargs}
    with pytest.raises(ValueError, match=message):
        pods.restore_manifests(etcd, args.pop("snapshot"), VOLUME, 10, args.pop("stamp"), **args)


def test_one_pod_per_member_with_the_same_bump() -> None:
    etcd = pods.read_statefulset(STS, "helper:1")
    docs = pods.restore_manifests(etcd, "s.db", VOLUME, 77, "t1")
    assert [d["metadata"]["name"] for d in docs] == [f"fl-etcd-{i}-restore-t1" for i in range(3)]
    for doc in docs:
        assert "--bump-revision=77" in doc["spec"]["containers"][0]["args"]
        assert doc["metadata"]["labels"] == {"app.kubernetes.io/instance": "fl", pods.LABEL: "t1"}


def test_claims_lost_with_etcd_are_found_and_created_like_the_template() -> None:
    etcd = pods.read_statefulset(STS, "helper:1")
    found = {"data-fl-etcd-0": False, "data-fl-etcd-2": True, "fl-etcd-backup": False}
    assert pods.lost_claims(etcd, found) == (["data-fl-etcd-1"], ["data-fl-etcd-2"])
    assert pods.lost_claims(etcd, found, only=0) == ([], [])
    assert pods.lost_claims(etcd, {}, members=1) == (["data-fl-etcd-0"], [])
    docs = pods.restore_manifests(etcd, "s.db", VOLUME, 77, "t1", create_claims=["data-fl-etcd-1"])
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds == [
        ("Pod", "fl-etcd-0-restore-t1"),
        ("PersistentVolumeClaim", "data-fl-etcd-1"),  # before the Pod that mounts it
        ("Pod", "fl-etcd-1-restore-t1"),
        ("Pod", "fl-etcd-2-restore-t1"),
    ]
    claim = docs[1]
    assert claim["spec"] == STS["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["metadata"]["namespace"] == "ns"
    assert claim["metadata"]["labels"]["app.kubernetes.io/component"] == "etcd"
    # --member: only that member's claim, if it is lost.
    only = pods.restore_manifests(
        etcd, "s.db", VOLUME, 77, "t1", only=2, create_claims=["data-fl-etcd-1"]
    )
    assert [d["kind"] for d in only] == ["Pod"]
