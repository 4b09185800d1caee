"""Regression tests for the adversarial review's defects, on the pure logic and the checker.

Each test names the defect it pins down; each fails on the admission-time-advance design
(the mark was moved by whatever review reached the webhook) and passes now.  The same
defects are tested through the real API server in ``tests/integration/test_security.py``.
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from typing import Any

import pytest

from fencedlease.authority import fence as fencing
from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import FenceCode, LeaseKey, TokenGrant
from fencedlease.models import ARTIFACT_FINALIZER
from fencedlease.store.etcd import EtcdStore
from fencedlease.webhook import reviews
from fencedlease.webhook.checker import FenceChecker

from .reviews import NS, answer, art, checker, commit, review


def grant_to(store: AsyncMemoryStore, holder: str, uid: str, lease: str = "l") -> int:
    held = store.auth.read(NS, lease)
    if held is not None and held.record.state.value == "held":
        store.auth.release(NS, lease, held.record.lease_id, held.token)
    result = store.auth.acquire(NS, lease, holder, 10, holder_uid=uid)
    return int(getattr(result, "token"))  # noqa: B009 - Acquired


def pod_user(name: str, uid: str) -> dict[str, Any]:
    return {
        "username": f"system:serviceaccount:{NS}:worker",
        "groups": ["system:serviceaccounts"],
        "extra": {reviews.POD_NAME_EXTRA: [name], reviews.POD_UID_EXTRA: [uid]},
    }


# ------------------------------------------------- defect 3: a write that never committed


async def test_readmission_of_the_same_write_is_not_refused_as_stale() -> None:
    """The API server re-runs admission when its write loses a race: under StrictlyGreater
    the first attempt must not have used up the grant."""
    store = AsyncMemoryStore()
    old = grant_to(store, "pod-a", "uid-a")
    commit(store, old)
    new = grant_to(store, "pod-b", "uid-b")
    c = checker(store, policy="StrictlyGreater")
    stored = art(old, "v1", rv="7")
    write = review("UPDATE", art(new, "v2", rv="7"), stored, user=pod_user("pod-b", "uid-b"))
    assert answer(await c.review(write))[0]
    # The label patch won the race; the holder's patch is re-admitted against the new object.
    relabelled = art(old, "v1", rv="8")
    retry = review("UPDATE", art(new, "v2", rv="8"), relabelled, user=pod_user("pod-b", "uid-b"))
    ok, msg = answer(await c.review(retry))
    assert ok, msg


async def test_admitted_but_never_committed_write_leaves_no_trace() -> None:
    """Dry run, a write later refused by schema/CEL, or a forged review: nothing moves."""
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    c = checker(store, policy="StrictlyGreater")
    for _ in range(3):
        assert answer(await c.review(review("CREATE", art(t), user=pod_user("pod-a", "uid-a"))))[0]
    assert store.auth.high_water_mark(NS, "l") is None
    # ... so the holder's real (first committed) write still passes.
    assert answer(await c.review(review("CREATE", art(t), user=pod_user("pod-a", "uid-a"))))[0]


# ------------------------------------------------------ defect 4: forged reviews, the mark


async def test_delete_and_recreate_cannot_slip_below_a_committed_write() -> None:
    store = AsyncMemoryStore()
    old = grant_to(store, "pod-a", "uid-a")
    new = grant_to(store, "pod-b", "uid-b")
    c = checker(store)
    # The artifact shows ``new`` (committed) and is being deleted: our finalizer stays on
    # until the controller recorded ``new`` in the mark.
    stored = art(new, rv="3")
    stored["metadata"]["finalizers"] = [ARTIFACT_FINALIZER]
    released = art(new, rv="3")
    released["metadata"]["finalizers"] = []
    ok, msg = answer(await c.review(review("UPDATE", released, stored)))
    assert not ok and msg.startswith("invalid: finalizer") and f"covers token {new}" in msg
    commit(store, new)
    assert answer(await c.review(review("UPDATE", released, stored)))[0]
    ok, msg = answer(await c.review(review("CREATE", art(old))))
    assert not ok and msg.startswith(f"stale_fence: token {old} is below the high-water mark {new}")


async def test_two_artifacts_in_one_domain_follow_the_recorded_commits() -> None:
    store = AsyncMemoryStore()
    old = grant_to(store, "pod-a", "uid-a")
    new = grant_to(store, "pod-b", "uid-b")
    c = checker(store)
    commit(store, new)  # artifact "one" committed with the newer token
    other = art(old, "x")
    other["metadata"]["name"] = "two"
    ok, msg = answer(await c.review(review("CREATE", other)))
    assert not ok and msg.startswith("stale_fence")


async def test_admitted_writes_get_the_finalizer_and_nothing_else() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    reply = await checker(store).review(review("CREATE", art(t)))
    patch = json.loads(base64.b64decode(reply["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/metadata/finalizers", "value": [ARTIFACT_FINALIZER]}]
    has = art(t, "y", rv="2")
    has["metadata"]["finalizers"] = ["other", ARTIFACT_FINALIZER]
    reply = await checker(store).review(review("UPDATE", has, art(t, rv="2")))
    assert reply["response"]["allowed"] and "patch" not in reply["response"]
    refused = await checker(store).review(review("CREATE", art(t + 100)))
    assert not refused["response"]["allowed"] and "patch" not in refused["response"]


def test_recording_only_trusts_tokens_issued_for_the_lease() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    assert not store.auth.record_commit(NS, "l", t + 1000).verified
    assert not store.auth.record_commit(NS, "other", t).verified
    assert store.auth.high_water_mark(NS, "l") is None
    assert store.auth.record_commit(NS, "l", t).advanced
    again = store.auth.record_commit(NS, "l", t)
    assert again.verified and not again.advanced
    assert (
        fencing.committed(None, 5) is not None
        and fencing.committed(fencing.committed(None, 5), 4) is None
    )


# ------------------------------------------------ defect 2: a grant belongs to a Pod (UID)


async def test_a_pod_recreated_under_the_holders_name_cannot_use_its_grant() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "worker-0", "uid-old")
    c = checker(store, allow_non_pod=False)
    ok, msg = answer(await c.review(review("CREATE", art(t), user=pod_user("worker-0", "uid-new"))))
    assert not ok and msg.startswith("holder_mismatch") and "uid-old" in msg
    assert answer(await c.review(review("CREATE", art(t), user=pod_user("worker-0", "uid-old"))))[0]


def test_grant_check_binds_name_and_uid() -> None:
    key = LeaseKey(NS, "l")
    grant = TokenGrant(NS, "l", "id", "w-0", "u-1")
    assert fencing.check_grant(grant, key, "w-0", "u-1") is None
    assert fencing.check_grant(grant, key, "w-0", "u-2") is FenceCode.HOLDER_MISMATCH
    assert fencing.check_grant(grant, key, "w-0", None) is FenceCode.HOLDER_MISMATCH
    legacy = TokenGrant(NS, "l", "id", "w-0")  # recorded before UIDs: name only
    assert fencing.check_grant(legacy, key, "w-0", "u-2") is None


# ------------------------------------------------ defect 5: holder binding is opt-in now


async def test_non_pod_writers_are_refused_unless_named() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")

    async def lookup(namespace: str, name: str) -> str:
        return "AllowEqual"

    def with_writers(*entries: str) -> Any:
        from fencedlease.webhook.checker import FenceChecker

        return FenceChecker(store, lookup, writers=reviews.AllowedWriters.parse(entries))

    ci = {"username": "ci-bot", "groups": ["deployers", "system:authenticated"]}
    ok, msg = answer(await with_writers().review(review("CREATE", art(t), user=ci)))
    assert not ok and msg.startswith("holder_mismatch") and "'ci-bot'" in msg
    assert answer(await with_writers("ci-bot").review(review("CREATE", art(t), user=ci)))[0]
    assert answer(await with_writers("group:deployers").review(review("CREATE", art(t), user=ci)))[
        0
    ]
    ok, _ = answer(
        await with_writers("group:other", "bob").review(review("CREATE", art(t), user=ci))
    )
    assert not ok


# ------------------------------------------------------------ defect 6: malformed input


def test_deep_nesting_is_detected_without_recursion() -> None:
    deep: Any = []
    for _ in range(50_000):
        deep = [deep]
    assert reviews.too_deep({"request": deep})
    assert not reviews.too_deep(review("CREATE", art(5)))


async def test_bad_unicode_and_wrong_version_are_invalid_not_unavailable() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    c = checker(store)
    bad_lease = art(t, lease="\ud800")
    ok, msg = answer(await c.review(review("CREATE", bad_lease)))
    assert not ok and msg.startswith("invalid: spec.leaseRef.name")
    named = art(t)
    named["metadata"]["name"] = "x\ud800"
    body = review("CREATE", named)
    body["request"]["name"] = "x\ud800"
    ok, msg = answer(await c.review(body))
    assert not ok and msg.startswith("invalid: name")
    json.dumps(await c.review(body))  # the reply is always encodable
    old = review("CREATE", art(t))
    old["apiVersion"] = "admission.k8s.io/v1beta1"
    ok, msg = answer(await c.review(old))
    assert not ok and msg.startswith("invalid:") and "v1beta1" in msg


# ------------------------------------------------- defect 1: status floors need a proof


def test_token_proofs_bind_lease_and_token() -> None:
    proofs = TokenProofs(b"k" * 32)
    proof = proofs.sign("ns-a", "lease", "id-1", 42)
    assert proofs.verify("ns-a", "lease", "id-1", 42, proof)
    assert not proofs.verify("ns-a", "lease", "id-1", 2**62, proof)
    assert not proofs.verify("ns-b", "lease", "id-1", 42, proof)
    assert not proofs.verify("ns-a", "lease", "id-1", 42, None)
    assert not proofs.verify("ns-a", "lease", "id-1", 42, "\ud800")
    assert not TokenProofs(b"x" * 32).verify("ns-a", "lease", "id-1", 42, proof)


async def test_generate_name_creates_have_no_name_yet() -> None:
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    body = review("CREATE", art(t))
    body["request"]["name"] = ""
    body["request"]["object"]["metadata"] = {"generateName": "cat-", "namespace": NS}
    assert answer(await checker(store).review(body))[0]


def _depth(value: object) -> int:
    """The reference definition: containers nested in ``value`` (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("limit", [1, 2, 3, 8, reviews.MAX_DEPTH])
def test_too_deep_agrees_with_the_recursive_definition_at_every_boundary(limit: int) -> None:
    """too_deep(body) is exactly depth(body) > limit: dicts, lists, empty ones, scalars, and
    the deep branch anywhere among shallow siblings (the level-by-level walk)."""
    shapes: list[object] = [None, 1, "x", [], {}, [[]], {"a": {}}, review("CREATE", art(5))]
    for n in range(1, limit + 3):
        value: object = "leaf"
        for i in range(n):
            value = [value] if i % 2 else {"k": value, "s": 1}
        shapes += [value, [1, {"a": 2}, value, "z"], {"x": [], "y": value}, [[], [[value]]]]
    for shape in shapes:
        assert reviews.too_deep(shape, limit) == (_depth(shape) > limit), (limit, shape)


# ------------------------------- the second review: finalizers, forged stored objects, identity


async def test_a_spec_write_may_not_take_the_finalizer_off_an_artifact_being_deleted() -> None:
    """The finalizer cannot be added back to an object being deleted, so a spec write that
    drops it would commit its token and delete the artifact in one step, before the mark
    covers that token; a later write below it would then be admitted."""
    store = AsyncMemoryStore()
    first = grant_to(store, "pod-a", "uid-a")
    middle = grant_to(store, "pod-b", "uid-b")
    last = grant_to(store, "pod-c", "uid-c")
    c = checker(store)
    commit(store, first)
    stored = art(first, rv="5")
    stored["metadata"]["finalizers"] = [ARTIFACT_FINALIZER]
    stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    write = art(last, "newer", rv="5")
    write["metadata"]["finalizers"] = []
    write["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ok, msg = answer(await c.review(review("UPDATE", write, stored)))
    assert not ok and msg.startswith("invalid: a write that changes the spec of an artifact")
    assert ARTIFACT_FINALIZER in msg
    write["metadata"]["finalizers"] = [ARTIFACT_FINALIZER]  # kept: admitted, and it waits
    assert answer(await c.review(review("UPDATE", write, stored)))[0]
    ok, msg = answer(await c.review(review("CREATE", art(middle, "stale"))))
    # The mark is still at ``first``, but ``last``'s grant superseded ``middle`` at once.
    assert not ok and msg.startswith(f"stale_fence: token {middle} was superseded by the newer")


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
async def test_the_requests_own_deletion_timestamp_does_not_skip_the_finalizer(
    operation: str,
) -> None:
    """The API server clears a CREATE's deletionTimestamp and keeps the stored one on an
    UPDATE, both after mutating admission: only the stored object says it is being deleted."""
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    write = art(t, "x", rv="2" if operation == "UPDATE" else "")
    write["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    old = art(t, rv="2") if operation == "UPDATE" else None
    reply = await checker(store).review(review(operation, write, old))
    assert reply["response"]["allowed"]
    patch = json.loads(base64.b64decode(reply["response"]["patch"]))
    assert patch == [{"op": "add", "path": "/metadata/finalizers", "value": [ARTIFACT_FINALIZER]}]


class _NothingStored(EtcdStore):
    """An EtcdStore whose every read finds nothing (no etcd needed)."""

    async def _txn(
        self, operation: str, compare: list[Any], success: list[Any], failure: Any = None
    ) -> Any:
        empty = SimpleNamespace(response_range=SimpleNamespace(kvs=[]))
        return SimpleNamespace(responses=[empty] * len(success), succeeded=True)

    async def epoch(self) -> str:
        return "e"


@pytest.mark.parametrize(
    ("lease", "token"),
    [("x" * 5000, 5), ("", 5), ("a/b", 5), ("Upper", 5), ("\ud800", 5), ("l", 2**64), ("l", 0)],
)
async def test_a_forged_stored_object_is_neither_a_store_key_nor_an_internal_error(
    lease: str, token: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Status and finalizer reviews take the lease and token from ``oldObject``, which only a
    forged review can fill with names no write could store: they were cached as lease keys
    for good (memory growth per request) or raised into a 503 with a stack trace."""
    store = _NothingStored(["http://127.0.0.1:1"])
    c = FenceChecker(store, lambda namespace, name: "AllowEqual", None)
    status = review(
        "UPDATE",
        art(token, rv="3", accepted=token, lease=lease),
        art(token, rv="3", lease=lease),
        sub="status",
    )
    stored = art(token, rv="3", lease=lease)
    stored["metadata"]["finalizers"] = [ARTIFACT_FINALIZER]
    release = review("UPDATE", art(token, rv="3", lease=lease), stored)
    for body in (status, release):
        reply = await c.review(body)
        assert reply["response"].get("status", {}).get("code") != 503, reply
    assert cached_leases(store) == 0
    assert not [r for r in caplog.records if r.exc_info]


def cached_leases(store: EtcdStore) -> int:
    """Leases the store holds anything about in memory (its caches' largest key set)."""
    return len(store._known.keys() | store._observations.keys() | store._lease_keys.keys())


async def test_fence_reads_do_not_grow_the_lease_key_cache() -> None:
    store = _NothingStored(["http://127.0.0.1:1"])
    for i in range(50):
        await store.grant_and_mark(NS, f"lease-{i}", 7)
    assert cached_leases(store) == 0


async def test_pod_extras_of_a_user_that_is_not_a_service_account_do_not_make_it_a_pod() -> None:
    """Only a service-account token is bound to a Pod; an authenticating proxy or
    impersonated user extras could otherwise write as the holder Pod."""
    store = AsyncMemoryStore()
    t = grant_to(store, "pod-a", "uid-a")
    alice = pod_user("pod-a", "uid-a") | {"username": "alice"}
    ok, msg = answer(
        await checker(store, allow_non_pod=False).review(review("CREATE", art(t), user=alice))
    )
    assert not ok and msg.startswith("holder_mismatch") and "'alice'" in msg
    ok, _ = answer(
        await checker(store, allow_non_pod=False).review(
            review("CREATE", art(t), user=pod_user("pod-a", "uid-a"))
        )
    )
    assert ok


@pytest.mark.parametrize("field", ["subResource", "resource", "version"])
async def test_what_an_invalid_review_echoes_is_bounded(field: str) -> None:
    body = review("CREATE", art(5))
    huge = "x" * 100_000 + "\u00e9"
    if field == "subResource":
        body["request"]["subResource"] = huge
    else:
        body["request"]["resource"][field] = huge
    ok, msg = answer(await checker(AsyncMemoryStore()).review(body))
    assert not ok and msg.startswith("invalid") and len(msg) < 400 and msg.isascii()
