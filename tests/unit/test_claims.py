"""Claims (FencedClaim) floor by floor: the webhook's admission (``webhook/claims.py``), the
reconciler's passes on item leases with the in-memory authority (``controller/claims.py``: made
from the template, granted only to claimants, statuses reported, a withdrawn holder's generation
ended at once, unclaimed leases deleted after a grace), and the SDK's sans-IO plan
(``client/claims.py``)."""

from __future__ import annotations

from typing import Any

from fencedlease.authority.types import LeaseKey
from fencedlease.client.claims import (
    ClaimBusy,
    Claimed,
    ClaimPending,
    ClaimRefused,
    ClaimRequest,
    plan,
)
from fencedlease.client.errors import RequestInfo
from fencedlease.client.plans import Reply, Request
from fencedlease.controller.claims import UNCLAIMED_GRACE, claim_from_body
from fencedlease.controller.leases import LeaseObject
from fencedlease.models import FencedLeaseStatus
from fencedlease.webhook import claims as admit
from tests.fakes import run_plan
from tests.unit.test_reconciler import NS, World
from tests.unit.test_release import pod_user, request_review

ITEM = LeaseKey(NS, "items-x")

# ------------------------------------------------------------------------------ admission


def claim_review(op: str, spec: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    obj = {"spec": spec}
    made, gone = (obj if op == "CREATE" else None), (obj if op == "DELETE" else None)
    return request_review("fencedclaims", op, spec, user, object=made, oldObject=gone)


SPEC = {"templateRef": {"name": "items"}, "item": "x", "holder": "a", "holderUID": "uid-a"}


def test_only_the_pod_a_claim_names_makes_or_withdraws_it() -> None:
    body = claim_review("CREATE", SPEC, pod_user())
    assert admit.is_claim_review(body) and admit.decide_claim(body).allowed
    for user in (pod_user("b", "uid-b"), {"username": "admin"}):
        verdict = admit.decide_claim(claim_review("CREATE", SPEC, user))
        assert not verdict.allowed and verdict.code == "holder_mismatch"
    assert admit.decide_claim(claim_review("DELETE", SPEC, pod_user())).allowed
    stolen = admit.decide_claim(claim_review("DELETE", SPEC, pod_user("b", "uid-b")))
    assert not stolen.allowed and stolen.code == "holder_mismatch"
    # Garbage collection of a gone Pod's claims, an administrator: not a Pod.
    assert admit.decide_claim(claim_review("DELETE", SPEC, {"username": "gc"})).allowed
    bad = admit.decide_claim(claim_review("CREATE", {**SPEC, "item": "Not_A_Label"}, pod_user()))
    assert bad.code == "invalid"


# ------------------------------------------------------------------------------ the passes


def claim(w: World, pod: str, item: str = "x") -> str:
    name = f"items-{item}.uid-{pod}"
    body = {
        "metadata": {"namespace": NS, "name": name},
        "spec": {**SPEC, "item": item, "holder": pod, "holderUID": f"uid-{pod}"},
    }
    found = claim_from_body(body)
    assert found is not None
    w.reconciler.claims.requests.upsert(found)
    return name


def show_template(w: World) -> None:
    w.leases.upsert(
        LeaseObject.from_body(
            {
                "metadata": {
                    "namespace": NS,
                    "name": "items",
                    "uid": "tpl-uid",
                    "generation": 1,
                    "annotations": {"fencedlease.io/claim-template": "true"},
                },
                "spec": w.spec,
                "status": FencedLeaseStatus().to_patch(),
            }
        )
    )


def show_item_lease(w: World) -> None:
    """The watch shows the item lease the controller created."""
    (body,) = w.kube.created_leases
    body = {**body, "metadata": {**body["metadata"], "uid": "item-uid", "generation": 1}}
    w.leases.upsert(LeaseObject.from_body(body))


def world() -> World:
    w = World()
    w.reconciler.claims.kube = w.kube
    w.pod("old", "2026-01-01T00:00:00Z")  # the oldest Ready Pod: it claims nothing
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    show_template(w)
    return w


async def granted(w: World, pod: str) -> str:
    """``pod`` claims the item and is granted its new lease; its claim's name."""
    name = claim(w, pod)
    await w.reconciler.reconcile(ITEM)
    show_item_lease(w)
    await w.reconciler.reconcile(ITEM)
    return name


def statuses(w: World, name: str) -> list[dict[str, Any]]:
    return [s for _, n, s in w.kube.claim_statuses if n == name]


async def test_a_claim_makes_the_item_lease_and_only_claimants_are_granted() -> None:
    w = world()
    a = claim(w, "a")
    assert await w.reconciler.reconcile(LeaseKey(NS, "items")) is None  # never granted
    await w.reconciler.reconcile(ITEM)  # no lease yet: made from the template
    (made,) = w.kube.created_leases
    assert made["metadata"]["ownerReferences"][0]["uid"] == "tpl-uid"
    assert made["spec"]["leaseDurationSeconds"] == 30
    show_item_lease(w)
    await w.reconciler.reconcile(ITEM)
    assert w.kube.statuses[-1][2]["holder"] == "a"  # not "old", the oldest Ready Pod
    granted = statuses(w, a)[-1]
    assert granted["phase"] == "Granted" and granted["fencingToken"] > 0
    b = claim(w, "b")
    await w.reconciler.reconcile(ITEM)
    assert statuses(w, b)[-1] == {**statuses(w, b)[-1], "phase": "Busy", "holder": "a"}


async def test_a_withdrawn_holder_ends_its_generation_at_once_for_the_next_claimant() -> None:
    w = world()
    a = await granted(w, "a")
    first = statuses(w, a)[-1]["fencingToken"]
    b = claim(w, "b")
    await w.reconciler.reconcile(ITEM)
    assert w.reconciler.claims.requests.remove(NS, a) == ITEM  # "a" is done with the item
    await w.reconciler.reconcile(ITEM)  # no time passes: not an expiry
    second = statuses(w, b)[-1]
    assert second["phase"] == "Granted" and second["fencingToken"] > first


async def test_an_unclaimed_item_lease_is_deleted_after_the_grace() -> None:
    w = world()
    a = await granted(w, "a")
    w.reconciler.claims.requests.remove(NS, a)
    delay = await w.reconciler.reconcile(ITEM)
    assert delay is not None and delay <= 1.0 and not w.kube.deleted_leases
    w.clock.advance(UNCLAIMED_GRACE)
    await w.reconciler.reconcile(ITEM)
    assert w.kube.deleted_leases == [(NS, "items-x")]


async def test_a_claim_under_a_lease_that_is_no_template_is_refused() -> None:
    w = world()
    name = "plain-x.uid-a"
    body = {
        "metadata": {"namespace": NS, "name": name},
        "spec": {**SPEC, "templateRef": {"name": "report"}},
    }
    found = claim_from_body(body)
    assert found is not None
    w.reconciler.claims.requests.upsert(found)
    await w.reconciler.reconcile(LeaseKey(NS, "report-x"))
    assert not w.kube.created_leases
    assert statuses(w, name)[-1]["phase"] == "Refused"


# ------------------------------------------------------------------------------ the SDK plan

REQ = ClaimRequest("items", "x", pod="a", pod_uid="uid-a", namespace=NS, wait=1.0, poll=0.5)
INFO = RequestInfo("POST", "https://api")


def drive(replies: list[tuple[int, Any]], req: ClaimRequest = REQ) -> tuple[Any, list[Any]]:
    return run_plan(plan(req), [Reply(INFO, code, body) for code, body in replies])


def test_each_outcome_of_the_claim_plan() -> None:
    granted = {
        "status": {"phase": "Granted", "leaseName": "items-x", "leaseId": "g", "fencingToken": 7}
    }
    result, steps = drive([(201, {}), (200, granted)])
    assert result == Claimed("items", "x", "items-x", "g", 7, "items-x.uid-a")
    assert steps[0].body["spec"]["holderUID"] == "uid-a"
    result, steps = drive(
        [(409, {}), (200, {"status": {"phase": "Busy", "holder": "b"}}), (200, {})]
    )
    assert result == ClaimBusy("x", "b")
    assert isinstance(steps[-1], Request) and steps[-1].method == "DELETE"  # withdrawn
    result, _ = drive([(403, {"kind": "Status", "message": "holder_mismatch: no"})])
    assert isinstance(result, ClaimRefused) and result.reason == "holder_mismatch"
    result, _ = drive([(201, {}), (200, {}), (200, {})])
    assert result == ClaimPending("items-x.uid-a")


def test_a_claim_event_pokes_the_item_lease_when_new_or_withdrawn() -> None:
    from fencedlease.controller.claims import ClaimRequests

    requests, poked = ClaimRequests(), list[Any]()
    body = {"metadata": {"namespace": NS, "name": "items-x.uid-a"}, "spec": SPEC}
    requests.on_event({"type": "ADDED", "object": body}, poked.append)
    requests.on_event({"type": "MODIFIED", "object": {**body, "status": {}}}, poked.append)
    assert poked == [ITEM] and requests.claimants(ITEM) == frozenset({"uid-a"})
    requests.on_event({"type": "DELETED", "object": body}, poked.append)
    assert poked == [ITEM, ITEM] and requests.claimants(ITEM) == frozenset()


async def test_a_claim_under_another_template_naming_the_same_lease_is_not_a_claimant() -> None:
    # "items" + "x-y" and "items-x" + "y" both name the FencedLease "items-x-y".
    w = world()
    key = LeaseKey(NS, "items-x-y")
    a = claim(w, "a", item="x-y")
    await w.reconciler.reconcile(key)  # made from "items", granted to "a"
    assert statuses(w, a)[-1]["phase"] == "Granted"
    other = "items-x-y.uid-b"
    body = {
        "metadata": {"namespace": NS, "name": other},
        "spec": {
            "templateRef": {"name": "items-x"},
            "item": "y",
            "holder": "b",
            "holderUID": "uid-b",
        },
    }
    found = claim_from_body(body)
    assert found is not None and found.lease == key
    w.reconciler.claims.requests.upsert(found)
    assert w.reconciler.claims.requests.remove(NS, a) == key  # "a" is done
    await w.reconciler.reconcile(key)
    assert statuses(w, other)[-1]["phase"] == "Refused"
    assert w.kube.statuses[-1][2]["phase"] != "Held"  # "b" is not granted the item
