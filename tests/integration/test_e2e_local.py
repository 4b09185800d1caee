"""The e2e scenario of e2e/scenarios.py against the local control plane (no kubelet).

Same code as the kind e2e (`e2e/kind.sh`): a holder with token t1 publishes, the holder dies,
a new holder gets t2 > t1, and a publish with t1 is refused with ``stale_fence``. Here the
candidate Pods are API objects whose readiness the scenario sets, and the scenario publishes on
the holder's behalf.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from e2e.scenarios import Kube, run

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster

from .k8s import running_fence

pytestmark = [pytest.mark.timeout(300)]


def test_handover_and_stale_publish_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    kube = Kube(cluster.kubeconfig, namespace, str(binary_path("kubectl")))
    with running_fence(cluster, tmp_path, namespace):
        outcome = run(kube, no_kubelet=True, timeout=60, duration=3)
    assert outcome["t2"] > outcome["t1"]
    assert outcome["holder2"] != outcome["holder1"]
