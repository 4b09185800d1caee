"""The holder-side stamp (client/fenced.py) and fenced leadership (client/leadership.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import httpx
import pytest

from fencedlease.client.api import KubeConfig
from fencedlease.client.errors import GrantAbsent, GrantLost, UnfencedRequest
from fencedlease.client.fenced import (
    AsyncFencedKubeClient,
    FencedKubeClient,
    Target,
    delete_plan,
    fence_denial,
    stamp,
    target,
)
from fencedlease.client.grant import Grant
from fencedlease.client.leadership import FencedLeadership


def grant(token: int = 42, state: str = "held", seconds: float = 30) -> Grant:
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return Grant(token=token, lease_id="g1", valid_until=until, state=state, lease="ctl")


def test_stamp_sets_the_annotation_without_touching_the_input() -> None:
    body: dict[str, Any] = {"metadata": {"name": "x", "annotations": {"a": "b"}}, "data": {}}
    out = stamp(body, 42, operation_id="op-1")
    assert out["metadata"]["annotations"] == {
        "a": "b",
        "fencedlease.io/token": "42",
        "fencedlease.io/operation-id": "op-1",
    }
    assert "fencedlease.io/token" not in body["metadata"]["annotations"]
    assert stamp(None, 7) == {"metadata": {"annotations": {"fencedlease.io/token": "7"}}}


def test_stamp_of_a_json_patch_adds_an_operation() -> None:
    ops = [{"op": "replace", "path": "/data/k", "value": "v"}]
    out = stamp(ops, 42, "application/json-patch+json")
    assert out[-1] == {
        "op": "add",
        "path": "/metadata/annotations/fencedlease.io~1token",
        "value": "42",
    }
    assert len(ops) == 1


def test_a_delete_writes_the_token_then_deletes_that_version() -> None:
    plan = delete_plan(42, {"propagationPolicy": "Foreground"})
    assert plan.patch == {"metadata": {"annotations": {"fencedlease.io/token": "42"}}}
    options = plan.options_after({"metadata": {"resourceVersion": "17"}})
    assert options["preconditions"] == {"resourceVersion": "17"}
    assert options["propagationPolicy"] == "Foreground"


def test_fence_denials_are_read_from_api_errors() -> None:
    body = {
        "message": 'admission webhook "a.objects.fencedlease.io" denied the request: '
        "stale_fence: token 3 is below the high-water mark 5 of lease ns/ctl"
    }
    assert fence_denial(403, json.dumps(body)) == "stale_fence"
    assert fence_denial(409, body) is None
    assert fence_denial(403, {"message": "configmaps is forbidden: User cannot"}) is None


def _client(source: Any, seen: list[httpx.Request]) -> FencedKubeClient:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}})

    config = KubeConfig(server="https://kube.invalid", namespace="ns", token="t")
    client = FencedKubeClient(source, config)
    client._http = httpx.Client(base_url=config.server, transport=httpx.MockTransport(handler))
    return client


def test_the_sdk_client_stamps_every_write_and_fences_deletes() -> None:
    seen: list[httpx.Request] = []
    client = _client(lambda: grant(42), seen)
    path = "/api/v1/namespaces/ns/configmaps/cfg"
    client.get(path)
    client.request("PUT", path, body={"metadata": {"name": "cfg"}, "data": {}})
    client.request("DELETE", path)
    methods = [r.method for r in seen]
    assert methods == ["GET", "PUT", "PATCH", "DELETE"]
    assert json.loads(seen[1].content)["metadata"]["annotations"]["fencedlease.io/token"] == "42"
    assert json.loads(seen[3].content)["preconditions"] == {"resourceVersion": "9"}


async def test_the_async_sdk_client_sends_the_same_requests() -> None:
    """Both SDK clients drive one plan (``write_plan``): the same requests, a refused patch
    ends a delete before its DELETE."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "PATCH" and "denied" in request.url.path:
            return httpx.Response(403, json={"message": "denied the request: stale_fence: x"})
        return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}})

    config = KubeConfig(server="https://kube.invalid", namespace="ns", token="t")
    client = AsyncFencedKubeClient(lambda: grant(42), config)
    client._http = httpx.AsyncClient(base_url=config.server, transport=httpx.MockTransport(handler))
    path = "/api/v1/namespaces/ns/configmaps/cfg"
    await client.get(path)
    await client.request("PUT", path, body={"metadata": {"name": "cfg"}, "data": {}})
    await client.request("DELETE", path)
    refused = await client.request("DELETE", "/api/v1/namespaces/ns/configmaps/denied")
    await client.aclose()
    assert [r.method for r in seen] == ["GET", "PUT", "PATCH", "DELETE", "PATCH"]
    assert json.loads(seen[1].content)["metadata"]["annotations"]["fencedlease.io/token"] == "42"
    assert json.loads(seen[3].content)["preconditions"] == {"resourceVersion": "9"}
    assert refused.status_code == 403


