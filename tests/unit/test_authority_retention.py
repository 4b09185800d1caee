"""The retention rule (docs/tokens.md, "Retention"), pure and on the in-memory model.

Pruning only ever removes a token record, and a token without one is refused: a pruned token
is never accepted again, not even by a lease re-created under the same name.  Fake clock, no
sleeps.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fencedlease.authority import retention
from fencedlease.authority.memory import AsyncMemoryStore, MemoryAuthority, MemoryKV
from fencedlease.authority.types import (
    Acquired,
    FenceCode,
    LeaseKey,
    LeaseRecord,
    Released,
    StoredLease,
)
from fencedlease.controller.artifacts import ArtifactKey, ArtifactObject, ArtifactRecorder
from tests.fakes import FakeClock, RecordingKube

NS = "default"
WINDOW = 600.0


def test_retain_keeps_the_newest_and_prunes_the_oldest() -> None:
    assert retention.retain((), 10, 3) == ((10,), ())
    assert retention.retain((10, 20), 30, 3) == ((10, 20, 30), ())
    assert retention.retain((10, 20, 30), 40, 3) == ((20, 30, 40), (10,))
    assert retention.retain((10, 20, 30), 30, 3) == ((10, 20, 30), ())  # recorded once
    # A smaller K (the setting was lowered) prunes the surplus in one transaction.
    assert retention.retain((10, 20, 30, 40), 50, 2) == ((40, 50), (10, 20, 30))


@given(
    st.lists(st.integers(1, 10**9), unique=True, max_size=40).map(lambda t: sorted(t)),
    st.integers(1, 20),
)
def test_retain_never_keeps_more_than_k_and_prunes_only_older_tokens(
    tokens: list[int], k: int
) -> None:
    kept: tuple[int, ...] = ()
    gone: list[int] = []
    for token in tokens:
        kept, pruned = retention.retain(kept, token, k)
        assert len(kept) <= k and kept[-1] == token
        assert all(p < min(kept) for p in pruned)
        gone.extend(pruned)
    assert sorted([*gone, *kept]) == tokens  # nothing lost track of, nothing pruned twice


def _record(token: int | None, retained: tuple[int, ...] = ()) -> LeaseRecord:
    return LeaseRecord("id", "pod", 10.0, token, retained=retained)


def test_plan_records_records_a_grant_version_and_prunes_in_the_same_write() -> None:
    grant_version = StoredLease(_record(None, (10, 20, 30)), 40)
    plan = retention.plan_records(grant_version, grant_version.record.renewed(40), 3)
    assert (plan.token, plan.pruned, plan.record.retained) == (40, (10,), (20, 30, 40))
    # A version whose token is explicit was recorded already: the list is only carried over.
    renewed = StoredLease(plan.record, 41)
    again = retention.plan_records(renewed, renewed.record.renewed(40), 3)
    assert (again.token, again.pruned, again.record.retained) == (None, (), (20, 30, 40))
    # A new grant (acquire writes a fresh record) carries the list of the version it replaces.
    fresh = retention.plan_records(renewed, _record(None), 3)
    assert fresh.record.retained == (20, 30, 40) and fresh.token is None
    # A grant version whose record already exists (etcd reuses revisions) is not listed.
    taken = retention.plan_records(grant_version, _record(None), 3, taken=40)
    assert (taken.token, taken.pruned, taken.record.retained) == (None, (), (10, 20, 30))
    assert retention.deleted_tokens(grant_version) == (10, 20, 30, 40)
    assert retention.deleted_tokens(renewed) == (20, 30, 40)


@given(st.floats(0, 10**7), st.floats(1, 10**5))
def test_a_bucket_lease_keeps_what_is_attached_for_one_to_two_windows(
    now: float, window: float
) -> None:
    b = retention.bucket(now, window)
    ends = now + b.ttl_seconds
    bucket_end = (b.index + 1) * window
    # Attached at any time t in [now, bucket end): lives ends - t, at least one window.
    assert ends - bucket_end >= window - 1e-6
    assert ends - now <= 2 * window + 1
    assert retention.expires_at(now, window) - now >= window


def test_retention_parameters_are_validated() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        retention.Retention(generations=0)
    with pytest.raises(ValueError, match="positive"):
        retention.Retention(deleted_window_seconds=0)


# ------------------------------------------------------------------ the in-memory model


def model(k: int = 3) -> tuple[FakeClock, MemoryKV, MemoryAuthority]:
    clock = FakeClock()
    kv = MemoryKV(revision=40, retention=retention.Retention(k, WINDOW))
    return clock, kv, MemoryAuthority(kv, clock=clock)


def handovers(auth: MemoryAuthority, name: str, count: int) -> list[Acquired]:
    out = []
    for i in range(count):
        grant = auth.acquire(NS, name, f"pod-{i}", 10.0)
        assert isinstance(grant, Acquired)
        assert isinstance(auth.release(NS, name, grant.lease_id, grant.token), Released)
        out.append(grant)
    return out


def test_a_pruned_token_is_refused_and_never_accepted() -> None:
    _, kv, auth = model(k=3)
    grants = handovers(auth, "job", 8)
    assert len(kv.grants) == 3  # bounded: the last K generations
    # No write was ever fenced (no mark): before retention, every old token was "applied".
    for old in grants[:5]:
        result = auth.fence(NS, "job", old.token, dry_run=True)
        assert result.code is FenceCode.UNKNOWN_TOKEN, result
        assert auth.record_commit(NS, "job", old.token).verified is False
    for kept in grants[5:]:
        assert auth.fence(NS, "job", kept.token, dry_run=True).code is FenceCode.APPLIED
    assert auth.fence(NS, "job", grants[-1].token).code is FenceCode.APPLIED
    # Recent generations keep their distinctions: below the mark is stale, not unknown.
    assert auth.fence(NS, "job", grants[-2].token).code is FenceCode.STALE_FENCE
    assert auth.high_water_mark(NS, "job").token == grants[-1].token  # type: ignore[union-attr]


def test_the_current_generation_is_always_known() -> None:
    _, _, auth = model(k=1)
    handovers(auth, "job", 5)
    current = auth.acquire(NS, "job", "pod-now", 10.0)
    assert isinstance(current, Acquired)
    assert auth.fence(NS, "job", current.token, holder="pod-now").code is FenceCode.APPLIED


def test_delete_and_recreate_never_accept_an_old_token() -> None:
    clock, kv, auth = model(k=3)
    old = handovers(auth, "job", 4)
    assert auth.fence(NS, "job", old[-1].token).code is FenceCode.APPLIED
    other = handovers(auth, "other", 1)[0]
    auth.delete(NS, "job")
    # Inside the window: the old records and the mark stay (the answers of today).
    new = auth.acquire(NS, "job", "pod-new", 10.0)
    assert isinstance(new, Acquired)
    assert auth.fence(NS, "job", old[-2].token, dry_run=True).code is FenceCode.STALE_FENCE
    assert auth.fence(NS, "job", other.token, dry_run=True).code is FenceCode.LEASE_MISMATCH
    assert auth.fence(NS, "job", old[0].token, dry_run=True).code is FenceCode.UNKNOWN_TOKEN
    # After the window: the old records and the mark are gone together; old tokens unknown.
    clock.advance(2 * WINDOW)
    assert auth.high_water_mark(NS, "job") is None
    for token in (g.token for g in old):
        assert auth.fence(NS, "job", token, dry_run=True).code is FenceCode.UNKNOWN_TOKEN
    assert auth.fence(NS, "job", new.token).code is FenceCode.APPLIED
    assert auth.fence(NS, "other", other.token, dry_run=True).code is FenceCode.APPLIED
    assert set(kv.grants) == {new.token, other.token}
    assert not kv.expiring


def test_a_recreated_lease_keeps_its_own_mark_past_the_old_window() -> None:
    clock, kv, auth = model(k=3)
    old = handovers(auth, "job", 2)
    assert auth.fence(NS, "job", old[-1].token).code is FenceCode.APPLIED
    auth.delete(NS, "job")
    new = auth.acquire(NS, "job", "pod-new", 10.0)
    assert isinstance(new, Acquired)
    assert auth.record_commit(NS, "job", new.token).advanced  # the mark is the new lease's
    clock.advance(2 * WINDOW)
    assert auth.high_water_mark(NS, "job").token == new.token  # type: ignore[union-attr]
    assert auth.fence(NS, "job", old[-1].token, dry_run=True).code is FenceCode.UNKNOWN_TOKEN
    assert LeaseKey(NS, "job") in kv.hwms


# ------------------------------------------- committed artifacts whose record was pruned


def test_a_pruned_but_covered_token_is_retired_not_unverified() -> None:
    _, _, auth = model(k=2)
    grants = handovers(auth, "job", 2)
    for g in grants:
        assert auth.record_commit(NS, "job", g.token).advanced
    more = handovers(auth, "job", 3)
    assert auth.record_commit(NS, "job", more[-1].token).advanced
    old = auth.record_commit(NS, "job", grants[0].token)  # an old artifact, re-listed
    assert (old.verified, old.advanced, old.retired) == (False, False, True)
    # Not covered by the mark, or newer than the records kept: still unverified.
    forged = auth.record_commit(NS, "job", more[-1].token + 1)
    assert (forged.verified, forged.retired) == (False, False)
    other = handovers(auth, "other", 1)[0]
    mismatch = auth.record_commit(NS, "job", other.token)
    assert (mismatch.verified, mismatch.retired) == (False, False)


async def test_the_recorder_does_not_report_an_old_artifact_whose_record_was_pruned() -> None:
    clock = FakeClock()
    kv = MemoryKV(revision=40, retention=retention.Retention(2, WINDOW))
    store = AsyncMemoryStore(MemoryAuthority(kv, clock=clock))
    kube = RecordingKube()
    recorder = ArtifactRecorder(store, kube)
    first = handovers(store.auth, "job", 1)[0]

    def artifact(name: str, token: int) -> ArtifactObject:
        return ArtifactObject(
            NS, name, f"uid-{name}", "1", 1, "job", token, "s3://x", token, ("f",), False
        )

    old = artifact("july", first.token)
    recorder.upsert(old)
    await recorder.reconcile(old.key)
    later = handovers(store.auth, "job", 3)
    recorder.upsert(artifact("august", later[-1].token))
    await recorder.reconcile(ArtifactKey(NS, "august"))
    await recorder.reconcile(old.key)  # re-listed after a restart: its record is pruned
    assert "UnverifiedToken" not in kube.reasons()
    forged = artifact("forged", later[-1].token + 1)
    recorder.upsert(forged)
    await recorder.reconcile(forged.key)
    # Its token, and the acceptedFence its status claims for it (issue 31: cleared).
    assert kube.reasons().count("UnverifiedToken") == 2


def test_a_mark_recorded_after_the_delete_stays_in_the_window() -> None:
    """Issue 31: a write admitted before the deletion commits after it; the mark it moves stays
    in the retention window (the model of ``EtcdStore.record_commit``), never permanent
    without its lease, and goes with the deleted lease's records."""
    clock, kv, auth = model(k=3)
    old = handovers(auth, "job", 2)
    assert auth.record_commit(NS, "job", old[0].token).advanced
    auth.delete(NS, "job")
    assert auth.record_commit(NS, "job", old[-1].token).advanced
    assert LeaseKey(NS, "job") in kv.expiring
    assert auth.high_water_mark(NS, "job").token == old[-1].token  # type: ignore[union-attr]
    clock.advance(2 * WINDOW)
    assert auth.high_water_mark(NS, "job") is None
    assert not kv.grants and not kv.expiring
