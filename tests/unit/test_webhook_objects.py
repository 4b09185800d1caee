"""The fenced-object path (docs/fenced-objects.md): pure parsing, then the same decisions as a
FencedArtifact write, driven through :class:`FenceChecker` on the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.kube import Forbidden, NotFound
from fencedlease.webhook import objects, reviews
from fencedlease.webhook.checker import FenceChecker
from fencedlease.webhook.decisions import FencedWrite, WriteKind
from fencedlease.webhook.parents import ApiParents, ParentUnreadable

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


def test_server_kept_metadata_is_housekeeping() -> None:
    old = cm(5)
    new = cm(5)
    new["metadata"]["resourceVersion"] = "99"
    new["metadata"]["managedFields"] = [{"manager": "x"}]
    verdict = objects.parse_object_review(review("UPDATE", new, old, user=GC))
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


# ------------------------------------------------------- issue 42: request paths, stored side

NAMESPACE_CONTROLLER = {"username": "system:serviceaccount:kube-system:namespace-controller"}


def collection_item(old: dict[str, Any], user: Any = None) -> dict[str, Any]:
    """One item of a collection delete: no ``request.name``, no ``request.object``."""
    body = review("DELETE", None, old, user)
    del body["request"]["name"]
    return body


def test_a_collection_delete_item_takes_its_name_from_the_stored_object() -> None:
    parsed = objects.parse_object_review(collection_item(cm(5)))
    assert isinstance(parsed, FencedWrite) and parsed.name == "cfg"
    nc = objects.parse_object_review(collection_item(cm(5), NAMESPACE_CONTROLLER))
    assert isinstance(nc, objects.CoverCheck) and nc.name == "cfg"


def test_status_on_the_main_resource_is_published_data() -> None:
    """A custom resource without a status subresource: .status is the writer's data."""
    old, new = cm(5), cm(5)
    new["status"] = {"phase": "stale"}
    parsed = objects.parse_object_review(review("UPDATE", new, old, POD_B))
    assert isinstance(parsed, FencedWrite) and parsed.token == 5


def test_cluster_deleters_delete_an_object_without_a_token() -> None:
    for user in (GC, NAMESPACE_CONTROLLER):
        for stored in (cm(None), cm("garbage")):
            verdict = objects.parse_object_review(review("DELETE", None, stored, user))
            assert isinstance(verdict, reviews.Verdict) and verdict.allowed, verdict


def test_a_malformed_stored_label_is_not_stuck() -> None:
    bad = cm(None, lease="Not_A_Lease")
    bad["metadata"]["annotations"] = {"fencedlease.io/operation-id": ""}
    for body in (
        review("UPDATE", cm(None, lease=None), bad, {"username": "admin"}),  # label removed
        review("DELETE", None, bad, {"username": "admin"}),
        review("DELETE", None, bad, GC),
    ):
        verdict = objects.parse_object_review(body)
        assert isinstance(verdict, reviews.Verdict) and verdict.allowed, verdict
    kept = objects.parse_object_review(review("UPDATE", cm(None, lease="Not_A_Lease"), bad))
    assert isinstance(kept, reviews.Verdict) and kept.code == "invalid"


def with_op(obj: dict[str, Any], op: str) -> dict[str, Any]:
    obj["metadata"].setdefault("annotations", {})["fencedlease.io/operation-id"] = op
    return obj


@pytest.mark.parametrize("policy", ["AllowEqual", "StrictlyGreater"])
async def test_a_superseded_replay_is_stale_not_duplicate(policy: str) -> None:
    store = AsyncMemoryStore()
    token = grant(store, "pod-a")
    commit(store, token)
    replay = review("UPDATE", with_op(cm(token, data="2"), "op-1"), with_op(cm(token), "op-1"))
    assert await decide(store, replay, policy) == "duplicate"  # a retry while current
    grant(store, "pod-b")  # nothing written under the new grant yet
    assert await decide(store, replay, policy) == "stale_fence"


async def test_an_unissued_stored_token_fences_no_one() -> None:
    store = AsyncMemoryStore()
    token = grant(store, "pod-a")
    forged = 2**63 - 1  # labelled past the fence, before the policy existed
    assert await decide(store, review("UPDATE", cm(token, data="y"), cm(forged))) == "allowed"
    # a token of another lease is not this lease's either
    other = grant(store, "pod-x", lease="m")
    commit(store, other, lease="m")
    assert await decide(store, review("UPDATE", cm(token, data="y"), cm(other))) == "allowed"
    # the ordering by a real stored token still holds
    newer = grant(store, "pod-b")
    assert await decide(store, review("UPDATE", cm(token), cm(newer, data="n"))) == "stale_fence"
    # deleting it: write your own token first (the message says so)
    reply = await checker(store).review(review("DELETE", None, cm(forged), POD_B))
    message = reply["response"]["status"]["message"]
    assert message.startswith("unknown_token") and "write your own token to it first" in message


