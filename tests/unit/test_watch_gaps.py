"""A relist after ``410 Gone`` forgets what was deleted while no watch was open (no ``DELETED``
event ever comes for it): FencedReleases and FencedClaims (issue #34: they stayed in the
controller's memory until a restart) and FencedArtifacts, as Pods already were
(``tests/unit/test_pod_watch.py``): each case runs the controller's own wiring
(:meth:`Controller.list_watches`) and the list-watch loop against a scripted API (no sleeps,
no network). FencedLeases come from Kopf, which reports no relist: none is left behind by
construction, through the reconciler's passes (the cases below)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller.artifacts import ArtifactKey, ArtifactObject, ArtifactRecorder
from fencedlease.controller.claims import ClaimRequests, claim_from_body
from fencedlease.controller.leases import LEASE_FINALIZER, LeaseCache, LeaseObject
from fencedlease.controller.pods import PodCache
from fencedlease.controller.releases import ReleaseRequests, release_from_body
from fencedlease.controller.runtime import Controller
from fencedlease.health import WatchActivity
from fencedlease.models import GROUP, VERSION

from .test_claims import SPEC as CLAIM_SPEC
from .test_pod_watch import GONE, FakeApi, lines, run_until_exhausted
from .test_reconciler import KEY, World
from .test_release import SPEC as RELEASE_SPEC

NS = "ns"
LEASE_SPEC = {
    "leaseDurationSeconds": 10,
    "fencingPolicy": "AllowEqual",
    "holderSelector": {"matchLabels": {"app": "w"}},
}
ARTIFACT_SPEC = {"leaseRef": {"name": "report"}, "fencingToken": 42, "objectRef": "s3://b/k"}
BOOKMARK = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}}


class Scheduler:
    """Records pokes and forgets (what the handlers use of a Scheduler)."""

    def __init__(self) -> None:
        self.poked: list[Any] = []
        self.forgotten: list[Any] = []

    def poke(self, key: Any, delay: float = 0.0) -> None:
        self.poked.append(key)

    def forget(self, key: Any) -> None:
        self.forgotten.append(key)


def controller() -> Any:
    """What the handlers use of the controller: its caches, registries and schedulers."""
    return SimpleNamespace(
        leases=LeaseCache(TokenProofs(b"k" * 32)),
        pods=PodCache(),
        artifacts=ArtifactRecorder(store=None, kube=None),  # type: ignore[arg-type]
        scheduler=Scheduler(),
        artifact_scheduler=Scheduler(),
        release_requests=ReleaseRequests(),
        claim_requests=ClaimRequests(),
        watches=WatchActivity(330),
    )


def body(name: str, spec: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    meta = {"namespace": namespace, "name": name, "uid": f"uid-{name}", "generation": 1}
    return {"metadata": {**meta, "resourceVersion": "10"}, "spec": spec}


def page(kind: str, version: str, *items: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": f"{kind}List",
        "apiVersion": f"{GROUP}/{VERSION}",
        "metadata": {"resourceVersion": version, "continue": ""},
        "items": list(items),
    }


async def relist(rt: Any, plural: str, kind: str, first: list[Any], second: list[Any]) -> None:
    """Run the controller's watch of ``plural``: list ``first``, watch (a bookmark), 410 Gone,
    relist ``second`` (what was deleted in the gap is missing from it)."""
    fake = FakeApi(
        lists=[page(kind, "10", *first), page(kind, "20", *second)],
        streams=[lines(BOOKMARK), lines(GONE)],
    )
    watches = {w.what.plural: w for w in Controller.list_watches(rt, fake, None)}
    loop = watches[plural]
    loop.pause = lambda failures: 0.0
    await run_until_exhausted(loop, fake)
    assert [kind for kind, _ in fake.asked()] == ["list", "watch", "watch", "list", "watch"]
    assert loop.lists == 2


async def test_a_release_deleted_in_the_watch_gap_is_forgotten_at_the_relist() -> None:
    rt = controller()
    requests = rt.release_requests
    gone, kept = body("report-g2", RELEASE_SPEC), body("report-g3", RELEASE_SPEC)
    await relist(rt, "fencedreleases", "FencedRelease", [gone, kept], [kept])
    assert [r.name for r in requests.of(LeaseKey(NS, "report"))] == ["report-g3"]
    assert rt.scheduler.poked[-1] == LeaseKey(NS, "report")  # its Pod may be chosen again


async def test_a_decided_release_deleted_in_the_gap_no_longer_passes_its_pod_over() -> None:
    rt = controller()
    requests = rt.release_requests
    release = body("report-g2", RELEASE_SPEC)
    kept = release_from_body(release)
    assert kept is not None and requests.upsert(kept)
    requests.decided(requests.pending(LeaseKey(NS, "report"))[0], "Released")
    assert requests.passed_over(LeaseKey(NS, "report")) == frozenset({"uid-a"})
    await relist(rt, "fencedreleases", "FencedRelease", [release], [])
    assert requests.passed_over(LeaseKey(NS, "report")) == frozenset()


async def test_a_claim_deleted_in_the_watch_gap_is_forgotten_at_the_relist() -> None:
    rt = controller()
    requests = rt.claim_requests
    other = {**CLAIM_SPEC, "holder": "b", "holderUID": "uid-b"}
    gone, kept = body("items-x.uid-a", CLAIM_SPEC), body("items-x.uid-b", other)
    await relist(rt, "fencedclaims", "FencedClaim", [gone, kept], [kept])
    item = LeaseKey(NS, "items-x")
    assert requests.claimants(item) == frozenset({"uid-b"})  # "a" withdrew in the gap
    assert rt.scheduler.poked[-1] == item  # its generation ends if "a" held the item


# FencedLeases come from Kopf, whose public API reports no list's completion: a lease deleted
# while its watch was away is never reported. None is left behind, by construction: a lease
# holding our finalizer goes only by our own pass, which forgets it; one deleted before our
# finalizer landed is found gone by that write (docs/design.md, "What is Kopf's and what is
# ours").


async def test_a_lease_we_finalize_is_forgotten_by_our_own_write_not_its_deleted_event() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    lease = w.leases.get(KEY)
    assert lease is not None and LEASE_FINALIZER in lease.finalizers
    lease.deleting = True  # Kopf's relist shows it deleting; its DELETED event never comes
    assert await w.run() is None
    assert w.leases.get(KEY) is None
    assert await w.store.read(NS, "report") is None and w.state("a") is None


async def test_a_lease_deleting_under_another_finalizer_stays_until_its_deleted_event() -> None:
    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    lease = w.leases.get(KEY)
    assert lease is not None
    lease.deleting, lease.finalizers = True, (*lease.finalizers, "example.com/other")
    await w.run()
    assert w.leases.get(KEY) is not None  # the object is still there: its events will come


@pytest.mark.parametrize("candidates", [1, 0])
async def test_a_lease_deleted_before_our_finalizer_landed_is_forgotten_by_its_pass(
    candidates: int,
) -> None:
    """Deleted in the gap, before our first pass (granted or not) wrote the finalizer."""
    w = World()
    if candidates:
        w.pod("a", "2026-01-01T00:00:01Z")
    w.kube.leases_gone.add((NS, "report"))
    assert await w.run() is None
    assert w.leases.get(KEY) is None
    assert await w.store.read(NS, "report") is None


async def test_an_artifact_deleted_in_the_watch_gap_is_forgotten_at_the_relist() -> None:
    rt = controller()
    gone, kept = body("a1", ARTIFACT_SPEC), body("a2", ARTIFACT_SPEC)
    await relist(rt, "fencedartifacts", "FencedArtifact", [gone, kept], [kept])
    assert rt.artifacts.all_keys() == [ArtifactKey(NS, "a2")]
    assert rt.artifact_scheduler.forgotten == [ArtifactKey(NS, "a1")]


@pytest.mark.parametrize("namespace", ["elsewhere", NS])
def test_a_namespaced_list_leaves_other_namespaces_alone(namespace: str) -> None:
    requests = ClaimRequests()
    for ns in (NS, "other"):
        claim = claim_from_body(body("items-x.uid-a", CLAIM_SPEC, ns))
        assert claim is not None and requests.upsert(claim)
    poked: list[LeaseKey] = []
    requests.listed(namespace, set(), poked.append)
    left = {ns for ns in (NS, "other") if requests.claimants(LeaseKey(ns, "items-x"))}
    assert left == ({NS, "other"} if namespace == "elsewhere" else {"other"})
    assert poked == ([] if namespace == "elsewhere" else [LeaseKey(NS, "items-x")])
    rt = controller()
    rt.artifacts.upsert(ArtifactObject.from_body(body("a1", ARTIFACT_SPEC, "other")))
    rt.leases.upsert(LeaseObject.from_body(body("l1", LEASE_SPEC, "other")))
    handlers_listed = Controller.list_watches(rt, FakeApi([], []), None)
    for watch in handlers_listed:
        assert watch.on_listed is not None  # every controller watch forgets what a list misses
        watch.on_listed(namespace, set())
    assert rt.artifacts.all_keys() == [ArtifactKey("other", "a1")]
    assert rt.leases.all_keys() == [LeaseKey("other", "l1")]
