"""Pure decisions of backup and restore: snapshot names, retention, the revision bump.

Fencing tokens are etcd revisions. A snapshot restored as is restarts etcd at the snapshot's
revision, below tokens already issued and accepted by fences; the restore must therefore jump
the revision above every token that may have been issued since (``etcdutl snapshot restore
--bump-revision``, docs/tokens.md, "Restore"). :func:`choose_bump` picks that jump.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: The bump when nothing tells a higher floor: a billion revisions, far more than any etcd
#: writes between two scheduled snapshots, and still 9e9 restores away from int64's end.
DEFAULT_BUMP = 1_000_000_000

#: etcd's snapshot stream is the bbolt file, in 512-byte pages, plus a SHA-256 of it.
_PAGE = 512
_DIGEST = hashlib.sha256().digest_size

_STAMP = "%Y%m%dT%H%M%SZ"


class SnapshotError(ValueError):
    """A file is not a whole etcd snapshot."""


def snapshot_name(prefix: str, when: dt.datetime) -> str:
    """``<prefix>-<UTC time>.db``: names sort in time order."""
    return f"{prefix}-{when.astimezone(dt.UTC).strftime(_STAMP)}.db"


def _name_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}-(\d{{8}}T\d{{6}}Z)(?:-(\d+))?\.db")


def unique_name(prefix: str, when: dt.datetime, existing: Iterable[str]) -> str:
    """:func:`snapshot_name`, with ``-N`` added when two snapshots share a second."""
    taken = set(existing)
    name = snapshot_name(prefix, when)
    n = 1
    while name in taken:
        name = snapshot_name(prefix, when).removesuffix(".db") + f"-{n}.db"
        n += 1
    return name


def to_delete(names: Iterable[str], prefix: str, keep: int) -> list[str]:
    """The snapshots of ``prefix`` beyond the newest ``keep``, oldest first (other files, and
    snapshots of another prefix, are never touched)."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    pattern = _name_pattern(prefix)
    ours: list[tuple[tuple[str, int], str]] = []
    for name in names:
        match = pattern.fullmatch(name)
        if match:
            ours.append(((match.group(1), int(match.group(2) or 0)), name))
    ours.sort(reverse=True)
    return [name for _, name in reversed(ours[keep:])]


@dataclass
class SnapshotCheck:
    """Incremental check of a snapshot's SHA-256 trailer: :meth:`update` with its bytes in
    order, then :meth:`verify`."""

    size: int = 0
    _hash: Any = field(default_factory=hashlib.sha256)
    _tail: bytes = b""

    def update(self, chunk: bytes) -> None:
        data = self._tail + chunk
        body, self._tail = data[:-_DIGEST], data[-_DIGEST:]
        self._hash.update(body)
        self.size += len(chunk)

    def verify(self) -> None:
        """Raise :class:`SnapshotError` unless the bytes are a whole snapshot."""
        if self.size < _PAGE + _DIGEST or (self.size - _DIGEST) % _PAGE:
            raise SnapshotError(
                f"{self.size} bytes is not a whole etcd snapshot (pages of {_PAGE} bytes "
                f"plus a {_DIGEST}-byte SHA-256): truncated or not a snapshot"
            )
        if self._hash.digest() != self._tail:
            raise SnapshotError("the snapshot's SHA-256 does not match its content: corrupted")


def choose_bump(requested: int, floor: int, snapshot_revision: int | None = None) -> int:
    """The ``--bump-revision`` that puts the restored etcd's next revision above ``floor``.

    ``floor`` is the highest token known to have been issued or accepted (0: none known).
    ``requested`` is kept when it is enough; otherwise the bump grows to ``floor`` plus
    :data:`DEFAULT_BUMP` (tokens issued after the floor was read are covered by that margin).
    Without the snapshot's revision the bump alone must exceed the floor.
    """
    if requested < 1:
        raise ValueError("the revision bump must be positive")
    if floor < 0:
        raise ValueError("the token floor cannot be negative")
    base = snapshot_revision or 0
    if base + requested > floor:
        return requested
    return floor - base + DEFAULT_BUMP


@dataclass(frozen=True)
class Member:
    """One etcd member to restore: its name, peer URL and (new, empty) data directory."""

    name: str
    peer_url: str
    data_dir: str


def restore_argv(
    etcdutl: str,
    snapshot: str,
    member: Member,
    members: list[Member],
    cluster_token: str,
    bump: int,
) -> list[str]:
    """The ``etcdutl snapshot restore`` command line of one member (all members of a cluster
    restore the same snapshot with the same bump)."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    return [
        etcdutl,
        "snapshot",
        "restore",
        snapshot,
        f"--data-dir={member.data_dir}",
        f"--name={member.name}",
        f"--initial-cluster={initial}",
        f"--initial-advertise-peer-urls={member.peer_url}",
        f"--initial-cluster-token={cluster_token}",
        f"--bump-revision={bump}",
        # The skipped revisions never existed: a watcher asking for one is told "compacted"
        # instead of silently seeing nothing.
        "--mark-compacted",
    ]


def max_token(objects: Iterable[dict[str, object]]) -> int:
    """The highest fencing token shown by FencedLease statuses and FencedArtifact specs."""
    best = 0
    for obj in objects:
        for part in ("status", "spec"):
            section = obj.get(part)
            if isinstance(section, dict):
                token = section.get("fencingToken")
                if isinstance(token, int) and not isinstance(token, bool) and token > best:
                    best = token
    return best
