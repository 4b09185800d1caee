"""The fence paths of the store: the admission webhook's one read (:meth:`grant_and_mark`:
the token's grant, the domain's mark and its current generation in one transaction) and the
controller's :meth:`record_commit` (the mark follows committed writes).  docs/tokens.md,
"The fence check and the high-water mark".
"""

from __future__ import annotations

from typing import Any

from fencedlease.authority import fence as fencing
from fencedlease.authority import retention as retain
from fencedlease.authority.types import (
    FenceRead,
    Generation,
    HighWaterMark,
    LeaseKey,
    LeaseRecord,
    MarkAdvance,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.store import ops
from fencedlease.store.base import StoreBase, _latency, _parsed


class FenceReads(StoreBase):
    """The grant, mark and generation reads, and the mark's advance (mixin of ``EtcdStore``)."""

    def _grant_from(
        self, token: int, token_kv: Any | None, lease_kv: Any | None
    ) -> TokenGrant | None:
        """What ``token`` was issued for, from its token record or, while the lease key is
        still at the grant's own version (``token: null`` and mod_revision == token), from
        the lease record itself."""
        if token_kv is not None:
            return TokenGrant.from_json(token_kv.value)
        if lease_kv is None or lease_kv.mod_revision != token:
            return None
        record = LeaseRecord.from_json(lease_kv.value)
        if record.token is not None:
            return None
        namespace, name = lease_kv.key.rsplit(b"/", 2)[-2:]
        return TokenGrant(
            namespace.decode(), name.decode(), record.lease_id, record.holder, record.holder_uid
        )

    async def _find_grant(self, token: int) -> TokenGrant | None:
        """``token``'s grant in any lease, one transaction: its token record, or the lease key
        whose current version is that grant (a range over the lease keys filtered by
        mod_revision: a scan, so only for refusals and queries, never the accepting path)."""
        token_raw, leases = self._token_key(token), self._key("leases") + b"/"
        scan = ops.scan(
            leases, ops.prefix_end(leases), min_mod_revision=token, max_mod_revision=token
        )
        response = await self._txn("fence", [], [ops.get(token_raw), scan])
        token_kv = ops.range_kv(response.responses[0])
        for lease_kv in response.responses[1].response_range.kvs:
            grant = self._grant_from(token, token_kv, lease_kv)
            if grant is not None:
                return grant
        return self._grant_from(token, token_kv, None)

    async def high_water_mark(self, namespace: str, name: str) -> HighWaterMark | None:
        """The fencing domain's high-water mark (``None``: nothing accepted yet).

        Raises :class:`StoreUnavailable` on etcd errors (as do the other plain queries)."""
        raw = self._hwm_key(LeaseKey(namespace, name))
        with _latency("read").time():
            found = await self._rpc("read", lambda c: c.get(raw))
        if found is None:
            return None
        with _parsed(LeaseKey(namespace, name)):
            return HighWaterMark.from_json(found.value)

    async def _grant_and_mark(
        self, token: int, domain: LeaseKey
    ) -> tuple[FenceRead, Any | None, Any | None]:
        """The token's grant, the domain's mark and its current generation (one transaction),
        with the mark's and the lease key's raw key-values (``record_commit`` compares on the
        mark and keeps its etcd lease).

        The grant is the token record, or the domain's lease key while it is still at the
        grant's own version (its token record is written when that version is replaced).
        Only a token issued for no visible grant of this domain costs a second round trip,
        which tells ``lease_mismatch`` from ``unknown_token``.  A record that does not parse
        raises ``StoreUnavailable`` (``corrupt``): it is never skipped, nor trusted."""
        token_raw, hwm_raw = self._token_key(token), self._hwm_key(domain)
        # Not ``_lease_key``: its cache is for the leases this replica renews, and the names
        # asked about here come from admission requests.
        lease_raw = self._key("leases", domain.namespace, domain.name)
        response = await self._txn(
            "fence", [], [ops.get(token_raw), ops.get(hwm_raw), ops.get(lease_raw)]
        )
        token_kv, hwm_kv, lease_kv = (ops.range_kv(r) for r in response.responses)
        with _parsed(domain):
            grant = self._grant_from(token, token_kv, lease_kv)
            if grant is None:
                grant = await self._find_grant(token)
            hwm = HighWaterMark.from_json(hwm_kv.value) if hwm_kv is not None else None
            generation = Generation(
                LeaseRecord.from_json(lease_kv.value).token_at(lease_kv.mod_revision)
                if lease_kv is not None
                else None
            )
        return FenceRead(grant, hwm, generation), hwm_kv, lease_kv

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        """What ``token`` was issued for, lease ``namespace/name``'s high-water mark and its
        current generation, read in one etcd transaction (the admission webhook's only store
        call).

        Raises :class:`StoreUnavailable` on etcd errors and on records that do not parse."""
        with _latency("fence").time():
            read, _, _ = await self._grant_and_mark(token, LeaseKey(namespace, name))
        return read

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        """A write carrying ``token`` was committed to an artifact of lease ``namespace/name``
        (the controller saw it stored): advance the domain's high-water mark to cover it.

        Only a token issued for this lease moves the mark (an artifact written while the
        webhook was bypassed is reported, not trusted).  Idempotent; never moves backwards.
        While the lease key is gone (the lease was deleted: its records and mark are in the
        retention window), the advanced mark is attached to the window as well, never written
        back permanent: a permanent mark without its lease would be pruned by the legacy
        sweep while the deleted lease's records stay (docs/tokens.md, "Retention").
        Raises :class:`StoreUnavailable` on etcd errors.
        """
        domain = LeaseKey(namespace, name)
        hwm_raw = self._hwm_key(domain)
        with _latency("record_commit").time():
            for _ in range(self._max_retries):
                read, hwm_kv, lease_kv = await self._grant_and_mark(token, domain)
                grant, hwm = read.grant, read.mark
                current = hwm.token if hwm else None
                refusal = fencing.check_grant(grant, domain)
                if refusal is not None:
                    with _parsed(domain):
                        retained = (
                            LeaseRecord.from_json(lease_kv.value).retained if lease_kv else ()
                        )
                    retired = retain.retired(
                        grant is not None, token, current, retained, self.retention.generations
                    )
                    return MarkAdvance(token, current, False, verified=False, retired=retired)
                new_hwm = fencing.committed(hwm, token)
                if new_hwm is None:
                    return MarkAdvance(token, current, advanced=False, verified=True)
                revision = hwm_kv.mod_revision if hwm_kv is not None else None
                window = await self._window_lease() if lease_kv is None else None
                try:
                    if await self._advance(hwm_raw, revision, new_hwm, window):
                        return MarkAdvance(token, token, advanced=True, verified=True)
                except StoreUnavailable:
                    # The bucket's etcd lease may be gone (revoked, etcd restored): grant a
                    # new one next round, as ``delete`` does.
                    if window is None or self._bucket_lease is None:
                        raise
                    self._bucket_lease = None
        raise StoreUnavailable("contention", f"high-water mark of {domain} kept changing")

    async def _advance(
        self, raw: bytes, expected: int | None, new_hwm: HighWaterMark, window: int | None = None
    ) -> bool:
        """Write ``new_hwm`` if the mark is still at ``expected``; attached to etcd lease
        ``window`` when given (the deleted-lease retention window), else permanent."""
        guard = ops.absent(raw) if expected is None else ops.mod_is(raw, expected)
        value = new_hwm.to_json()
        put = ops.put(raw, value) if window is None else ops.put_leased(raw, value, window)
        response = await self._txn("fence", [guard], [put])
        return bool(response.succeeded)
