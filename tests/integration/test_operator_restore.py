"""Restore guard through the operator: an etcd whose revision is not above the tokens the
cluster already shows must not grant (docs/tokens.md, "Restore"), and says what to do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aetcd

from fencedlease.local.cluster import EtcdServer, LocalCluster
from fencedlease.store.connection import parse_endpoint

from .k8s import (
    apply,
    events,
    lease,
    lease_status,
    ready_pods,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)


async def _bump(endpoint: str, revisions: int) -> None:
    """Stand-in for ``etcdutl snapshot restore --bump-revision``: advance the revision."""
    host, port, _ = parse_endpoint(endpoint)
    client = aetcd.Client(host, port)
    await client.connect()
    try:
        for i in range(revisions):
            await client.put(b"/bump", str(i).encode())
    finally:
        await client.close()


def test_fresh_or_restored_etcd_refuses_to_reissue_old_tokens(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("guarded", namespace, duration=1))
    scoped = ("--role", "controller", "--namespace", namespace)

    original = EtcdServer(tmp_path / "etcd-a", tmp_path / "etcd-a.log")
    original.start()
    try:
        with running_operator(
            cluster, tmp_path, *scoped, name="before", etcd_endpoint=original.endpoint
        ):
            first = wait_held(cluster, "guarded", namespace)
            set_ready(cluster, first["holder"], namespace, False)
            second = wait_for(
                lambda: (
                    (s := lease_status(cluster, "guarded", namespace)).get("fencingToken", 0)
                    > first["fencingToken"]
                    and s
                ),
                timeout=20,
            )
    finally:
        original.stop()

    # "Restore" to an etcd that never saw those grants: its revision restarts near 1.
    restored = EtcdServer(tmp_path / "etcd-b", tmp_path / "etcd-b.log")
    restored.start()
    try:
        for pod in ("w-a", "w-b"):
            set_ready(cluster, pod, namespace, True)
        with running_operator(
            cluster, tmp_path, *scoped, name="after", etcd_endpoint=restored.endpoint
        ):
            refused = wait_for(
                lambda: (
                    (s := lease_status(cluster, "guarded", namespace)).get("phase") == "Unavailable"
                    and s
                ),
                timeout=20,
                what="the restore guard",
            )
            cond = {c["type"]: c for c in refused["conditions"]}["TokensMonotonic"]
            assert cond["status"] == "False" and cond["reason"] == "RestoreGuard"
            assert "--bump-revision" in cond["message"]
            assert refused["fencingToken"] == second["fencingToken"]  # nothing re-issued
            guard_events = events(cluster, namespace, "reason=RestoreGuard")
            assert guard_events, "a RestoreGuard Event tells the admin what to do"

            asyncio.run(_bump(restored.endpoint, second["fencingToken"] + 5))
            resumed = wait_held(cluster, "guarded", namespace, timeout=30)
            assert resumed["fencingToken"] > second["fencingToken"]
            cond = {c["type"]: c for c in resumed["conditions"]}["TokensMonotonic"]
            assert cond["status"] == "True"
    finally:
        restored.stop()
