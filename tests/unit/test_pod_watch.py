"""The Pod watch: scoped server side by ``pod_selector`` (Kopf's ``labelSelector`` on the list
and every watch request), resumed from the last version seen, re-listed after ``410 Gone`` with
the Pods missed meanwhile dropped from the cache; the lean Pod cache; the shared decision.

Kopf's own watch loop runs here against a scripted fake API (no sleeps, no network)."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest
from kopf._cogs.clients import api, fetching, watching
from kopf._cogs.structs.bodies import RawEvent
from kopf._cogs.structs.references import Resource
from pydantic import ValidationError

from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller import handlers
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.health import WatchActivity
from fencedlease.settings import Settings, label_selector_problem

SELECTOR = "fencedlease.io/candidate=true"
PODS = Resource("", "v1", "pods", namespaced=True)
LEASES = Resource("fencedlease.io", "v1alpha1", "fencedleases", namespaced=True)


def pod_body(name: str, version: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "resourceVersion": version,
            "labels": {"app": "w", "fencedlease.io/candidate": "true"}
            if labels is None
            else labels,
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def lease_object(name: str, app: str = "w", holder: str | None = None) -> LeaseObject:
    return LeaseObject.from_body(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "generation": 1},
            "spec": {
                "leaseDurationSeconds": 10,
                "fencingPolicy": "AllowEqual",
                "holderSelector": {"matchLabels": {"app": app}},
            },
            "status": {"holder": holder} if holder else {},
        }
    )


class Pokes:
    def __init__(self) -> None:
        self.keys: list[LeaseKey] = []

    def poke(self, key: LeaseKey) -> None:
        self.keys.append(key)


def controller(*leases: LeaseObject) -> Any:
    """What the handlers use of the controller: the two caches and the lease scheduler."""
    cache = LeaseCache(TokenProofs(b"k" * 32))
    for lease in leases:
        cache.upsert(lease)
    return SimpleNamespace(pods=PodCache(), leases=cache, scheduler=Pokes())


# --------------------------------------------------------------------------- settings


def test_the_selector_is_scoped_to_pods_only() -> None:
    assert handlers.kopf_settings().watching.label_selectors.collect(PODS) == []
    ks = handlers.kopf_settings(SELECTOR)
    assert ks.watching.label_selectors.collect(PODS) == [SELECTOR]
    assert ks.watching.label_selectors.collect(LEASES) == []


def test_pod_selector_from_env_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEDLEASE_POD_SELECTOR", SELECTOR)
    assert Settings.from_env().pod_selector == SELECTOR
    monkeypatch.setenv("FENCEDLEASE_POD_SELECTOR", "")
    assert Settings.from_env().pod_selector is None
    with pytest.raises(ValidationError, match="not a label requirement"):
        Settings(pod_selector="app=w,")
    assert os.environ.get("FENCEDLEASE_POD_SELECTOR") == ""


@pytest.mark.parametrize(
    "selector",
    [SELECTOR, "a=b,c!=d,e in (f, g),h,!i", "tier notin (x),j==k", "example.com/a"],
)
def test_valid_label_selectors(selector: str) -> None:
    assert label_selector_problem(selector) is None


@pytest.mark.parametrize("selector", ["a=b,", "=b", "a in b", "a in (b", "a b", "a=b c"])
def test_invalid_label_selectors(selector: str) -> None:
    assert label_selector_problem(selector)


# --------------------------------------------------------------------------- lean cache


def test_the_cache_keeps_only_our_annotations() -> None:
    body = pod_body("a", "1")
    body["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "x" * 10_000,
        "token.fencedlease.io/jobs": "7",
        "state.fencedlease.io/jobs": "held",
        "lease-id.fencedlease.io/jobs": "id",
        "valid-until.fencedlease.io/jobs": "2026-01-01T00:00:00Z",
        "fencedlease.io/other": "not ours to read",
    }
    assert PodInfo.from_body(body).annotations == {
        "token.fencedlease.io/jobs": "7",
        "state.fencedlease.io/jobs": "held",
        "lease-id.fencedlease.io/jobs": "id",
        "valid-until.fencedlease.io/jobs": "2026-01-01T00:00:00Z",
    }


# --------------------------------------------------------------------------- the decision


def test_leases_moved_by_a_pod() -> None:
    mine, other, held = (
        lease_object("mine"),
        lease_object("other", app="x"),
        lease_object("held", app="x", holder="a"),
    )
    a = PodInfo.from_body(pod_body("a", "1"))
    assert handlers.leases_moved([mine, other, held], None, a, deleted=False) == [
        mine.key,
        held.key,
    ]
    # Only our annotations or the version changed: nothing moves.
    again = PodInfo.from_body(pod_body("a", "2"))
    assert handlers.leases_moved([mine, other, held], a, again, deleted=False) == []
    # Deleted (or out of scope): the same leases are poked even if nothing else changed.
    assert handlers.leases_moved([mine, other], a, again, deleted=True) == [mine.key]
    # Relabelled away from a selector: the lease it matched before is poked.
    moved = PodInfo.from_body(pod_body("a", "3", labels={"app": "x"}))
    assert handlers.leases_moved([mine], a, moved, deleted=False) == [mine.key]


# --------------------------------------------------------------------------- Kopf's loop


class FakeApi:
    """Scripted list responses and watch streams; records every URL asked for."""

    def __init__(self, lists: list[dict[str, Any]], streams: list[list[dict[str, Any]]]):
        self.lists, self.streams = iter(lists), iter(streams)
        self.urls: list[tuple[str, dict[str, str]]] = []

    def _record(self, kind: str, url: str) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        self.urls.append((kind, query))

    async def get(self, url: str, **_: Any) -> dict[str, Any]:
        self._record("list", url)
        return next(self.lists)

    async def stream(self, url: str, **_: Any) -> AsyncIterator[dict[str, Any]]:
        self._record("watch", url)
        for event in next(self.streams):
            if isinstance(event, Exception):
                raise event
            yield event


@pytest.fixture
def kopf_wrappers() -> Iterator[None]:
    """observe_watches / observe_pod_lists patch Kopf's module functions: undo it."""
    saved = watching.watch_objs, fetching.fetch_objs
    yield
    watching.watch_objs, fetching.fetch_objs = saved


