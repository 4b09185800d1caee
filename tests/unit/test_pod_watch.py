"""The Pod watch: scoped server side by ``pod_selector`` (``labelSelector`` on the list and
every watch request), resumed from the last version seen, re-listed after ``410 Gone`` with
the Pods missed meanwhile dropped from the cache; the lean Pod cache; the shared decision.

The list-watch loop (:mod:`fencedlease.watching`) runs here against a scripted fake API (no
sleeps, no network)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller import handlers
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.health import WatchActivity
from fencedlease.models import FencedLeaseStatus, Phase
from fencedlease.settings import Settings, label_selector_problem
from fencedlease.watching import ListWatch, Watched

SELECTOR = "fencedlease.io/candidate=true"


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


# ------------------------------------------------------------------ the list-watch loop


class Stream:
    """A watch response body arriving in ``chunks`` (an exception: the connection breaks)."""

    def __init__(self, chunks: Sequence[bytes | Exception]) -> None:
        self.chunks = chunks

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk


class Response:
    def __init__(
        self, status: int, body: bytes = b"", chunks: Sequence[bytes | Exception] = ()
    ) -> None:
        self.status, self.reason, self.body = status, "scripted", body
        self.content = Stream(chunks)
        self.released = False

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        self.released = True


Scripted = dict[str, Any] | Response | Exception


def lines(*events: dict[str, Any]) -> list[bytes]:
    """Watch events as the API server streams them: one JSON object per line."""
    return [json.dumps(e).encode() + b"\n" for e in events]


class FakeApi:
    """Scripted answers to list requests (a page, a Response or an exception) and watch
    requests (a list of chunks, or a Response); records every request. Once a script runs
    out, the request blocks (``exhausted`` is set): the test cancels the loop."""

    def __init__(
        self, lists: list[Scripted], streams: Sequence[Sequence[bytes | Exception] | Response]
    ) -> None:
        self.lists, self.streams = list(lists), list(streams)
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.exhausted = asyncio.Event()
        self.responses: list[Response] = []

    async def call_api(
        self, resource_path: str, method: str, *, query_params: Any = (), **_: Any
    ) -> Response:
        query = dict(query_params)
        watching = query.get("watch") == "true"
        self.calls.append(("watch" if watching else "list", resource_path, query))
        script: list[Any] = self.streams if watching else self.lists
        if not script:
            self.exhausted.set()
            await asyncio.Event().wait()
        answer = script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        response: Response = (
            Response(200, json.dumps(answer).encode())
            if isinstance(answer, dict)
            else Response(200, chunks=answer)
            if isinstance(answer, (list, tuple))
            else answer
        )
        self.responses.append(response)
        return response

    def asked(self) -> list[tuple[str, str | None]]:
        return [(kind, q.get("resourceVersion")) for kind, _, q in self.calls]


def pod_list(version: str, *names: str, more: str = "") -> dict[str, Any]:
    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": version, "continue": more},
        "items": [pod_body(n, version) for n in names],
    }


GONE = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "status": "Failure"}}


async def run_until_exhausted(loop: ListWatch, fake: FakeApi) -> None:
    """Run ``loop`` until the fake API's script runs out (bounded), then stop it."""
    task = asyncio.create_task(loop.run())
    try:
        async with asyncio.timeout(10):
            await fake.exhausted.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert all(r.released for r in fake.responses)


def pod_watch(rt: Any, fake: FakeApi, **kwargs: Any) -> ListWatch:
    """The controller's Pod watch (as :meth:`Controller.list_watches` wires it) on ``fake``."""
    return ListWatch(
        fake,
        Watched("", "v1", "pods", None, SELECTOR),
        functools.partial(handlers.on_pod, rt),
        on_listed=functools.partial(handlers.pods_listed, rt),
        on_activity=lambda: rt.watches.saw("pods", 1.0),
        pause=lambda failures: 0.0,
        **kwargs,
    )


