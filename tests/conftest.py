"""Shared fixtures: a real etcd and a real kube-apiserver started as local processes.

The control plane is session-scoped (one per pytest process); tests use unique names because
no controller-manager runs (namespaces never finish terminating, nothing is garbage collected).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A started local control plane with the CRDs applied."""
    state = tmp_path_factory.mktemp("cluster")
    with LocalCluster(state) as running:
        yield running


@pytest.fixture(scope="session")
def etcd_endpoint(cluster: LocalCluster) -> str:
    """The control plane's etcd, which also serves the lease store (own key prefix)."""
    return cluster.etcd_endpoint


@pytest.fixture
def namespace(cluster: LocalCluster) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    return name


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
