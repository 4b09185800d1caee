"""Pure decisions of the etcd backup and restore (fencedlease.etcdbackup.plan)."""

from __future__ import annotations

import datetime as dt
import hashlib

import pytest

from fencedlease.etcdbackup import plan

T0 = dt.datetime(2026, 12, 6, 3, 7, 0, tzinfo=dt.UTC)


def _snapshot(pages: int = 2) -> bytes:
    body = bytes(range(256)) * 2 * pages
    return body + hashlib.sha256(body).digest()


def test_names_sort_in_time_order_and_never_collide() -> None:
    first = plan.snapshot_name("fl-etcd", T0)
    assert first == "fl-etcd-20261206T030700Z.db"
    later = plan.snapshot_name("fl-etcd", T0 + dt.timedelta(hours=1))
    assert sorted([later, first]) == [first, later]
    again = plan.unique_name("fl-etcd", T0, [first])
    assert again == "fl-etcd-20261206T030700Z-1.db"
    assert plan.unique_name("fl-etcd", T0, [first, again]) == "fl-etcd-20261206T030700Z-2.db"


def test_retention_deletes_the_oldest_beyond_keep_and_nothing_else() -> None:
    names = [plan.snapshot_name("fl-etcd", T0 + dt.timedelta(hours=h)) for h in range(5)]
    same_second = plan.unique_name("fl-etcd", T0 + dt.timedelta(hours=4), names)
    others = ["notes.txt", ".incoming.db", "other-etcd-20261206T030700Z.db", "fl-etcd-x.db"]
    doomed = plan.to_delete([*names, same_second, *others], "fl-etcd", keep=3)
    assert doomed == names[:3]  # oldest first; the two of hour 4 and hour 3 stay
    assert plan.to_delete(names, "fl-etcd", keep=10) == []
    with pytest.raises(ValueError):
        plan.to_delete(names, "fl-etcd", keep=0)


@pytest.mark.parametrize("chunk", [1, 7, 32, 100, 4096])
def test_a_whole_snapshot_passes_whatever_the_chunking(chunk: int) -> None:
    data = _snapshot()
    check = plan.SnapshotCheck()
    for i in range(0, len(data), chunk):
        check.update(data[i : i + chunk])
    check.verify()
    assert check.size == len(data)


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (_snapshot()[:-1], "not a whole etcd snapshot"),
        (_snapshot()[:600], "not a whole etcd snapshot"),
        (b"", "not a whole etcd snapshot"),
        (b"\xff" + _snapshot()[1:], "does not match"),
        (_snapshot()[:-1] + b"\0", "does not match"),
    ],
)
def test_a_truncated_or_corrupted_snapshot_is_refused(data: bytes, what: str) -> None:
    check = plan.SnapshotCheck()
    check.update(data)
    with pytest.raises(plan.SnapshotError, match=what):
        check.verify()


def test_the_bump_puts_the_next_revision_above_the_floor() -> None:
    # Enough already: kept.
    assert plan.choose_bump(1_000_000_000, floor=5_000, snapshot_revision=4_000) == 1_000_000_000
    # A floor above snapshot + requested (a restore after a bumped restore): raised.
    bump = plan.choose_bump(1_000, floor=3_000_000_000, snapshot_revision=4_000)
    assert 4_000 + bump > 3_000_000_000
    # Without the snapshot's revision the bump alone must exceed the floor.
    assert plan.choose_bump(10, floor=10) > 10
    with pytest.raises(ValueError):
        plan.choose_bump(0, floor=0)
    with pytest.raises(ValueError):
        plan.choose_bump(1, floor=-1)


def test_every_member_restores_with_the_same_cluster_and_bump() -> None:
    members = [plan.Member(f"e-{i}", f"https://e-{i}:2380", f"/d{i}") for i in range(3)]
    argv = plan.restore_argv("etcdutl", "s.db", members[1], members, "tok", 77)
    assert argv[:4] == ["etcdutl", "snapshot", "restore", "s.db"]
    assert "--data-dir=/d1" in argv and "--name=e-1" in argv
    assert "--initial-advertise-peer-urls=https://e-1:2380" in argv
    assert f"--initial-cluster={','.join(f'e-{i}=https://e-{i}:2380' for i in range(3))}" in argv
    assert "--bump-revision=77" in argv and "--mark-compacted" in argv


def test_max_token_reads_lease_statuses_and_artifact_specs_only() -> None:
    objects: list[dict[str, object]] = [
        {"status": {"fencingToken": 40}},
        {"spec": {"fencingToken": 55}},
        {"status": {"fencingToken": True}},
        {"status": {"fencingToken": "99"}},
        {"metadata": {"fencingToken": 1000}},
        {"status": None},
    ]
    assert plan.max_token(objects) == 55
    assert plan.max_token([]) == 0