def pod_list(version: str, *names: str) -> dict[str, Any]:
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": version, "continue": ""},
        "items": [pod_body(n, version) for n in names],
    }


async def run_kopf_watch(
    rt: Any, fake: FakeApi, monkeypatch: pytest.MonkeyPatch, until: str
) -> None:
    """Kopf's infinite watch with our settings and wrappers; events go to ``apply_pod`` as
    Kopf's handler would take them, until the Pod ``until`` is seen."""
    monkeypatch.setattr(api, "get", fake.get)
    monkeypatch.setattr(api, "stream", fake.stream)
    settings = handlers.kopf_settings(SELECTOR)
    settings.watching.reconnect_backoff = 0
    handlers.observe_watches(rt.watches, lambda: 1.0)
    handlers.observe_pod_lists(lambda ns, listed: handlers.pods_listed(rt, ns, listed))
    stream = cast(
        "AsyncGenerator[watching.Bookmark | RawEvent, None]",
        watching.infinite_watch(settings=settings, resource=PODS, namespace=None),
    )
    try:
        async for event in stream:
            if not isinstance(event, dict) or event["type"] == "BOOKMARK":
                continue  # Kopf's Bookmark.LISTED and the API's bookmarks never reach handlers
            body = event["object"]
            handlers.apply_pod(rt, PodInfo.from_body(body), deleted=event["type"] == "DELETED")
            if body["metadata"]["name"] == until:
                break
    finally:
        await stream.aclose()