def test_no_held_grant_sends_nothing() -> None:
    seen: list[httpx.Request] = []
    lost = _client(lambda: grant(state="lost"), seen)
    with pytest.raises(GrantLost):
        lost.request("PATCH", "/api/v1/namespaces/ns/configmaps/cfg", body={})

    class Empty:
        lease = "ctl"

        def describe(self) -> str:
            return "empty"

        def read(self) -> Grant | None:
            return None

    with pytest.raises(GrantAbsent):
        _client(Empty(), seen).request("POST", "/api/v1/namespaces/ns/configmaps", body={})
    assert seen == []


class Source:
    """A grant source whose grants the test hands over one by one."""

    lease = "ctl"

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Grant | None] = asyncio.Queue()

    def describe(self) -> str:
        return "test"

    def read(self) -> Grant | None:
        raise NotImplementedError

    async def aread(self) -> Grant | None:
        raise NotImplementedError

    def watch(self, stop: Any = None) -> Any:
        raise NotImplementedError

    async def awatch(self, stop: asyncio.Event | None = None) -> Any:
        while True:
            yield await self.queue.get()


async def test_leadership_follows_the_grant_and_stops_on_a_fence_denial() -> None:
    source = Source()
    leadership = FencedLeadership(source)
    task = asyncio.create_task(leadership.run())
    try:
        assert not leadership.when()
        await source.queue.put(grant(5))
        await asyncio.wait_for(leadership.wait_leading(), 5)  # 3.9: no asyncio.timeout
        assert leadership.when() and leadership.token() == 5
        await source.queue.put(grant(5, state="lost"))

        async def not_leading() -> None:
            while leadership.leading():
                leadership.changed.clear()
                await leadership.changed.wait()

        await asyncio.wait_for(not_leading(), 5)
        with pytest.raises(GrantLost):
            leadership.token()
        await source.queue.put(grant(9))
        await asyncio.wait_for(leadership.wait_leading(), 5)
        denial = {"message": "admission webhook denied the request: stale_fence: token 9 ..."}
        assert leadership.refused(403, denial) == "stale_fence"
        assert leadership.stopped.is_set() and not leadership.leading()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Data:
    data = b'{"metadata": {"resourceVersion": "9"}}'


def _recorder(calls: list[tuple[Any, ...]]) -> Any:
    def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> _Data:
        calls.append((method, url, args, kwargs))
        return _Data()

    return request


def _check_api_calls(calls: list[tuple[Any, ...]]) -> None:
    path = "/api/v1/namespaces/ns/configmaps/cfg"
    assert [(method, url) for method, url, _, _ in calls] == [
        ("GET", path),
        ("PUT", path),
        ("PATCH", path),
        ("DELETE", path),
    ]
    assert calls[0][2] == ({"q": "1"},)  # a read is passed on as it is
    assert calls[1][3]["body"]["metadata"]["annotations"]["fencedlease.io/token"] == "42"
    assert calls[2][3]["headers"]["Content-Type"] == "application/merge-patch+json"
    assert calls[2][3]["_request_timeout"] == 5
    assert calls[3][3]["body"]["preconditions"] == {"resourceVersion": "9"}


def test_the_kubernetes_api_client_stamps_writes_and_fences_deletes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client as k8s

    from fencedlease.client.fenced import fenced_api_client

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(k8s.ApiClient, "request", _recorder(calls))
    api = fenced_api_client(lambda: grant(42))
    path = "/api/v1/namespaces/ns/configmaps/cfg"
    api.request("GET", path, {"q": "1"})
    api.request("PUT", path, body={"metadata": {"name": "cfg"}}, headers={})
    api.request("DELETE", path, headers={}, _request_timeout=5)
    _check_api_calls(calls)


async def test_the_kubernetes_asyncio_api_client_sends_the_same_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    k8s = pytest.importorskip("kubernetes_asyncio.client")  # not a client dependency

    from fencedlease.client.fenced import fenced_async_api_client

    calls: list[tuple[Any, ...]] = []
    record = _recorder(calls)

    async def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> _Data:
        return record(self, method, url, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(k8s.ApiClient, "request", request)
    api = fenced_async_api_client(lambda: grant(42))
    path = "/api/v1/namespaces/ns/configmaps/cfg"
    await api.request("GET", path, {"q": "1"})
    await api.request("PUT", path, body={"metadata": {"name": "cfg"}}, headers={})
    await api.request("DELETE", path, headers={}, _request_timeout=5)
    await api.close()
    _check_api_calls(calls)


# ---------------------------------------- issue 43: subresources and collection deletes


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/api/v1/namespaces/ns/configmaps", Target(collection=True)),
        ("/api/v1/namespaces/ns/configmaps?labelSelector=a%3Db", Target(collection=True)),
        ("/apis/apps/v1/deployments", Target(collection=True)),
        ("https://kube:6443/apis/apps/v1/namespaces/ns/deployments", Target(collection=True)),
        ("/api/v1/namespaces/ns/configmaps/cfg", Target(collection=False)),
        ("/apis/apps/v1/namespaces/ns/deployments/web/status", Target(False, "status")),
        ("https://kube/apis/apps/v1/namespaces/ns/deployments/web/scale", Target(False, "scale")),
        ("/apis/example.com/v1/namespaces/ns/widgets/w/scale", Target(False, "scale")),
        ("/api/v1/namespaces", Target(collection=True)),
        ("/api/v1/namespaces/ns", Target(collection=False)),
        ("/api/v1/namespaces/ns/status", Target(False, "status")),
        ("/api/v1/nodes/n1", Target(collection=False)),
        ("/version", None),
        ("/apis/apps/v1", None),
    ],
)
def test_what_a_path_addresses(url: str, expected: Target | None) -> None:
    assert target(url) == expected


