"""``fencedlease etcd backups rotate`` and ``fencedlease etcd restore``: files and exit codes.

The restore itself runs against the real etcdutl in tests/integration/test_etcd_backup_restore.py.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fencedlease.cli import main


def _snapshot(path: Path) -> Path:
    body = b"\x01" * 1024
    path.write_bytes(body + hashlib.sha256(body).digest())
    return path


def _rotate(directory: Path, keep: int = 2) -> int:
    return main(
        ["etcd", "backups", "rotate", f"--dir={directory}", "--prefix=fl-etcd", f"--keep={keep}"]
    )


def test_rotate_names_the_snapshot_and_keeps_the_newest(tmp_path: Path) -> None:
    old = [
        "fl-etcd-20200101T000000Z.db",
        "fl-etcd-20200102T000000Z.db",
        "fl-etcd-20200103T000000Z.db",
    ]
    for name in old:
        _snapshot(tmp_path / name)
    (tmp_path / "README").write_text("not a snapshot")
    _snapshot(tmp_path / ".incoming.db")
    assert _rotate(tmp_path) == 0
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not (tmp_path / ".incoming.db").exists()
    new = [n for n in left if n.startswith("fl-etcd-") and n not in old]
    assert len(new) == 1
    assert left == sorted(["README", old[2], new[0]])


def test_rotate_refuses_a_corrupted_snapshot_and_deletes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("fl-etcd-20200101T000000Z.db", "fl-etcd-20200102T000000Z.db"):
        _snapshot(tmp_path / name)
    incoming = _snapshot(tmp_path / ".incoming.db")
    incoming.write_bytes(incoming.read_bytes()[:-1] + b"\0")
    assert _rotate(tmp_path, keep=1) == 3
    assert "corrupted" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".incoming.db.corrupt",
        "fl-etcd-20200101T000000Z.db",
        "fl-etcd-20200102T000000Z.db",
    ]
    assert _rotate(tmp_path) == 3  # nothing new to keep


def test_restore_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _snapshot(tmp_path / "good.db")
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a snapshot")
    assert main(["etcd", "restore", str(bad), f"--data-dir={tmp_path / 'a'}"]) == 3
    full = tmp_path / "full"
    (full / "member").mkdir(parents=True)
    assert main(["etcd", "restore", str(good), f"--data-dir={full}"]) == 4
    missing = ["--etcdutl", str(tmp_path / "no-etcdutl")]
    assert main(["etcd", "restore", str(good), f"--data-dir={tmp_path / 'b'}", *missing]) == 5
    assert main(["etcd", "restore", str(good), "--data-dir=x", "--min-token=-1", *missing]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and all(e.startswith("error: ") for e in errors), errors


def test_restore_pods_says_what_to_do_about_lost_claims() -> None:
    from fencedlease.etcdbackup.cli import _claim_notes

    assert _claim_notes([], [], False, {"data-x-0": False}) == []
    (warning,) = _claim_notes(["data-x-1"], [], False, {})
    assert "data-x-1" in warning and "--create-missing-claims" in warning
    (created,) = _claim_notes(["data-x-1"], [], True, {})
    assert "created here" in created and "data-x-1" in created
    notes = _claim_notes([], ["data-x-2"], True, {"data-x-2": True})
    assert len(notes) == 1 and "being deleted" in notes[0] and "data-x-2" in notes[0]
    (unknown,) = _claim_notes([], [], False, "403 Forbidden")
    assert "403 Forbidden" in unknown and "must exist" in unknown