async def test_resume_then_relist_after_gone_drops_what_was_missed(
    monkeypatch: pytest.MonkeyPatch, kopf_wrappers: None
) -> None:
    rt = controller(lease_object("jobs"))
    rt.watches = WatchActivity(330)
    gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "status": "Failure"}}
    fake = FakeApi(
        lists=[pod_list("10", "a", "b"), pod_list("20", "a", "c")],
        streams=[
            # Watch 1 from the list: c arrives, a bookmark moves the version, the server ends it.
            [
                {"type": "ADDED", "object": pod_body("c", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ],
            # Watch 2 resumes from the bookmark; the version has expired: 410 → relist.
            [gone],
            # Watch 3 from the relist. (b vanished while no watch was open.)
            [{"type": "ADDED", "object": pod_body("d", "21")}],
        ],
    )
    await run_kopf_watch(rt, fake, monkeypatch, until="d")

    selectors = {query.get("labelSelector") for _, query in fake.urls}
    assert selectors == {SELECTOR}, fake.urls  # every list and watch request is scoped
    calls = [(kind, query.get("resourceVersion")) for kind, query in fake.urls]
    assert calls == [
        ("list", None),
        ("watch", "10"),  # from the list's version
        ("watch", "12"),  # resumed from the bookmark, no relist
        ("list", None),  # 410 Gone: relist
        ("watch", "20"),
    ]
    assert sorted(p.name for p in rt.pods.in_namespace("ns")) == ["a", "c", "d"]
    assert LeaseKey("ns", "jobs") in rt.scheduler.keys
    assert rt.watches.last == {"pods": 1.0}  # the liveness observation still sees the loop


async def test_a_relist_of_a_gone_holder_pokes_its_lease() -> None:
    rt = controller(lease_object("held", app="x", holder="b"))
    for name in ("a", "b"):
        rt.pods.upsert(PodInfo.from_body(pod_body(name, "1")))
    rt.scheduler.keys.clear()
    handlers.pods_listed(rt, None, {("ns", "a")})
    assert [p.name for p in rt.pods.in_namespace("ns")] == ["a"]
    assert rt.scheduler.keys == [LeaseKey("ns", "held")]
    handlers.pods_listed(rt, "elsewhere", set())  # another namespace's list leaves ns alone
    assert [p.name for p in rt.pods.in_namespace("ns")] == ["a"]


async def test_a_list_that_fails_part_way_drops_nothing(
    monkeypatch: pytest.MonkeyPatch, kopf_wrappers: None
) -> None:
    listed: list[set[tuple[str, str]]] = []

    async def chunks(**_: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        yield [pod_body("a", "1")], "1"
        raise ConnectionError("cut")

    monkeypatch.setattr(fetching, "fetch_objs", chunks)
    handlers.observe_pod_lists(lambda ns, names: listed.append(names))
    with pytest.raises(ConnectionError):
        async for _ in fetching.fetch_objs(resource=PODS, namespace=None):  # type: ignore[call-arg]
            pass
    assert listed == []
    wrapped = fetching.fetch_objs
    handlers.observe_pod_lists(lambda ns, names: listed.append(names))  # again: wraps once
    assert fetching.fetch_objs is wrapped


def test_our_writes_refresh_a_cached_pod_but_never_bring_one_back() -> None:
    """A write that returns after the watch removed its Pod (deleted, or out of the scope) must
    not re-add it: no event would take it out again, and it would hold its lease forever."""
    pods = PodCache()
    a = PodInfo.from_body(pod_body("a", "1"))
    pods.upsert(a)
    assert pods.refresh(PodInfo.from_body(pod_body("a", "2")))
    assert (got := pods.get("ns", "a")) is not None and got.resource_version == "2"
    body = pod_body("a", "3")
    body["metadata"]["uid"] = "uid-other"
    assert not pods.refresh(PodInfo.from_body(body))  # another Pod under the same name
    assert (got := pods.get("ns", "a")) is not None and got.resource_version == "2"
    pods.remove("ns", "a")
    assert not pods.refresh(a)
    assert pods.get("ns", "a") is None


async def test_a_holder_that_leaves_the_scope_during_its_grant_write_stays_out() -> None:
    """The reconciler's Pod write returns after the scoped watch took the Pod out (it lost
    its label meanwhile): the Pod stays out, and the next pass hands the lease over."""
    from tests.unit.test_reconciler import KEY, NS, World

    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    write = w.kube.patch_pod_annotations

    async def patch(
        namespace: str, name: str, annotations: Any, resource_version: str
    ) -> str | None:
        w.pods.remove(namespace, name)  # the watch's DELETED, while the write is in flight
        return await write(namespace, name, annotations, resource_version)

    w.kube.patch_pod_annotations = patch  # type: ignore[method-assign]
    await w.reconciler.reconcile(KEY)
    assert w.status["holder"] == "a"  # granted to what the pass saw
    assert w.pods.get(NS, "a") is None  # but not brought back into the cache


# ----------------------------------------------------------------- events past Kopf's workers


@pytest.fixture
def kopf_streams() -> Iterator[None]:
    """dispatch_directly and the observers patch Kopf's module functions: undo it."""
    saved = watching.infinite_watch, watching.watch_objs, fetching.fetch_objs
    yield
    watching.infinite_watch, watching.watch_objs, fetching.fetch_objs = saved
    handlers._direct.clear()


async def test_pod_and_lease_events_go_straight_to_the_caches_not_to_kopf(
    monkeypatch: pytest.MonkeyPatch, kopf_streams: None
) -> None:
    """Kopf's loop still lists, resumes, relists after 410 and reports the relist; every Pod
    event (listed ones too) goes to ``on_pod`` in order, and Kopf's workers get only its own
    markers. A sink that raises is logged and the stream goes on."""
    rt = controller(lease_object("jobs"))
    rt.watches = WatchActivity(330)
    gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "status": "Failure"}}
    fake = FakeApi(
        lists=[pod_list("10", "a", "b"), pod_list("20", "a", "c")],
        streams=[
            [
                {"type": "ADDED", "object": pod_body("c", "11")},
                {"type": "MODIFIED", "object": pod_body("boom", "12")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ],
            [gone],
            [
                {"type": "ADDED", "object": pod_body("d", "21")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "22"}}},
            ],
        ],
    )
    monkeypatch.setattr(api, "get", fake.get)
    monkeypatch.setattr(api, "stream", fake.stream)
    settings = handlers.kopf_settings(SELECTOR)
    settings.watching.reconnect_backoff = 0
    handlers.observe_watches(rt.watches, lambda: 1.0)
    handlers.observe_pod_lists(lambda ns, listed: handlers.pods_listed(rt, ns, listed))
    seen: list[tuple[str | None, str]] = []

    def sink(event: Any) -> None:
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        if event["object"]["metadata"]["name"] == "boom":
            raise RuntimeError("a broken event")
        handlers.on_pod(rt, event)

    handlers.dispatch_directly({("", "pods"): sink, ("fencedlease.io", "fencedleases"): sink})
    to_kopf: list[Any] = []
    stream = cast(
        "AsyncGenerator[watching.Bookmark | RawEvent, None]",
        watching.infinite_watch(settings=settings, resource=PODS, namespace=None),
    )
    try:
        async for item in stream:
            to_kopf.append(item)
            if ("ADDED", "d") in seen:
                break
    finally:
        await stream.aclose()
    assert seen == [
        (None, "a"),
        (None, "b"),
        ("ADDED", "c"),
        ("MODIFIED", "boom"),
        (None, "a"),
        (None, "c"),
        ("ADDED", "d"),
    ]
    assert to_kopf and not [
        i for i in to_kopf if isinstance(i, dict) and i.get("type") != "BOOKMARK"
    ]
    assert sorted(p.name for p in rt.pods.in_namespace("ns")) == ["a", "c", "d"]  # b relisted away
    assert rt.watches.last == {"pods": 1.0}
    wrapped = watching.infinite_watch
    handlers.dispatch_directly({})  # again: wraps once; no sinks: Kopf gets every event
    assert watching.infinite_watch is wrapped