async def test_resume_then_relist_after_gone_drops_what_was_missed() -> None:
    rt = controller(lease_object("jobs"))
    rt.watches = WatchActivity(330)
    fake = FakeApi(
        lists=[pod_list("10", "a", "b"), pod_list("20", "a", "c")],
        streams=[
            # Watch 1 from the list: c arrives, a bookmark moves the version, the server ends it.
            lines(
                {"type": "ADDED", "object": pod_body("c", "11")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
            ),
            # Watch 2 resumes from the bookmark; the version has expired: 410 → relist.
            lines(GONE),
            # Watch 3 from the relist. (b vanished while no watch was open.)
            lines({"type": "ADDED", "object": pod_body("d", "21")}),
        ],
    )
    loop = pod_watch(rt, fake)
    await run_until_exhausted(loop, fake)

    assert {q.get("labelSelector") for _, _, q in fake.calls} == {SELECTOR}  # all scoped
    assert {path for _, path, _ in fake.calls} == {"/api/v1/pods"}
    assert fake.asked() == [
        ("list", None),
        ("watch", "10"),  # from the list's version
        ("watch", "12"),  # resumed from the bookmark, no relist
        ("list", None),  # 410 Gone: relist
        ("watch", "20"),
        ("watch", "21"),  # the last event's version
    ]
    assert all(q.get("allowWatchBookmarks") == "true" for k, _, q in fake.calls if k == "watch")
    assert sorted(p.name for p in rt.pods.in_namespace("ns")) == ["a", "c", "d"]
    assert LeaseKey("ns", "jobs") in rt.scheduler.keys
    assert rt.watches.last == {"pods": 1.0}  # the liveness observation sees the loop
    assert loop.synced.is_set() and loop.lists == 2


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


async def test_a_list_that_fails_part_way_drops_nothing_and_is_listed_again() -> None:
    rt = controller()
    rt.watches = WatchActivity(330)
    listed: list[set[tuple[str, str]]] = []
    fake = FakeApi(
        lists=[
            pod_list("5", "a", more="page-2"),
            ConnectionError("cut"),  # the second page: nothing of the first is handed over
            pod_list("6", "a", more="page-2"),
            pod_list("6", "b"),
        ],
        streams=[],
    )
    loop = pod_watch(rt, fake)
    loop.on_listed = lambda ns, names: listed.append(names)
    await run_until_exhausted(loop, fake)
    assert [q.get("continue") for kind, _, q in fake.calls if kind == "list"] == [
        None,
        "page-2",
        None,
        "page-2",
    ]
    assert listed == [{("ns", "a"), ("ns", "b")}]
    assert fake.asked()[-1] == ("watch", "6")


async def test_every_event_goes_to_the_sink_in_order_and_a_failing_one_is_logged() -> None:
    """Listed objects come as events of type ``None``, then the watch's in the order sent;
    a sink that raises is logged and the stream goes on; lines split across chunks, and
    lines longer than aiohttp's readline would take, arrive whole."""
    big = pod_body("big", "13")
    big["metadata"]["annotations"] = {"x": "y" * 300_000}
    watched = b"".join(
        lines(
            {"type": "ADDED", "object": pod_body("c", "11")},
            {"type": "MODIFIED", "object": pod_body("boom", "12")},
            {"type": "ADDED", "object": big},
        )
    )
    fake = FakeApi(
        lists=[pod_list("10", "a", "b")],
        streams=[[watched[i : i + 7_000] for i in range(0, len(watched), 7_000)]],
    )
    seen: list[tuple[str | None, str]] = []

    def sink(event: Any) -> None:
        seen.append((event["type"], event["object"]["metadata"]["name"]))
        if event["object"]["metadata"]["name"] == "boom":
            raise RuntimeError("a broken event")

    loop = ListWatch(fake, Watched("", "v1", "pods", "ns"), sink, pause=lambda n: 0.0)
    await run_until_exhausted(loop, fake)
    assert seen == [
        (None, "a"),
        (None, "b"),
        ("ADDED", "c"),
        ("MODIFIED", "boom"),
        ("ADDED", "big"),
    ]
    assert {path for _, path, _ in fake.calls} == {"/api/v1/namespaces/ns/pods"}
    assert fake.asked()[-1] == ("watch", "13")


async def test_failures_back_off_and_resume_from_the_last_version() -> None:
    """A broken connection, an error answer and a watch that ends with nothing said each
    pause (the loop's backoff) and resume from the version last seen; a line cut short is
    not handed over."""
    cut = json.dumps({"type": "ADDED", "object": pod_body("half", "12")}).encode()[:40]
    fake = FakeApi(
        lists=[pod_list("10", "a")],
        streams=[
            [*lines({"type": "ADDED", "object": pod_body("c", "11")}), cut, OSError("reset")],
            Response(500, b"etcdserver: leader changed"),
            [],
            lines({"type": "ERROR", "object": {"code": 500, "message": "internal"}}),
            lines({"type": "DELETED", "object": pod_body("c", "14")}),
        ],
    )
    seen: list[tuple[str | None, str]] = []
    pauses: list[int] = []

    def pause(failures: int) -> float:
        pauses.append(failures)
        return 0.0

    loop = ListWatch(
        fake,
        Watched("", "v1", "pods"),
        lambda e: seen.append((e["type"], e["object"]["metadata"]["name"])),
        pause=pause,
    )
    await run_until_exhausted(loop, fake)
    assert seen == [(None, "a"), ("ADDED", "c"), ("DELETED", "c")]
    assert fake.asked() == [
        ("list", None),
        ("watch", "10"),
        ("watch", "11"),
        ("watch", "11"),
        ("watch", "11"),
        ("watch", "11"),
        ("watch", "14"),
    ]
    assert pauses == [1, 2, 3, 4]


async def test_a_version_gone_at_once_after_a_list_pauses_before_relisting() -> None:
    """A watch from a fresh list answered with 410 (a proxy that breaks every watch): the
    relist waits the backoff instead of hammering the API server; a 410 after events does
    not."""
    pauses: list[int] = []

    def pause(failures: int) -> float:
        pauses.append(failures)
        return 0.0

    fake = FakeApi(
        lists=[pod_list("10"), pod_list("20"), pod_list("30")],
        streams=[
            lines(GONE),
            lines({"type": "ADDED", "object": pod_body("a", "21")}, GONE),
            Response(410, b"Gone"),
        ],
    )
    loop = ListWatch(fake, Watched("", "v1", "pods"), lambda e: None, pause=pause)
    await run_until_exhausted(loop, fake)
    assert fake.asked() == [
        ("list", None),
        ("watch", "10"),  # 410 at once: pause
        ("list", None),
        ("watch", "20"),  # 410 after an event: relist at once
        ("list", None),
        ("watch", "30"),  # 410 answer at once: pause
        ("list", None),
    ]
    assert pauses == [1, 2]


async def test_coroutine_handlers_selectors_kinds_and_relisting_after_a_failure() -> None:
    """What the webhook's watches need of the one loop: coroutine handlers awaited in event
    order, label and field selectors sent to the API server, list items carrying the list's
    kind, and (``on_failure`` given) a relist after a failure instead of a resume."""
    fake = FakeApi(
        lists=[pod_list("10", "a"), pod_list("20", "b")],
        streams=[
            [*lines({"type": "ADDED", "object": pod_body("c", "11")}), OSError("reset")],
            lines({"type": "DELETED", "object": pod_body("b", "21")}),
        ],
    )
    seen: list[tuple[str | None, str, str | None]] = []
    gaps: list[int] = []

    async def sink(event: Any) -> None:
        await asyncio.sleep(0)  # awaited before the next event is read
        body = event["object"]
        seen.append((event["type"], body["metadata"]["name"], body.get("kind")))

    async def listed(_: str | None, names: set[tuple[str, str]]) -> None:
        await asyncio.sleep(0)
        seen.append(("listed", ",".join(sorted(n for _, n in names)), None))

    loop = ListWatch(
        fake,
        Watched("", "v1", "pods", label_selector="app=x", field_selector="metadata.name=a"),
        sink,
        on_listed=listed,
        on_failure=lambda: gaps.append(len(seen)),
        pause=lambda n: 0.0,
    )
    await run_until_exhausted(loop, fake)
    assert seen == [
        (None, "a", "Pod"),
        ("listed", "a", None),
        ("ADDED", "c", None),  # a watch event is as the API server sent it
        (None, "b", "Pod"),
        ("listed", "b", None),
        ("DELETED", "b", None),
    ]
    assert gaps == [3]
    assert fake.asked() == [
        ("list", None),
        ("watch", "10"),
        ("list", None),  # after the failure: relisted, not resumed from 11
        ("watch", "20"),
        ("watch", "21"),
    ]
    assert all(
        q.get("labelSelector") == "app=x" and q.get("fieldSelector") == "metadata.name=a"
        for _, _, q in fake.calls
    )


async def test_the_controller_watches_its_kinds_scoped_as_configured() -> None:
    from fencedlease.controller.runtime import Controller
    from tests.fakes import RecordingKube

    built = Controller.build(
        AsyncMemoryStore(), RecordingKube(), TokenProofs(b"k" * 32), pod_selector=SELECTOR
    )
    watches = built.list_watches(FakeApi([], []), "ns", SELECTOR)
    # the FencedLeases are Kopf's (fencedlease/kopfapp.py)
    assert [(w.what.path, w.what.label_selector) for w in watches] == [
        ("/api/v1/namespaces/ns/pods", SELECTOR),
        ("/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedartifacts", None),
        ("/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedreleases", None),
        ("/apis/fencedlease.io/v1alpha1/namespaces/ns/fencedclaims", None),
    ]
    assert all(w.on_listed is not None for w in watches)  # a relist forgets what it missed


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


def test_lease_events_update_the_cache_and_poke_only_what_can_move() -> None:
    rt = controller()
    body = {
        "metadata": {"namespace": "ns", "name": "jobs", "uid": "u", "generation": 1},
        "spec": {"leaseDurationSeconds": 10, "holderSelector": {"matchLabels": {"app": "w"}}},
    }
    handlers.on_lease(rt, {"type": "ADDED", "object": body})
    assert rt.leases.get(LeaseKey("ns", "jobs")) is not None
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs")]
    ours = FencedLeaseStatus(phase=Phase.HELD)
    rt.leases.written(LeaseKey("ns", "jobs"), ours)
    back = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}}
    handlers.on_lease(rt, {"type": "MODIFIED", "object": {**back, "status": {"phase": "Held"}}})
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
