"""The controller's Kubernetes writes are conditional on the version they were decided from,
through the real API server (the fault campaign's ``controller_pause`` found a paused replica
writing a FencedLease status from its outdated view over its successor's)."""

from __future__ import annotations

from kubernetes_asyncio import config

from fencedlease.controller.pods import PodInfo
from fencedlease.kube import KubeApi
from fencedlease.local.cluster import LocalCluster
from fencedlease.models import ANNOTATION_STATE

from .k8s import apply, create_pod, get, lease

STATE = f"{ANNOTATION_STATE}/test"  # PodInfo keeps only the operator's own annotations


async def test_a_lease_status_write_at_an_outdated_version_is_refused(
    cluster: LocalCluster, namespace: str
) -> None:
    apply(cluster, lease("report", namespace))
    seen = get(cluster, "fencedleases", "report", namespace)
    assert seen is not None
    decided_at = seen["metadata"]["resourceVersion"]
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kube = KubeApi(api)
    try:
        # The successor writes first (the paused replica's view is now outdated).
        newer = await kube.patch_lease_status(
            namespace, "report", {"phase": "Held", "holder": "b"}, decided_at
        )
        assert newer is not None and newer != decided_at
        # The resumed replica writes what it decided at the old version: refused.
        stale = await kube.patch_lease_status(
            namespace, "report", {"phase": "Held", "holder": "a"}, decided_at
        )
        assert stale is None
        shown = get(cluster, "fencedleases", "report", namespace)
        assert shown is not None and shown["status"]["holder"] == "b"
        # At the current version the write lands and reports the next version.
        assert (await kube.patch_lease_status(namespace, "report", {"holder": "c"}, newer)) not in (
            None,
            newer,
        )
        # Finalizers and annotations report the version they made, for the status write next.
        current = (get(cluster, "fencedleases", "report", namespace) or {})["metadata"]
        after = await kube.set_lease_finalizers(
            namespace, "report", current["resourceVersion"], ["example.com/keep"]
        )
        assert after is not None
        assert await kube.set_lease_finalizers(namespace, "report", decided_at, []) is None
        annotated = await kube.patch_lease_annotations(namespace, "report", {"a": "1"})
        assert annotated is not None and annotated != after
        assert await kube.patch_lease_status(namespace, "report", {"holder": "d"}, annotated)
    finally:
        await kube.set_lease_finalizers(
            namespace,
            "report",
            (get(cluster, "fencedleases", "report", namespace) or {})["metadata"][
                "resourceVersion"
            ],
            [],
        )
        await api.close()


async def test_a_pod_annotation_at_an_outdated_version_is_refused(
    cluster: LocalCluster, namespace: str
) -> None:
    create_pod(cluster, "w-1", namespace)
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kube = KubeApi(api)
    try:
        body = await kube.read_pod(namespace, "w-1")
        assert body is not None
        seen = PodInfo.from_body(body)
        assert seen.resource_version and seen.uid
        # The successor marks the Pod (the paused replica's view is now outdated).
        assert await kube.patch_pod_annotations(namespace, "w-1", {STATE: "lost"}, "")
        # The resumed replica's write at the version it decided from: refused.
        assert not await kube.patch_pod_annotations(
            namespace, "w-1", {STATE: "held"}, seen.resource_version
        )
        body = await kube.read_pod(namespace, "w-1")
        assert body is not None
        now = PodInfo.from_body(body)
        assert now.annotations[STATE] == "lost"
        assert now.resource_version != seen.resource_version
        # At the current version it lands.
        written = await kube.patch_pod_annotations(
            namespace, "w-1", {STATE: "held"}, now.resource_version
        )
        assert written is not None and written != now.resource_version
        assert await kube.patch_pod_annotations(namespace, "w-1", {STATE: "x"}, written)
        assert not await kube.patch_pod_annotations(namespace, "gone", {STATE: "x"}, "")
        assert await kube.read_pod(namespace, "gone") is None
    finally:
        await api.close()