def test_lease_events_update_the_cache_and_poke_only_what_can_move() -> None:
    rt = controller()
    body = {
        "metadata": {"namespace": "ns", "name": "jobs", "uid": "u", "generation": 1},
        "spec": {"leaseDurationSeconds": 10, "holderSelector": {"matchLabels": {"app": "w"}}},
    }
    handlers.on_lease(rt, {"type": "ADDED", "object": body})
    assert rt.leases.get(LeaseKey("ns", "jobs")) is not None
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs")]
    handlers.on_lease(rt, {"type": "MODIFIED", "object": {**body, "status": {"phase": "Held"}}})
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs")]  # our status coming back: no poke


def test_a_lease_status_that_does_not_parse_pokes_the_lease() -> None:
    """Issue 31, defect 2: a forged status the model refuses (``phase: Bogus``) changes
    nothing a pass decides on, and was dropped here: the forgery stayed unreported."""
    rt = controller()
    body = {
        "metadata": {"namespace": "ns", "name": "jobs", "uid": "u", "generation": 1},
        "spec": {"leaseDurationSeconds": 10, "holderSelector": {"matchLabels": {"app": "w"}}},
    }
    handlers.on_lease(rt, {"type": "ADDED", "object": body})
    forged = {"fencingToken": 2**62, "phase": "Bogus", "holder": "evil-pod"}
    handlers.on_lease(rt, {"type": "MODIFIED", "object": {**body, "status": forged}})
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs")] * 2
    found = rt.leases.unverified(LeaseKey("ns", "jobs"))
    assert found is not None and found.token == 2**62 and "status.phase" in (found.error or "")
    assert rt.leases.touching("ns", [], "evil-pod") == []  # its holder is not indexed