STATUS = "/apis/apps/v1/namespaces/ns/deployments/web/status"
SCALE = "/apis/apps/v1/namespaces/ns/deployments/web/scale"
COLLECTION = "/api/v1/namespaces/ns/configmaps"


def test_the_sdk_client_sends_status_and_scale_writes_unchanged() -> None:
    """docs/client.md: the webhook decides a status or scale write by who writes, so the
    holder's write goes as it is (a JSON patch adding an annotation to a Scale would fail);
    still only while the grant is held."""
    seen: list[httpx.Request] = []
    client = _client(lambda: grant(42), seen)
    status = {"status": {"observedGeneration": 3}}
    client.request("PATCH", STATUS, body=status, content_type="application/merge-patch+json")
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 3}]
    client.request("PATCH", SCALE, body=ops, content_type="application/json-patch+json")
    client.request("PUT", SCALE, body={"spec": {"replicas": 2}})
    assert [json.loads(r.content) for r in seen] == [status, ops, {"spec": {"replicas": 2}}]
    with pytest.raises(GrantLost):
        _client(lambda: grant(state="lost"), seen).request("PATCH", STATUS, body=status)
    assert len(seen) == 3


def test_a_collection_delete_is_refused_before_anything_is_sent() -> None:
    seen: list[httpx.Request] = []
    client = _client(lambda: grant(42), seen)
    with pytest.raises(UnfencedRequest) as refused:
        client.request("DELETE", COLLECTION, params={"labelSelector": "app=web"})
    assert "Delete each object" in str(refused.value)
    assert refused.value.request.method == "DELETE"
    assert seen == []
    # one object, and a namespace (an object of its own), are fenced deletes
    client.request("DELETE", f"{COLLECTION}/cfg")
    client.request("DELETE", "/api/v1/namespaces/ns")
    assert [r.method for r in seen] == ["PATCH", "DELETE", "PATCH", "DELETE"]


async def test_the_async_sdk_client_refuses_collection_deletes_too() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"metadata": {"resourceVersion": "9"}})

    config = KubeConfig(server="https://kube.invalid", namespace="ns", token="t")
    client = AsyncFencedKubeClient(lambda: grant(42), config)
    client._http = httpx.AsyncClient(base_url=config.server, transport=httpx.MockTransport(handler))
    with pytest.raises(UnfencedRequest):
        await client.request("DELETE", COLLECTION)
    await client.request("PATCH", STATUS, body={"status": {}})
    await client.aclose()
    assert [(r.method, json.loads(r.content)) for r in seen] == [("PATCH", {"status": {}})]


def test_the_kubernetes_api_client_on_status_scale_and_collections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubernetes import client as k8s

    from fencedlease.client.fenced import fenced_api_client

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(k8s.ApiClient, "request", _recorder(calls))
    api = fenced_api_client(lambda: grant(42))
    host = "https://kube:6443"
    api.request("PATCH", host + STATUS, body={"status": {}}, headers={})
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 3}]
    json_patch = {"Content-Type": "application/json-patch+json"}
    api.request("PATCH", host + SCALE, body=ops, headers=json_patch)
    assert [c[3]["body"] for c in calls] == [{"status": {}}, ops]
    with pytest.raises(UnfencedRequest):
        api.request("DELETE", host + COLLECTION, query_params=[("labelSelector", "a=b")])
    assert len(calls) == 2


async def test_kopf_leadership_clients_write_status_and_refuse_collection_deletes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``FencedLeadership.api_client()`` (Kopf) is the kubernetes_asyncio client above, on
    the leadership's current grant."""
    k8s = pytest.importorskip("kubernetes_asyncio.client")
    calls: list[tuple[Any, ...]] = []
    record = _recorder(calls)

    async def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> _Data:
        return record(self, method, url, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(k8s.ApiClient, "request", request)
    source = Source()
    leadership = FencedLeadership(source)
    task = asyncio.create_task(leadership.run())
    try:
        await source.queue.put(grant(7))
        await asyncio.wait_for(leadership.wait_leading(), 5)
        api = leadership.api_client()
        await api.request("PATCH", STATUS, body={"status": {"ready": True}}, headers={})
        with pytest.raises(UnfencedRequest):
            await api.request("DELETE", COLLECTION, headers={})
        await api.request("PATCH", f"{COLLECTION}/cfg", body={"data": {}}, headers={})
        await api.close()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert calls[0][3]["body"] == {"status": {"ready": True}}
    assert calls[1][3]["body"]["metadata"]["annotations"]["fencedlease.io/token"] == "7"
    assert len(calls) == 2
