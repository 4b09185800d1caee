"""Superseded generations and deleted leases through the real webhook and API server
(docs/tokens.md, "Superseded generations" and "Retention").

The harness (:mod:`.fence_harness`) plays the controller: grants, force releases and the
lease's deletion go straight to the store, as the controller's handlers do; the recorder
advances the mark from committed writes.
"""

from __future__ import annotations

import pytest

from fencedlease.authority.types import Acquired, LeaseKey, Released
from fencedlease.models import GROUP, LEASES, VERSION

from .fence_harness import FenceHarness, artifact, publish

pytestmark = pytest.mark.timeout(90)

HOLD = "fence-test.fencedlease.io/hold"
"""A finalizer of someone else's that keeps a deleted FencedLease around (deletionTimestamp
set) after the controller's own finalizer step moved its tokens into the retention window."""


async def superseded(fence: FenceHarness, lease: str) -> tuple[str, Acquired, Acquired]:
    """A new namespace where ``worker-a``'s generation a1 of ``lease`` wrote artifact ``cat``
    (committed: the mark is a1), was force-released, and ``worker-b`` was granted a2."""
    ns = await fence.namespace()
    await fence.lease(ns, lease)
    a1 = await fence.grant(ns, lease, "worker-a")
    ok = await publish(fence.custom, artifact(ns, "cat", lease, a1.token, "a1.tmp"))
    assert ok.ok, ok.message
    await fence.marked(ns, lease, a1.token)
    released = await fence.store.force_release(ns, lease, a1.lease_id)
    assert isinstance(released, Released) and released.forced
    return ns, a1, await fence.grant(ns, lease, "worker-b")


async def test_a_force_release_and_a_new_grant_supersede_the_old_token_at_once(
    fence: FenceHarness,
) -> None:
    """Issue 36: written with token a1, force-release, a1's successor a2 granted: a write with
    a1 to a resource that a2 never reached was still admitted."""
    ns, a1, a2 = await superseded(fence, "job")

    for name in ("other", "cat"):  # a resource a2 never wrote, and the one a1 wrote
        denied = await publish(fence.custom, artifact(ns, name, "job", a1.token, "late.tmp"))
        assert not denied.ok and denied.status == 403, denied.message
        expected = f"stale_fence: token {a1.token} was superseded by the newer grant {a2.token}"
        assert expected in denied.message, denied.message
    ok = await publish(fence.custom, artifact(ns, "other", "job", a2.token, "a2.tmp"))
    assert ok.ok, ok.message


async def test_no_token_of_a_deleted_lease_is_admitted_after_the_sweep(
    fence: FenceHarness,
) -> None:
    """Issue 31, defect 1: a2 written to a new artifact of a lease being deleted was admitted;
    recording it wrote the mark back without the retention window's etcd lease, the legacy
    sweep pruned that mark while the old records stayed, and a1 (below a2) was admitted."""
    ns, a1, a2 = await superseded(fence, "lx")

    # Someone else's finalizer holds the lease; the controller's step moves its records out.
    await fence.kubectl(
        "patch", "fencedleases", "lx", "-n", ns, "--type=merge",
        "-p", f'{{"metadata":{{"finalizers":["{HOLD}"]}}}}',
    )  # fmt: skip
    await fence.kubectl("delete", "fencedleases", "lx", "-n", ns, "--wait=false")
    await fence.store.delete(ns, "lx")

    denied = await publish(fence.custom, artifact(ns, "fresh", "lx", a2.token, "a2.tmp"))
    assert not denied.ok and denied.status == 403, denied.message
    assert "is being deleted" in denied.message, denied.message

    # A write of a2 admitted just before the deletion commits just after it: the mark covers
    # it and stays in the window with the records, so the sweep keeps it.
    advance = await fence.store.record_commit(ns, "lx", a2.token)
    assert advance.advanced and advance.verified
    mark_kv = await fence.store.client.get(fence.store._hwm_key(LeaseKey(ns, "lx")))
    assert mark_kv is not None and mark_kv.lease != 0, "the mark left the retention window"
    await fence.store.sweep_legacy()
    mark = await fence.hwm(ns, "lx")
    assert mark is not None and mark.token == a2.token

    # The lease goes, and comes back under the same name: no old token is admitted.
    await fence.kubectl(
        "patch", "fencedleases", "lx", "-n", ns, "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}',
    )  # fmt: skip
    await fence.kubectl("wait", "--for=delete", "fencedleases/lx", "-n", ns, "--timeout=20s")
    await fence.lease(ns, "lx")
    for old in (a1.token, a2.token):
        denied = await publish(fence.custom, artifact(ns, f"again-{old}", "lx", old, "x.tmp"))
        assert not denied.ok and denied.status == 403, denied.message
        assert "stale_fence" in denied.message, denied.message
    a3 = await fence.grant(ns, "lx", "worker-c")
    ok = await publish(fence.custom, artifact(ns, "again", "lx", a3.token, "a3.tmp"))
    assert ok.ok, ok.message
    lease = await fence.custom.get_namespaced_custom_object(GROUP, VERSION, ns, LEASES, "lx")
    assert lease["metadata"].get("deletionTimestamp") is None