# ------------------------------------------------------------ issue 43: status, by who writes

DEPLOYMENT_CONTROLLER = {"username": "system:serviceaccount:kube-system:deployment-controller"}
POD_ELSEWHERE = {
    "username": "system:serviceaccount:other:ctl",
    "extra": {
        "authentication.kubernetes.io/pod-name": ["pod-b"],
        "authentication.kubernetes.io/pod-uid": ["uid-b"],
    },
}


def status(old: dict[str, Any], user: Any, dry_run: bool = False) -> dict[str, Any]:
    new = {**old, "status": {"ready": True}}
    body = review("UPDATE", new, old, user)
    body["request"]["subResource"] = "status"
    body["request"]["dryRun"] = dry_run
    return body


async def test_status_is_written_by_the_current_holder_only() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    for dry_run in (False, True):
        assert await decide(store, status(cm(a), POD_A, dry_run)) == "allowed"
        assert await decide(store, status(cm(a), POD_B, dry_run)) == "holder_mismatch"
    b = grant(store, "pod-b")  # the new holder reports status before writing the object
    assert await decide(store, status(cm(a), POD_B)) == "allowed"
    assert await decide(store, status(cm(a), POD_A)) == "stale_fence"  # its token, superseded
    assert await decide(store, status(cm(b), POD_A)) == "holder_mismatch"
    assert await decide(store, status(cm(None), POD_A)) == "holder_mismatch"
    # the cluster's status writers and people are no lease candidates; nor other namespaces' Pods
    for user in (DEPLOYMENT_CONTROLLER, GC, {"username": "admin"}, POD_ELSEWHERE):
        assert await decide(store, status(cm(a), user)) == "allowed", user
    assert await decide(store, status(cm(a, lease=None), POD_A)) == "allowed"
    assert await decide(store, status(cm(a, lease="gone"), POD_A)) == "allowed"


def test_other_subresources_are_not_fenced() -> None:
    body = review("UPDATE", cm(5), cm(5))
    body["request"]["subResource"] = "ephemeralcontainers"
    verdict = objects.parse_object_review(body)
    assert isinstance(verdict, reviews.Verdict) and verdict.allowed


# ------------------------------------------------------------- issue 43: scale, by who writes

HPA = {"username": "system:serviceaccount:kube-system:horizontal-pod-autoscaler"}


def scale_review(user: Any, *, op: str = "UPDATE", **resource: Any) -> dict[str, Any]:
    """A scale write of Deployment ``cfg``: a Scale object, no labels, no annotations."""

    def scale(replicas: int) -> dict[str, Any]:
        meta = {"name": "cfg", "namespace": NS, "uid": "d-uid", "resourceVersion": "7"}
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta,
                "spec": {"replicas": replicas}}  # fmt: skip

    body = admission_review(
        op,
        resource.pop("plural", "deployments"),
        group=resource.pop("group", "apps"),
        version=resource.pop("version", "v1"),
        kind={"group": "autoscaling", "version": "v1", "kind": "Scale"},
        name="cfg",
        subResource="scale",
        object=scale(3),
        oldObject=scale(1),
        userInfo=user,
    )
    return body


class Parents:
    """The parent objects the webhook reads, by path; counts the reads."""

    def __init__(self, found: dict[str, Any] | Exception) -> None:
        self.found = found
        self.read: list[str] = []

    async def __call__(self, ref: objects.ParentRef) -> dict[str, Any]:
        self.read.append(ref.path)
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


async def decide_scale(store: AsyncMemoryStore, body: dict[str, Any], parents: Parents) -> str:
    c = checker(store)
    c.parents = parents
    reply = (await c.review(body))["response"]
    if reply["allowed"]:
        return "allowed"
    return str(reply["status"]["message"]).split(":")[0]