def test_our_own_pod_writes_coming_back_scan_no_leases() -> None:
    """Every renewal's Pod write comes back as an event: it changes nothing a lease decides
    on, so no lease is even looked up."""
    rt = controller(lease_object("jobs"))
    handlers.apply_pod(rt, PodInfo.from_body(pod_body("a", "1")), deleted=False)
    asked: list[str] = []
    touching = rt.leases.touching

    def counted(namespace: str, labels: Any, holder: str) -> Any:
        asked.append(namespace)
        return touching(namespace, labels, holder)

    rt.leases.touching = counted
    again = pod_body("a", "2")
    again["metadata"]["annotations"] = {"valid-until.fencedlease.io/jobs": "2026-01-01T00:01:00Z"}
    handlers.apply_pod(rt, PodInfo.from_body(again), deleted=False)
    assert asked == []
    handlers.apply_pod(
        rt, PodInfo.from_body(pod_body("a", "3", labels={"app": "x"})), deleted=False
    )
    assert asked == ["ns"]
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs"), LeaseKey("ns", "jobs")]


def _lease(ns: str, name: str, selector: dict[str, Any], holder: str | None) -> LeaseObject:
    return LeaseObject.from_body(
        {
            "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}", "generation": 1},
            "spec": {"leaseDurationSeconds": 10, "holderSelector": selector},
            "status": {"holder": holder} if holder else {},
        }
    )


def test_a_pod_event_looks_up_the_leases_it_can_move_instead_of_scanning_them() -> None:
    """Which leases a Pod moves comes from the lease cache's index (a lookup per label), and
    it is exactly what a scan of every lease finds: selectors with several labels, with
    expressions only, empty ones, holders named in status, other namespaces, and after
    leases changed their selector or holder or were removed."""
    rng = random.Random(15)
    values = ["a", "b", "c"]

    def selector() -> dict[str, Any]:
        shape = rng.randrange(4)
        if shape == 0:
            return {}
        if shape == 1:
            return {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a", "b"]}]}
        labels = {k: rng.choice(values) for k in rng.sample(["app", "tier", "zone"], shape - 1)}
        return {"matchLabels": labels}

    cache = LeaseCache(TokenProofs(b"k" * 32))
    every: dict[LeaseKey, LeaseObject] = {}

    def put(lease: LeaseObject) -> None:
        cache.upsert(lease)
        every[lease.key] = lease

    for i in range(300):
        ns = rng.choice(["ns", "other"])
        put(_lease(ns, f"l{i}", selector(), rng.choice([None, "p1", "p2"])))
    for i in range(0, 300, 7):  # a new selector or holder for some; others deleted
        known = every.get(LeaseKey("ns", f"l{i}")) or every[LeaseKey("other", f"l{i}")]
        if i % 2:
            put(_lease(known.namespace, known.name, selector(), rng.choice([None, "p1", "p3"])))
        else:
            cache.remove(known.key)
            del every[known.key]

    class NoScan(dict[LeaseKey, LeaseObject]):
        """The cache's leases, looked up by key only: any walk over them fails."""

        def _scan(self, *_: Any) -> Any:
            raise AssertionError("a Pod event scanned the leases")

        __iter__ = keys = values = items = _scan

    cache._leases = NoScan(cache._leases)
    for _ in range(500):
        name = rng.choice(["p1", "p2", "p3", "p4"])
        before = {k: rng.choice(values) for k in rng.sample(["app", "tier", "zone"], 2)}
        after = {k: rng.choice(values) for k in rng.sample(["app", "tier", "zone"], 2)}
        body = pod_body(name, "1", labels=before)
        previous = PodInfo.from_body(body) if rng.random() < 0.8 else None
        pod = PodInfo.from_body({**body, "metadata": {**body["metadata"], "labels": after}})
        deleted = rng.random() < 0.2
        labels = [pod.labels] if previous is None else [pod.labels, previous.labels]
        looked_up = handlers.leases_moved(
            cache.touching("ns", labels, name), previous, pod, deleted=deleted
        )
        scanned = handlers.leases_moved(
            [lease for lease in every.values() if lease.namespace == "ns"],
            previous,
            pod,
            deleted=deleted,
        )
        assert sorted(looked_up) == sorted(scanned)
