"""The API grant sources are plans (fencedlease.client.sources): which objects they read, and
that a sync and an asyncio client read the same grant, with the errors ``KubeClient.get``
raises (a transport failure stays a TransportError, an error status an ApiError)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencedlease.client import ApiError, LeaseStatusGrant, PodGrant, TransportError
from fencedlease.client.errors import RequestInfo
from fencedlease.client.plans import Reply, Request

UNTIL = "2099-01-01T00:00:00Z"
ANNOTATIONS = {
    "token.fencedlease.io/l": "5",
    "lease-id.fencedlease.io/l": "x",
    "valid-until.fencedlease.io/l": UNTIL,
    "state.fencedlease.io/l": "held",
}
POD = {"metadata": {"annotations": ANNOTATIONS}}
LEASE = {"status": {"phase": "Held", "holder": "w-a", "fencingToken": 5, "leaseId": "x"}}
OBJECTS = {
    "/api/v1/namespaces/ns/pods/w-a": POD,
    "/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedleases/l": LEASE,
}


class Kube:
    """Answers GETs from :data:`OBJECTS` (404 otherwise); ``fail`` raises instead."""

    namespace = "ns"

    def __init__(self, fail: Exception | None = None) -> None:
        self.paths: list[str] = []
        self.fail = fail

    def answer(self, method: str, path: str, options: dict[str, Any]) -> Reply:
        assert method == "GET" and options.get("body") is None, (method, options)
        self.paths.append(path)
        if self.fail is not None:
            raise self.fail
        info = RequestInfo(method, f"https://api{path}")
        if path in OBJECTS:
            return Reply(info, 200, OBJECTS[path])
        return Reply(info, 404, {"kind": "Status", "reason": "NotFound", "message": "gone"})

    def request(self, method: str, path: str, **options: Any) -> Reply:
        return self.answer(method, path, options)


class AsyncKube(Kube):
    async def request(self, method: str, path: str, **options: Any) -> Reply:  # type: ignore[override]
        return self.answer(method, path, options)


def test_a_pod_grant_reads_the_pod_sync_and_async_alike() -> None:
    kube, akube = Kube(), AsyncKube()
    grant = PodGrant("l", pod="w-a", namespace="ns", client=kube).read()
    agrant = asyncio.run(PodGrant("l", pod="w-a", namespace="ns", async_client=akube).aread())
    assert grant is not None and grant.token == 5 and grant.held
    assert agrant == grant
    assert kube.paths == akube.paths == ["/api/v1/namespaces/ns/pods/w-a"]


def test_a_lease_status_grant_reads_the_pod_only_for_a_deadline() -> None:
    source = LeaseStatusGrant("l", pod="w-a", namespace="ns")
    steps = source.plan()
    first = next(steps)
    assert first == Request("GET", "/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedleases/l")
    kube = Kube()
    grant = LeaseStatusGrant("l", pod="w-a", namespace="ns", client=kube).read()
    assert grant is not None and grant.token == 5 and grant.valid_until.year == 2099
    assert kube.paths == [first.path, "/api/v1/namespaces/ns/pods/w-a"]


def test_a_failed_read_raises_what_the_client_get_raises() -> None:
    info = RequestInfo("GET", "https://api/api/v1/namespaces/ns/pods/w-a")
    down = Kube(fail=TransportError("cannot connect to the API server: refused", request=info))
    with pytest.raises(TransportError, match="cannot connect to the API server: refused"):
        PodGrant("l", pod="w-a", namespace="ns", client=down).read()
    with pytest.raises(ApiError) as missing:
        PodGrant("l", pod="w-b", namespace="ns", client=Kube()).read()
    assert missing.value.status_code == 404
