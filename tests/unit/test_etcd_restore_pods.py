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
