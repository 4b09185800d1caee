"""Issue 36, as a new user tried it on ``make run``: an artifact written with the holder's
token, ``kubectl fencedlease force-release``, the next grant to another Pod, and a write with
the older token to a resource the new token never reached: refused at once (docs/tokens.md,
"Superseded generations").  The real operator (controller and webhook), the real API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster

from .fence_harness import artifact
from .k8s import apply, lease, ready_pods, running_fence, wait_held
from .test_client_operator import plugin

pytestmark = pytest.mark.timeout(180)


def _artifact(name: str, namespace: str, lease_name: str, token: int) -> str:
    return json.dumps(artifact(namespace, name, lease_name, token, f"{name}-{token}.tmp"))


def test_a_force_released_token_is_stale_once_the_next_grant_commits(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("report", namespace, duration=30))
    # The session's admin writes for the holders (a Pod-bound identity is tested elsewhere).
    with running_fence(cluster, tmp_path, namespace, env={"FENCEDLEASE_ALLOWED_WRITERS": "admin"}):
        first = wait_held(cluster, "report", namespace)
        t1 = int(first["fencingToken"])
        created = cluster.kubectl(
            "create", "-f", "-", input=_artifact("cat", namespace, "report", t1), check=False
        )
        assert created.returncode == 0, created.stderr

        out = plugin(cluster, "force-release", "report", "-n", namespace, "--wait", "60")
        assert out.returncode == 0, out.stderr
        second = wait_held(cluster, "report", namespace, other_than=first["leaseId"])
        t2 = int(second["fencingToken"])
        assert t2 > t1

        late = cluster.kubectl(
            "create", "-f", "-", input=_artifact("other", namespace, "report", t1), check=False
        )
        assert late.returncode != 0, late.stdout
        assert f"stale_fence: token {t1} was superseded by the newer grant {t2}" in late.stderr
        fresh = cluster.kubectl(
            "create", "-f", "-", input=_artifact("other", namespace, "report", t2), check=False
        )
        assert fresh.returncode == 0, fresh.stderr
