"""Deprecated name of :mod:`fencedlease.client.api` (renamed: the operator has its own ``kube.py``).

Kept only so that code importing ``fencedlease.client.kube`` (examples/report-writer) keeps
working; import from :mod:`fencedlease.client.api`, or the names :mod:`fencedlease.client`
exports, instead.
"""

from fencedlease.client.api import (
    AsyncKubeClient,
    KubeClient,
    KubeConfig,
    Reply,
    artifact_path,
    events_path,
    lease_path,
    pod_path,
)

__all__ = [
    "AsyncKubeClient",
    "KubeClient",
    "KubeConfig",
    "Reply",
    "artifact_path",
    "events_path",
    "lease_path",
    "pod_path",
]
