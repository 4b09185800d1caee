"""Retention in etcd (rule: :mod:`fencedlease.authority.retention`, docs/tokens.md,
"Retention"): a deleted lease hands its token records and mark to the retention window, and
the legacy sweep applies the rule to records written before it existed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fencedlease.authority import retention as retain
from fencedlease.authority.types import (
    LeaseKey,
    StoredLease,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.store import ops
from fencedlease.store.base import StoreBase, _latency, _same_version, _token_of_key


class RetentionSweeps(StoreBase):
    """Deletion into the retention window, and the legacy sweep (mixin of ``EtcdStore``)."""

    async def delete(self, namespace: str, name: str) -> None:
        """The FencedLease was deleted: drop its record, and hand its token records and its
        high-water mark to the retention window (docs/tokens.md, "Retention"): they are
        attached to the etcd lease of the current time bucket, stay readable for at least
        ``retention.deleted_window_seconds`` (a re-created lease of the same name keeps
        rejecting old tokens), and then go together.  A grant version's token record is
        written in the deleting transaction, attached to the same etcd lease."""
        key = LeaseKey(namespace, name)
        with _latency("delete").time():
            current = self._known.get(key)
            if current is None:
                current, _ = await self._read_lease("delete", key)
            retried = False
            for _ in range(self._max_retries):
                try:
                    done, current = await self._delete_once(key, current)
                except StoreUnavailable:
                    # The bucket's etcd lease may be gone (revoked, or etcd restored): grant
                    # a new one and try once more.
                    if self._bucket_lease is None or retried:
                        raise
                    self._bucket_lease, retried = None, True
                    continue
                if done:
                    break
            else:
                raise StoreUnavailable("contention", f"lease {key} kept changing while deleting")
        self._forget(key)

    async def _delete_once(
        self, key: LeaseKey, current: StoredLease | None
    ) -> tuple[bool, StoredLease | None]:
        """Read the mark and the retained records of version ``current``, then delete the
        lease key and re-attach them, conditional on both keys being unchanged.  ``(False,
        what is there now)`` when something changed meanwhile."""
        raw, hwm_raw = self._lease_key(key), self._hwm_key(key)
        tokens = retain.deleted_tokens(current) if current is not None else ()
        found = await self._txn(
            "delete",
            [],
            [ops.get(raw), ops.get(hwm_raw), *(ops.get(self._token_key(t)) for t in tokens)],
        )
        lease_kv, hwm_kv, *token_kvs = (ops.range_kv(r) for r in found.responses)
        now = self._stored(lease_kv) if lease_kv is not None else None
        if not (now is None and current is None) and not _same_version(now, current):
            return False, now
        if current is None and hwm_kv is None:
            return True, None
        window = await self._window_lease()
        compare = [
            ops.mod_is(raw, current.mod_revision) if current is not None else ops.absent(raw),
            ops.mod_is(hwm_raw, hwm_kv.mod_revision) if hwm_kv is not None else ops.absent(hwm_raw),
        ]
        success: list[ops.Op] = [ops.delete(raw)] if current is not None else []
        for token, kv in zip(tokens, token_kvs, strict=True):
            if kv is not None:
                if (
                    current is not None
                    and current.record.token is None
                    and (token == current.mod_revision)
                ):
                    continue  # a record of an older grant at this revision: leave it alone
                success.append(ops.put_leased(kv.key, kv.value, window))
            elif (
                current is not None
                and current.record.token is None
                and (token == current.mod_revision)
            ):
                record = current.record
                grant = TokenGrant(
                    key.namespace, key.name, record.lease_id, record.holder, record.holder_uid
                )
                token_raw = self._token_key(token)
                compare.append(ops.absent(token_raw))
                success.append(ops.put_leased(token_raw, grant.to_json(), window))
        if hwm_kv is not None:
            success.append(ops.put_leased(hwm_raw, hwm_kv.value, window))
        response = await self._txn("delete", compare, success, [ops.get(raw)])
        if response.succeeded:
            return True, None
        kv = ops.range_kv(response.responses[0])
        return False, (self._stored(kv) if kv is not None else None)

    async def sweep_legacy(
        self,
        *,
        page: int = 500,
        pause: Callable[[int], Awaitable[None]] | None = None,
        progress: Callable[[retain.SweepReport], None] | None = None,
    ) -> retain.SweepReport:
        """Apply the retention rule to token records and marks written before it existed
        (docs/tokens.md, "Retention"): one pass over ``<p>/tokens/`` and ``<p>/hwm/``, in
        pages of ``page`` keys, deciding each key with :func:`retain.sweep_token` /
        :func:`retain.sweep_mark` on its lease key as read after the page.

        Every deletion is conditional on the key and its lease key being the versions the
        decision read (``mod_revision``, or absence), so a concurrent grant, recording or
        deletion wins and the key waits for the next sweep (counted as ``changed``).
        ``pause(deleted)`` is awaited after each page (pacing: the sweep shares etcd with
        grants and fence checks); ``progress`` gets the running totals after each page.

        Raises :class:`StoreUnavailable` on etcd errors (the totals so far are lost; a
        sweep starts over harmlessly: it only deletes what the rule says)."""
        report = retain.SweepReport()
        # The lease keys with token records left after the token pass: their marks stay
        # (pruning a mark while a record of its lease stays could admit that token).
        survivors: set[bytes] = set()
        for kind in ("tokens", "hwm"):
            prefix = self._key(kind) + b"/"
            start, end = prefix, ops.prefix_end(prefix)
            while True:
                scan = ops.scan(start, end, limit=page)
                found = (await self._txn("sweep", [], [scan])).responses[0].response_range
                kvs = list(found.kvs)
                if not kvs:
                    break
                deleted = await self._sweep_page(kind, kvs, report, survivors)
                if progress is not None:
                    progress(report)
                if not found.more:
                    break
                start = kvs[-1].key + b"\0"
                if pause is not None:
                    await pause(deleted)
        return report

    async def _sweep_page(
        self, kind: str, kvs: list[Any], report: retain.SweepReport, survivors: set[bytes]
    ) -> int:
        """Decide and delete one page of ``kind`` keys; the number deleted.  Token pages add
        the lease keys whose records stay to ``survivors``; mark pages consult it."""
        owners: dict[bytes, bytes] = {}  # key -> its lease key
        for kv in kvs:
            report.scanned += 1
            try:
                if kind == "tokens":
                    _token_of_key(kv.key)
                    grant = TokenGrant.from_json(kv.value)
                    namespace, name = grant.namespace, grant.name
                else:
                    namespace, name = kv.key.decode().rsplit("/", 2)[-2:]
                owners[kv.key] = self._key("leases", namespace, name)
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                report.malformed += 1  # not ours to judge: left alone
        leases = sorted(set(owners.values()))
        versions: dict[bytes, Any | None] = {}
        for some in ops.chunks(leases, _SWEEP_CHUNK):
            read = await self._txn("sweep", [], [ops.get(raw) for raw in some])
            for raw, r in zip(some, read.responses, strict=True):
                versions[raw] = ops.range_kv(r)
        doomed: dict[bytes, list[Any]] = {}
        for kv in kvs:
            owner = owners.get(kv.key)
            if owner is None:
                continue
            lease_kv = versions[owner]
            if kind == "tokens":
                try:
                    lease = self._stored(lease_kv) if lease_kv is not None else None
                except StoreUnavailable:
                    report.malformed += 1  # a lease record we cannot read: judge nothing
                    survivors.add(owner)
                    continue
                token = _token_of_key(kv.key)
                verdict = retain.sweep_token(
                    token, kv.lease != 0, lease, self.retention.generations
                )
            else:
                verdict = retain.sweep_mark(kv.lease != 0, lease_kv is not None, owner in survivors)
            if verdict is retain.Sweep.PRUNE:
                doomed.setdefault(owner, []).append(kv)
            else:
                report.kept += 1
                if kind == "tokens":
                    survivors.add(owner)
        deleted = 0
        for owner, doomed_kvs in doomed.items():
            lease_kv = versions[owner]
            guard = (
                ops.mod_is(owner, lease_kv.mod_revision)
                if lease_kv is not None
                else ops.absent(owner)
            )
            for chunk in ops.chunks(doomed_kvs, _SWEEP_CHUNK):
                response = await self._txn(
                    "sweep",
                    [guard, *(ops.mod_is(kv.key, kv.mod_revision) for kv in chunk)],
                    [ops.delete(kv.key) for kv in chunk],
                )
                if response.succeeded:
                    report.pruned += len(chunk)
                    deleted += len(chunk)
                else:
                    report.changed += len(chunk)
                    if kind == "tokens":
                        survivors.add(owner)
        return deleted


_SWEEP_CHUNK = 64
"""Keys per sweep transaction (etcd refuses more than ``--max-txn-ops``, 128 by default)."""
