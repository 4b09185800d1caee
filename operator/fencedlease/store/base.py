"""What every part of the etcd store shares (:class:`StoreBase`): the connection, the key
layout, the parsed view of lease keys with this replica's observations and cache, and the
plain queries.  The parts (:mod:`.fencing`, :mod:`.retention`, the lease writes in
:mod:`.etcd`) are mixins on it, composed into :class:`~fencedlease.store.etcd.EtcdStore`.

Layout under the prefix (default ``/fencedlease``)::

    <p>/leases/<ns>/<name>   LeaseRecord JSON   (token null in the acquire write = its mod_revision)
    <p>/tokens/<token>       TokenGrant JSON    (written once per grant; the last K per lease kept)
    <p>/hwm/<ns>/<name>      HighWaterMark JSON (advanced from committed writes)

Decisions are returned as values; every call that cannot decide (lease writes, queries, the
fence read and ``record_commit``) raises :class:`~fencedlease.authority.types.StoreUnavailable`
(etcd errors translated once, in :mod:`.connection`; the restore guard; contention); a stored
record that does not parse is ``StoreUnavailable("corrupt")``, never skipped or trusted.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

from fencedlease import metrics
from fencedlease.authority import decide
from fencedlease.authority import retention as retain
from fencedlease.authority.types import (
    LeaseKey,
    LeaseRecord,
    LeaseView,
    Observation,
    StoredLease,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.settings import Settings
from fencedlease.store import ops
from fencedlease.store.connection import Connection

T = TypeVar("T")


@functools.cache
def _latency(operation: str) -> Any:
    """The latency histogram's child for ``operation`` (looked up once, not per request)."""
    return metrics.STORE_LATENCY.labels(operation)


@functools.cache
def _renewals(result: str) -> Any:
    return metrics.RENEWALS.labels(result)