async def test_scale_is_written_by_the_current_holder_only() -> None:
    store = AsyncMemoryStore()
    a = grant(store, "pod-a")
    commit(store, a)
    parent = Parents(cm(a))
    assert await decide_scale(store, scale_review(POD_A), parent) == "allowed"
    assert await decide_scale(store, scale_review(POD_B), parent) == "holder_mismatch"
    assert parent.read == ["/apis/apps/v1/namespaces/default/deployments/cfg"] * 2
    grant(store, "pod-b")  # a newer grant: the frozen ex-holder's queued scale write is stale
    assert await decide_scale(store, scale_review(POD_A), parent) == "stale_fence"
    assert await decide_scale(store, scale_review(POD_B), parent) == "allowed"
    # a custom resource with a scale subresource: the same, its parent read by its own path
    crd = scale_review(POD_A, group="example.com", plural="widgets")
    assert await decide_scale(store, crd, parent) == "stale_fence"
    assert parent.read[-1] == "/apis/example.com/v1/namespaces/default/widgets/cfg"
    core = scale_review(POD_A, group="", plural="replicationcontrollers")
    assert await decide_scale(store, core, parent) == "stale_fence"
    assert parent.read[-1] == "/api/v1/namespaces/default/replicationcontrollers/cfg"


async def test_scale_by_the_cluster_and_people_is_admitted_without_a_read() -> None:
    store = AsyncMemoryStore()
    grant(store, "pod-a")
    parent = Parents(cm(1))
    for user in (HPA, DEPLOYMENT_CONTROLLER, {"username": "admin"}, {"username": "alice"},
                 POD_ELSEWHERE):  # fmt: skip
        assert await decide_scale(store, scale_review(user), parent) == "allowed", user
    assert parent.read == []


async def test_scale_of_an_unlabelled_parent_is_admitted_and_a_failed_read_is_unavailable() -> None:
    store = AsyncMemoryStore()
    grant(store, "pod-a")
    assert await decide_scale(store, scale_review(POD_B), Parents(cm(None, lease=None))) == (
        "allowed"
    )
    # a lease that does not exist (any more) fences nothing
    assert await decide_scale(store, scale_review(POD_B), Parents(cm(1, lease="gone"))) == (
        "allowed"
    )
    for error in (Forbidden(status=403, reason="Forbidden"), NotFound(status=404, reason="x"),
                  OSError("connection reset")):  # fmt: skip
        reader = ApiParentsFailing(error)
        c = checker(store)
        c.parents = reader
        reply = (await c.review(scale_review(POD_A)))["response"]
        assert not reply["allowed"] and reply["status"]["code"] == 503, reply
        message = reply["status"]["message"]
        assert message.startswith("unavailable") and "deployments.apps default/cfg" in message
    forbidden = await ApiParentsFailing(Forbidden(status=403, reason="x")).message()
    assert "RBAC get" in forbidden and "fencedObjects.resources" in forbidden
    # a webhook that reads no parents fails closed too
    reply = (await checker(store).review(scale_review(POD_A)))["response"]
    assert not reply["allowed"] and "reads no parent objects" in reply["status"]["message"]


class ApiParentsFailing:
    """:class:`ApiParents` whose API call fails with ``error`` (the mapping under test)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def __call__(self, ref: objects.ParentRef) -> dict[str, Any]:
        class Api:
            async def call_api(_self: Any, *args: Any, **kwargs: Any) -> Any:
                raise self.error

        return await ApiParents(Api())(ref)  # type: ignore[arg-type]

    async def message(self) -> str:
        ref = objects.ParentRef("apps", "v1", "deployments", NS, "cfg")
        try:
            await self(ref)
        except ParentUnreadable as error:
            return str(error)
        raise AssertionError("no error")


@pytest.mark.parametrize(
    "resource",
    [
        {"group": "apps/../../api", "version": "v1", "plural": "deployments"},
        {"group": "apps", "version": "v1/..", "plural": "deployments"},
        {"group": "apps", "version": "v1", "plural": "deployments/../secrets"},
        {"group": "apps", "version": "v1", "plural": "Deployments"},
        {"group": 7, "version": "v1", "plural": "deployments"},
    ],
)
def test_a_scale_review_naming_no_valid_resource_is_invalid(resource: dict[str, Any]) -> None:
    verdict = objects.parse_object_review(scale_review(POD_A, **resource))
    assert isinstance(verdict, reviews.Verdict) and verdict.code == "invalid"


def test_a_scale_review_that_is_no_update_is_not_fenced() -> None:
    verdict = objects.parse_object_review(scale_review(POD_A, op="CONNECT"))
    assert isinstance(verdict, reviews.Verdict) and verdict.allowed
