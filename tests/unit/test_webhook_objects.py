"""The fenced-object path (docs/fenced-objects.md): pure parsing, then the same decisions as a
FencedArtifact write, driven through :class:`FenceChecker` on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.webhook import objects, reviews
from fencedlease.webhook.checker import FenceChecker
from fencedlease.webhook.decisions import FencedWrite, WriteKind

from .reviews import NS, admission_review, commit, grant

POD_A = {
    "username": "system:serviceaccount:default:ctl",
    "extra": {
        "authentication.kubernetes.io/pod-name": ["pod-a"],
        "authentication.kubernetes.io/pod-uid": ["uid-a"],
    },
}
POD_B = {
    "username": "system:serviceaccount:default:ctl",
    "extra": {
        "authentication.kubernetes.io/pod-name": ["pod-b"],
        "authentication.kubernetes.io/pod-uid": ["uid-b"],
    },
}
GC = {"username": "system:serviceaccount:kube-system:generic-garbage-collector"}


def cm(
    token: int | str | None = None,
    lease: str | None = "l",
    data: str = "x",
    rv: str = "",
    finalizers: list[str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "cfg", "namespace": NS, "uid": "cm-uid"}
    if lease is not None:
        meta["labels"] = {"fencedlease.io/lease": lease}
    if token is not None:
        meta["annotations"] = {"fencedlease.io/token": str(token)}
    if rv:
        meta["resourceVersion"] = rv
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": data}}


def review(
    op: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None, user: Any = None
) -> dict[str, Any]:
    return admission_review(
        op,
        "configmaps",
        group="",
        version="v1",
        kind={"group": "", "version": "v1", "kind": "ConfigMap"},
        name="cfg",
        object=obj,
        oldObject=old,
        userInfo=user or POD_A,
    )


def checker(store: AsyncMemoryStore, policy: str = "AllowEqual") -> FenceChecker:
    async def lookup(namespace: str, name: str) -> str | None:
        return policy if name == "l" else None

    return FenceChecker(
        store,
        lookup,
        None,
        writers=reviews.AllowedWriters.parse(["admin"]),
        parse=objects.parse_object_review,
    )


async def decide(store: AsyncMemoryStore, body: dict[str, Any], policy: str = "AllowEqual") -> str:
    reply = await checker(store, policy).review(body)
    response = reply["response"]
    assert "patch" not in response  # objects are never mutated
    if response["allowed"]:
        return "allowed"
    return str(response["status"]["message"]).split(":")[0]


# ---------------------------------------------------------------------------- parsing


def test_unlabelled_objects_are_not_fenced() -> None:
    verdict = objects.parse_object_review(review("UPDATE", cm(lease=None), cm(lease=None)))
    assert isinstance(verdict, reviews.Verdict) and verdict.allowed


@pytest.mark.parametrize("raw", ["0", "-1", "1e3", " 5", "05", "9223372036854775808", "x"])
def test_malformed_token_is_invalid(raw: str) -> None:
    verdict = objects.parse_object_review(review("CREATE", cm(raw)))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "invalid"
    assert "fencedlease.io/token" in verdict.message


def test_labelled_write_without_token_is_invalid() -> None:
    verdict = objects.parse_object_review(review("CREATE", cm(None)))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "invalid"
    assert "must carry the writer's fencing token" in verdict.message


def test_bad_lease_label_is_invalid() -> None:
    verdict = objects.parse_object_review(review("CREATE", cm(5, lease="Not_A_Name")))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "invalid"


def test_changing_the_lease_in_one_write_is_lease_mismatch() -> None:
    verdict = objects.parse_object_review(review("UPDATE", cm(7, lease="m"), cm(5, lease="l")))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "lease_mismatch"


def test_removing_the_label_is_fenced_under_the_old_lease() -> None:
    parsed = objects.parse_object_review(review("UPDATE", cm(7, lease=None), cm(5)))
    assert isinstance(parsed, FencedWrite)
    assert (parsed.lease, parsed.token, parsed.releases) == ("l", 7, True)


def test_status_and_subresources_are_housekeeping() -> None:
    old = cm(5)
    new = cm(5)
    new["status"] = {"anything": 1}
    new["metadata"]["resourceVersion"] = "99"
    verdict = objects.parse_object_review(review("UPDATE", new, old, user=GC))
    assert isinstance(verdict, reviews.Verdict) and verdict.allowed
    scale = review("UPDATE", {"spec": {"replicas": 3}}, {"spec": {"replicas": 1}})
    scale["request"]["subResource"] = "scale"
    verdict = objects.parse_object_review(scale)
    assert isinstance(verdict, reviews.Verdict) and verdict.allowed


def test_adding_a_finalizer_is_fenced_removing_one_is_not() -> None:
    added = objects.parse_object_review(review("UPDATE", cm(5, finalizers=["x"]), cm(5), GC))
    assert isinstance(added, FencedWrite)
    removed = objects.parse_object_review(review("UPDATE", cm(5), cm(5, finalizers=["x"]), GC))
    assert isinstance(removed, reviews.Verdict) and removed.allowed


def test_finalizer_removal_from_a_deleting_object_waits_for_the_mark() -> None:
    parsed = objects.parse_object_review(
        review("UPDATE", cm(5, deleting=True), cm(5, finalizers=["x"], deleting=True), GC)
    )
    assert isinstance(parsed, objects.CoverCheck) and parsed.token == 5


def test_delete_carries_the_stored_token() -> None:
    parsed = objects.parse_object_review(review("DELETE", None, cm(5)))
    assert isinstance(parsed, FencedWrite)
    assert (parsed.kind, parsed.token, parsed.lease) == (WriteKind.DELETE, 5, "l")
    gc = objects.parse_object_review(review("DELETE", None, cm(5), GC))
    assert isinstance(gc, objects.CoverCheck)


def test_delete_of_a_labelled_object_without_token_is_invalid() -> None:
    verdict = objects.parse_object_review(review("DELETE", None, cm(None)))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "invalid"


# --------------------------------------------------------------------------- deciding


async def test_same_decisions_as_an_artifact() -> None:
    store = AsyncMemoryStore()
    old_token = grant(store, "pod-a")
    assert await decide(store, review("CREATE", cm(old_token))) == "allowed"
    commit(store, old_token)
    new_token = grant(store, "pod-b")
    # the new holder writes; the old one, thawed, is stale against the stored object
    assert await decide(store, review("UPDATE", cm(new_token), cm(old_token), POD_B)) == "allowed"
    commit(store, new_token)
    stale = review("UPDATE", cm(old_token, data="old"), cm(new_token))
    assert await decide(store, stale) == "stale_fence"
    # ... and against the mark when it re-creates a deleted object
    assert await decide(store, review("CREATE", cm(old_token))) == "stale_fence"
    # a patch without its own token keeps the stored one: not this Pod's grant
    assert await decide(store, review("UPDATE", cm(new_token, data="old"), cm(new_token))) == (
        "holder_mismatch"
    )
    assert await decide(store, review("CREATE", cm(new_token + 1000))) == "unknown_token"
    assert await decide(store, review("CREATE", cm(new_token, lease="m"), None, POD_B)) == (
        "lease_mismatch"
    )
    assert await decide(store, review("CREATE", cm(new_token), None, {"username": "eve"})) == (
        "holder_mismatch"
    )
    assert await decide(store, review("CREATE", cm(new_token), None, {"username": "admin"})) == (
        "allowed"
    )


async def test_strictly_greater_and_duplicates() -> None:
    store = AsyncMemoryStore()
    token = grant(store, "pod-a")
    commit(store, token)
    again = review("UPDATE", cm(token, data="2"), cm(token))
    assert await decide(store, again, "StrictlyGreater") == "stale_fence"
    assert await decide(store, again, "AllowEqual") == "allowed"
    with_op = cm(token, data="2")
    with_op["metadata"]["annotations"]["fencedlease.io/operation-id"] = "op-1"
    stored = cm(token)
    stored["metadata"]["annotations"]["fencedlease.io/operation-id"] = "op-1"
    assert await decide(store, review("UPDATE", with_op, stored)) == "duplicate"


async def test_delete_is_fenced_and_waits_for_the_mark() -> None:
    store = AsyncMemoryStore()
    token = grant(store, "pod-a")
    # not recorded yet: a re-create could slip below it
    assert await decide(store, review("DELETE", None, cm(token))) == "unavailable"
    assert await decide(store, review("DELETE", None, cm(token), GC)) == "unavailable"
    commit(store, token)
    assert await decide(store, review("DELETE", None, cm(token)), "StrictlyGreater") == "allowed"
    assert await decide(store, review("DELETE", None, cm(token), POD_B)) == "holder_mismatch"
    assert await decide(store, review("DELETE", None, cm(token), GC)) == "allowed"
    newer = grant(store, "pod-b")
    commit(store, newer)
    assert await decide(store, review("DELETE", None, cm(token))) == "stale_fence"


async def test_a_deleted_lease_no_longer_holds_its_objects() -> None:
    store = AsyncMemoryStore()
    token = grant(store, "pod-a", lease="gone")
    commit(store, token, lease="gone")
    assert await decide(store, review("DELETE", None, cm(token, lease="gone"))) == "allowed"
    unlabel = review("UPDATE", cm(token, lease=None), cm(token, lease="gone"))
    assert await decide(store, unlabel) == "allowed"
    assert await decide(store, review("CREATE", cm(token, lease="gone"))) == "lease_mismatch"