@functools.cache
def _releases(kind: str, result: str) -> Any:
    return metrics.RELEASES.labels(kind, result)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class StoreBase:
    """The state and plain queries every part of the store shares.  One instance (of
    :class:`~fencedlease.store.etcd.EtcdStore`) per operator replica.

    ``clock`` is this replica's monotonic clock (the time authority); ``wall`` only produces
    the ``valid_until``/``acquired_at`` timestamps handed to Pods and shown in status.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        prefix: str = "/fencedlease",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
        skew_seconds: float = 1.0,
        timeout: float = 5.0,
        ca_file: Path | str | None = None,
        cert_file: Path | str | None = None,
        key_file: Path | str | None = None,
        max_retries: int = 16,
        lease_ids: Callable[[], str] = decide.new_lease_id,
        retention: retain.Retention | None = None,
    ) -> None:
        self._conn = Connection(
            endpoints,
            timeout=timeout,
            tls_files=(ca_file, cert_file, key_file),
            clock=clock,
            on_header=self._see_header,
        )
        self._prefix = prefix.rstrip("/").encode()
        self.clock = clock
        self.wall = wall
        self.skew_seconds = skew_seconds
        self.timeout = timeout
        self._max_retries = max_retries
        self._lease_ids = lease_ids
        self.retention = retention or retain.Retention()
        # The etcd lease of the current deletion bucket: (bucket index, etcd lease id).
        self._bucket_lease: tuple[int, int] | None = None
        self._observations: dict[LeaseKey, Observation] = {}
        # The version of each lease key this replica last read or wrote (``None``: absent).
        # Writes compare on it, so a stale entry only costs the round trip that refreshes it.
        self._known: dict[LeaseKey, StoredLease | None] = {}
        self._lease_keys: dict[LeaseKey, bytes] = {}
        self._max_token_seen = 0
        # The highest header revision etcd returned to this replica: a lower bound of its
        # current revision.  Acquire writes without reading first only while it is at or above
        # every token known (a write then commits above them); reset to -1 when the restore
        # guard refuses, so only etcd's later replies count (docs/tokens.md, "Restore").
        self._head_revision = 0
        self._epoch: str | None = None
        self.contact = self._conn.contact
        """Round trips as this store saw them (liveness, readiness: :mod:`fencedlease.health`)."""

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Self:
        """Build from :class:`fencedlease.settings.Settings` (``overrides`` win)."""
        kwargs: dict[str, Any] = {
            "prefix": settings.etcd_prefix,
            "skew_seconds": settings.clock_skew_seconds,
            "timeout": settings.etcd_timeout_seconds,
            "ca_file": settings.etcd_ca_file,
            "cert_file": settings.etcd_cert_file,
            "key_file": settings.etcd_key_file,
            "retention": retain.Retention(
                settings.token_retention_generations, settings.deleted_lease_retention_seconds
            ),
        }
        kwargs.update(overrides)
        return cls(list(settings.etcd_endpoints), **kwargs)

    # ------------------------------------------------------------------ connection

    @property
    def max_token_seen(self) -> int:
        """Highest token this replica issued or read (in-process part of the restore guard)."""
        return self._max_token_seen

    def _see_token(self, token: int) -> None:
        if token > self._max_token_seen:
            self._max_token_seen = token
            metrics.MAX_TOKEN.set(token)

    def _see_header(self, header: Any) -> None:
        revision = int(header.revision)
        if revision > self._head_revision:
            self._head_revision = revision

    async def connect(self) -> None:
        """Open the channel (lazily retried on use; this only fails fast on bad config)."""
        await self._conn.connect()

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def client(self) -> Any:
        """The underlying ``aetcd.Client`` (for tests and maintenance: snapshot, status)."""
        return self._conn.client

    async def _rpc(self, operation: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """One etcd round trip (:meth:`Connection.rpc`)."""
        return await self._conn.rpc(operation, call)

    async def _txn(
        self,
        operation: str,
        compare: list[ops.Cmp],
        success: list[ops.Op],
        failure: list[ops.Op] | None = None,
    ) -> Any:
        """One etcd transaction (:meth:`Connection.txn`): the raw ``TxnResponse``."""
        return await self._conn.txn(operation, compare, success, failure)

    # ------------------------------------------------------------------------ keys

    def _key(self, kind: str, *parts: str) -> bytes:
        for part in parts:
            if not part or "/" in part:
                raise ValueError(f"invalid name segment {part!r}")
        return b"/".join([self._prefix, kind.encode(), *(p.encode() for p in parts)])

    def _lease_key(self, key: LeaseKey) -> bytes:
        raw = self._lease_keys.get(key)
        if raw is None:
            raw = self._lease_keys[key] = self._key("leases", key.namespace, key.name)
        return raw

    def _hwm_key(self, key: LeaseKey) -> bytes:
        return self._key("hwm", key.namespace, key.name)

    def _token_key(self, token: int) -> bytes:
        return self._key("tokens", str(token))

    # ---------------------------------------------------------------- observations

    def _stored(self, kv: Any) -> StoredLease:
        """A lease key as read; ``StoreUnavailable`` (``corrupt``) when its record does not
        parse: a grant, renewal or deletion is refused rather than decided on a guess."""
        with _parsed(kv.key.decode(errors="replace")):
            record = LeaseRecord.from_json(kv.value)
        stored = StoredLease(record, kv.mod_revision)
        self._see_token(stored.token)
        return stored

    def _observe(
        self, key: LeaseKey, current: StoredLease | None
    ) -> tuple[Observation | None, float]:
        """Record what etcd just returned for ``key`` (observation and cache)."""
        now = self.clock()
        obs = decide.observe(self._observations.get(key), current, now)
        if obs is None:
            self._observations.pop(key, None)
        else:
            self._observations[key] = obs
        self._known[key] = current
        return obs, now

    def _wrote(self, key: LeaseKey, record: LeaseRecord, revision: int) -> StoredLease:
        """Our conditional write of ``record`` committed at ``revision``: cache and observe it
        (the observation starts after the reply, as for any other observer)."""
        stored = StoredLease(record, revision)
        self._known[key] = stored
        self._observations[key] = Observation(revision, record.lease_id, self.clock())
        return stored

    def _forget(self, key: LeaseKey) -> None:
        self._known.pop(key, None)
        self._observations.pop(key, None)
        self._lease_keys.pop(key, None)  # a deleted lease's name may never come back

    async def _read_lease(self, operation: str, key: LeaseKey) -> tuple[StoredLease | None, int]:
        """Linearizable read of the record; also returns the header revision."""
        raw = self._lease_key(key)
        response = await self._rpc(operation, lambda c: c.get_range(raw, raw + b"\0"))
        current = self._stored(response[0]) if len(response) else None
        self._see_header(response.header)
        return current, int(response.header.revision)

    def _record_ops(
        self,
        key: LeaseKey,
        version: StoredLease | None,
        record: LeaseRecord,
        taken: int | None = None,
    ) -> tuple[list[ops.Cmp], list[ops.Op], list[ops.Op], LeaseRecord]:
        """Compare/success/failure ops that record the token of ``version`` if it is a grant
        version (``token: null``) about to be rewritten: ``<p>/tokens/<token>`` is written in
        the same transaction that moves the lease key off that version, so a fence check
        always finds the grant, either here or in the lease key (docs/tokens.md).  The same
        transaction deletes the records that fall off the lease's retained list, and the
        returned record (to write instead of ``record``) carries that list."""
        plan = retain.plan_records(version, record, self.retention.generations, taken=taken)
        if plan.token is None:
            return [], [], [], plan.record
        assert version is not None
        raw = self._token_key(plan.token)
        grant = TokenGrant(
            key.namespace,
            key.name,
            version.record.lease_id,
            version.record.holder,
            version.record.holder_uid,
        )
        prune = [ops.delete(self._token_key(t)) for t in plan.pruned]
        return (
            [ops.absent(raw)],
            [ops.put(raw, grant.to_json()), *prune],
            [ops.get(raw)],
            plan.record,
        )

    async def read(self, namespace: str, name: str) -> LeaseView | None:
        """The record, its token and this replica's expiry verdict (``None``: no record)."""
        key = LeaseKey(namespace, name)
        with _latency("read").time():
            current, revision = await self._read_lease("read", key)
        obs, now = self._observe(key, current)
        if current is None:
            return None
        return decide.view(current, obs, now, revision)

    async def current_revision(self) -> int:
        """etcd's current revision (linearizable read of the response header)."""
        probe = self._key("revision")
        with _latency("read").time():
            response = await self._rpc("read", lambda c: c.get_range(probe, probe + b"\0"))
        self._see_header(response.header)
        return int(response.header.revision)

    async def epoch(self) -> str:
        """The lease service's epoch for metric labels: etcd's cluster id (hex), read once.

        A restored or replaced etcd cluster shows up as a new value next to the old ones.
        """
        if self._epoch is None:
            probe = self._key("revision")
            try:
                response = await self._rpc("read", lambda c: c.get_range(probe, probe + b"\0"))
                self._epoch = format(int(response.header.cluster_id), "x")
            except StoreUnavailable:
                return "unknown"
        return self._epoch

    async def _window_lease(self) -> int:
        """The etcd lease that the deletions of the current time bucket attach their keys
        to, granted by the first of them (one extra round trip per bucket and replica)."""
        b = retain.bucket(self.clock(), self.retention.deleted_window_seconds)
        if self._bucket_lease is not None and self._bucket_lease[0] == b.index:
            return self._bucket_lease[1]
        self._bucket_lease = (b.index, await self._conn.grant_lease("delete", b.ttl_seconds))
        return self._bucket_lease[1]


@contextlib.contextmanager
def _parsed(domain: LeaseKey | str) -> Iterator[None]:
    """Records of ``domain`` that do not parse are neither skipped nor trusted: the caller
    gets ``StoreUnavailable`` (``corrupt``), so a fence check refuses and a commit is retried."""
    try:
        yield
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise StoreUnavailable(
            "corrupt", f"a stored record of {domain} does not parse: {error!r}"
        ) from error


def _token_of_key(key: bytes) -> int:
    """The token of a ``<p>/tokens/<token>`` key: ASCII digits only (``int`` would also read
    ``+7``, ``7_5`` or other scripts' digits as a token); ``ValueError`` otherwise."""
    last = key.rsplit(b"/", 1)[-1]
    if not last.isdigit() or not last.isascii():
        raise ValueError(f"not a token key: {key!r}")
    return int(last)


def _same_version(a: StoredLease | None, b: StoredLease | None) -> bool:
    return (
        a is not None
        and b is not None
        and a.mod_revision == b.mod_revision
        and a.record.lease_id == b.record.lease_id
    )
