"""Thin async etcd adapter: runs the pure decisions of :mod:`fencedlease.authority.lease` and
:mod:`fencedlease.authority.fence` as etcd transactions (client: ``aetcd``, see
``docs/etcd-client.md``).

Layout under the prefix (default ``/fencedlease``)::

    <p>/leases/<ns>/<name>   LeaseRecord JSON   (token null in the acquire write = its mod_revision)
    <p>/tokens/<token>       TokenGrant JSON    (written once per grant; never deleted)
    <p>/hwm/<ns>/<name>      HighWaterMark JSON (advanced from committed writes; never deleted)

Every write is a transaction conditional on the mod_revision that the decision was based on,
so etcd's compare decides races between replicas; a lost race is re-read and re-decided.
Expected outcomes are returned as values; etcd failures become ``Unavailable`` results (or
:class:`~fencedlease.authority.types.StoreUnavailable` from plain queries), never "stale".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc, watcher

from fencedlease import metrics
from fencedlease.authority import fence as fencing
from fencedlease.authority import lease as decide
from fencedlease.authority.types import (
    Acquired,
    AcquireResult,
    Busy,
    EndedBy,
    Expired,
    ExpireResult,
    FenceResult,
    FencingPolicy,
    HighWaterMark,
    LeaseKey,
    LeaseRecord,
    LeaseView,
    MarkAdvance,
    NotHeld,
    Observation,
    Released,
    ReleaseResult,
    Renewed,
    RenewResult,
    StoredLease,
    StoreUnavailable,
    TokenGrant,
    Unavailable,
)
from fencedlease.settings import Settings

T = TypeVar("T")

_TRANSIENT = (aetcd.exceptions.ClientError, grpc.RpcError, TimeoutError, OSError)


def _utc_now() -> datetime:
    return datetime.now(UTC)


def parse_endpoint(url: str) -> tuple[str, int, bool]:
    """``http://host:port`` → ``(host, port, tls)``; a bare ``host:port`` means plain http."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint must be http(s)://host:port, got {url!r}")
    return parts.hostname, parts.port or 2379, parts.scheme == "https"


class _Client(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """``aetcd.Client`` that can open a TLS channel (aetcd 1.0 only opens plaintext ones)."""

    def __init__(
        self, host: str, port: int, *, timeout: float, credentials: grpc.ChannelCredentials | None
    ) -> None:
        super().__init__(host=host, port=port, timeout=timeout)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._credentials is None or self._connected.is_set():
            await super().connect()
            return
        self.channel = rpc.secure_channel(
            f"{self._host}:{self._port}", self._credentials, options=list(self._options.items())
        )
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


def _read_bytes(path: Path | str | None) -> bytes | None:
    return Path(path).read_bytes() if path is not None else None


class EtcdStore:
    """The grant authority on etcd.  One instance per operator replica.

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
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self._endpoint_index = 0
        self._prefix = prefix.rstrip("/").encode()
        self.clock = clock
        self.wall = wall
        self.skew_seconds = skew_seconds
        self.timeout = timeout
        self._tls_files = (ca_file, cert_file, key_file)
        self._max_retries = max_retries
        self._lease_ids = lease_ids
        self._client: _Client | None = None
        self._observations: dict[LeaseKey, Observation] = {}
        self._max_token_seen = 0
        self._epoch: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> EtcdStore:
        """Build from :class:`fencedlease.settings.Settings` (``overrides`` win)."""
        kwargs: dict[str, Any] = {
            "prefix": settings.etcd_prefix,
            "skew_seconds": settings.clock_skew_seconds,
            "timeout": settings.etcd_timeout_seconds,
            "ca_file": settings.etcd_ca_file,
            "cert_file": settings.etcd_cert_file,
            "key_file": settings.etcd_key_file,
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

    def _new_client(self) -> _Client:
        host, port, tls = self._endpoints[self._endpoint_index]
        ca, cert, key = self._tls_files
        credentials = None
        if tls or ca is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_bytes(ca),
                private_key=_read_bytes(key),
                certificate_chain=_read_bytes(cert),
            )
        return _Client(host, port, timeout=self.timeout, credentials=credentials)

    async def connect(self) -> None:
        """Open the channel (lazily retried on use; this only fails fast on bad config)."""
        if self._client is None:
            self._client = self._new_client()
        try:
            await self._client.connect()
        except _TRANSIENT as error:
            raise StoreUnavailable("etcd_error", f"cannot connect to etcd: {error!r}") from error

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def client(self) -> Any:
        """The underlying ``aetcd.Client`` (for tests and maintenance: snapshot, status)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def _rpc(self, operation: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """One etcd round trip; transient failures become :class:`StoreUnavailable`."""
        client: _Client = self.client
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that arrives as the call completes (the caller then never stops).
            async with asyncio.timeout(self.timeout):
                return await call(client)
        except _TRANSIENT as error:
            metrics.ETCD_ERRORS.labels(operation).inc()
            if len(self._endpoints) > 1 and client is self._client:
                # Fail over: the next call goes to the next endpoint.
                self._endpoint_index = (self._endpoint_index + 1) % len(self._endpoints)
                self._client = None
                await client.close()
            raise StoreUnavailable(
                "etcd_error", f"{operation}: etcd request failed: {error!r}"
            ) from error

    # ------------------------------------------------------------------------ keys

    def _key(self, kind: str, *parts: str) -> bytes:
        for part in parts:
            if not part or "/" in part:
                raise ValueError(f"invalid name segment {part!r}")
        return b"/".join([self._prefix, kind.encode(), *(p.encode() for p in parts)])

    def _lease_key(self, key: LeaseKey) -> bytes:
        return self._key("leases", key.namespace, key.name)

    def _hwm_key(self, key: LeaseKey) -> bytes:
        return self._key("hwm", key.namespace, key.name)

    def _token_key(self, token: int) -> bytes:
        return self._key("tokens", str(token))

    # ---------------------------------------------------------------- observations

    def _stored(self, kv: Any) -> StoredLease:
        stored = StoredLease(LeaseRecord.from_json(kv.value), kv.mod_revision)
        self._see_token(stored.token)
        return stored

    def _observe(
        self, key: LeaseKey, current: StoredLease | None
    ) -> tuple[Observation | None, float]:
        now = self.clock()
        obs = decide.observe(self._observations.get(key), current, now)
        if obs is None:
            self._observations.pop(key, None)
        else:
            self._observations[key] = obs
        return obs, now

    async def _read_lease(self, operation: str, key: LeaseKey) -> tuple[StoredLease | None, int]:
        """Linearizable read of the record; also returns the header revision."""
        raw = self._lease_key(key)
        response = await self._rpc(operation, lambda c: c.get_range(raw, raw + b"\0"))
        current = self._stored(response[0]) if len(response) else None
        return current, int(response.header.revision)

    async def _cas(
        self, operation: str, key: LeaseKey, expected_mod_revision: int | None, record: LeaseRecord
    ) -> tuple[bool, StoredLease | None]:
        """Write ``record`` iff the key is at ``expected_mod_revision``; return what is there now.

        The ``get`` in both branches returns the key after the transaction: on success its
        ``mod_revision`` is the commit revision (the token of a fresh acquire).
        """
        raw = self._lease_key(key)

        async def call(client: Any) -> tuple[bool, list[Any]]:
            t = client.transactions
            compare = (
                [t.version(raw) == 0]
                if expected_mod_revision is None
                else [t.mod(raw) == expected_mod_revision]
            )
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=compare,
                success=[t.put(raw, record.to_json()), t.get(raw)],
                failure=[t.get(raw)],
            )
            return result

        succeeded, responses = await self._rpc(operation, call)
        found = responses[-1]
        after = self._stored(found[0][1]) if found else None
        return bool(succeeded), after

    # ----------------------------------------------------------------------- lease

    async def acquire(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration_seconds: float,
        *,
        token_floor: int = 0,
        holder_uid: str | None = None,
    ) -> AcquireResult:
        """Grant a new generation (``Acquired``) or say who holds it (``Busy``) or why not
        (``Unavailable``: etcd error, ``restore_guard``, contention, token not recorded).

        ``token_floor``: the highest token the caller *verified* was issued (lease statuses
        carrying the authority's proof); granting is refused while etcd's revision is not
        above it.  ``holder_uid``: the holder Pod's UID, recorded with the grant so that only
        that Pod (not a later one with the same name) can use it.
        """
        with metrics.STORE_LATENCY.labels("acquire").time():
            result = await self._acquire(
                LeaseKey(namespace, name), holder, duration_seconds, token_floor, holder_uid
            )
        match result:
            case Acquired(took_over_expired=took_over):
                metrics.GRANTS.inc()
                if took_over:
                    metrics.TAKEOVERS.inc()
                    metrics.EXPIRIES.inc()
            case Busy():
                metrics.ACQUIRE_BUSY.inc()
            case Unavailable(code=code):
                metrics.ACQUIRE_UNAVAILABLE.labels(code).inc()
        return result

    async def _acquire(
        self,
        key: LeaseKey,
        holder: str,
        duration_seconds: float,
        token_floor: int,
        holder_uid: str | None,
    ) -> AcquireResult:
        sent_at, sent_wall = self.clock(), self.wall()
        # Tokens seen *before* the read was sent are at or below the revision it returns
        # (linearizable read); ones seen meanwhile (concurrent grants) may be above it.
        seen_before = self._max_token_seen
        try:
            current, revision = await self._read_lease("acquire", key)
        except StoreUnavailable as error:
            return error.as_result()
        refusal = decide.restore_guard(revision, token_floor, seen_before)
        if refusal is not None:
            return refusal
        lease_id = self._lease_ids()
        for _ in range(self._max_retries):
            obs, now = self._observe(key, current)
            plan = decide.decide_acquire(
                current,
                obs,
                now,
                holder=holder,
                duration_seconds=duration_seconds,
                lease_id=lease_id,
                holder_uid=holder_uid,
            )
            if isinstance(plan, Busy):
                return plan
            try:
                ok, current = await self._cas(
                    "acquire", key, plan.expected_mod_revision, plan.record
                )
            except StoreUnavailable as error:
                # The grant may or may not have committed; if it did it was never issued
                # (no token record) and simply expires.
                return error.as_result()
            if ok and current is not None:
                token = current.mod_revision
                self._observations[key] = Observation(token, lease_id, self.clock())
                recorded = await self._record_grant(key, token, lease_id, holder, holder_uid)
                if recorded is not None:
                    return recorded
                return Acquired(
                    lease_id=lease_id,
                    token=token,
                    holder=holder,
                    duration=duration_seconds,
                    deadline_monotonic=decide.holder_deadline(
                        sent_at, duration_seconds, self.skew_seconds
                    ),
                    valid_until=decide.valid_until(sent_wall, duration_seconds, self.skew_seconds),
                    acquired_at=sent_wall,
                    took_over_expired=plan.took_over_expired,
                )
        return Unavailable("contention", f"lease {key} kept changing while acquiring")

    async def _record_grant(
        self, key: LeaseKey, token: int, lease_id: str, holder: str, holder_uid: str | None
    ) -> Unavailable | None:
        """Write ``<p>/tokens/<token>``; a token is issued only once this succeeds."""
        raw = self._token_key(token)
        grant = TokenGrant(key.namespace, key.name, lease_id, holder, holder_uid)

        async def call(client: Any) -> tuple[bool, list[Any]]:
            t = client.transactions
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=[t.version(raw) == 0], success=[t.put(raw, grant.to_json())], failure=[]
            )
            return result

        try:
            ok, _ = await self._rpc("acquire", call)
        except StoreUnavailable as error:
            return Unavailable(
                "token_record_failed",
                f"granted token {token} could not be recorded, so it is not issued "
                f"(the generation expires unused): {error.reason}",
            )
        if not ok:
            return Unavailable(
                "restore_guard",
                f"token {token} was already issued before: etcd reuses revisions (restored "
                "from an older snapshot?). Restore with `etcdutl snapshot restore "
                "--bump-revision <N> --mark-compacted` and pass the highest known token as floor.",
            )
        self._see_token(token)
        return None

    async def _rewrite(
        self,
        operation: str,
        key: LeaseKey,
        decide_fn: Callable[
            [StoredLease | None, Observation | None, float],
            decide.WritePlan | Released | NotHeld | Busy,
        ],
    ) -> tuple[decide.WritePlan | Released | NotHeld | Busy | Unavailable, float, datetime]:
        """Read, decide, conditional write; re-decide on a lost race.  Shared by renew,
        release, force-release and expire."""
        sent_at, sent_wall = self.clock(), self.wall()
        try:
            current, _ = await self._read_lease(operation, key)
            for _ in range(self._max_retries):
                obs, now = self._observe(key, current)
                plan = decide_fn(current, obs, now)
                if not isinstance(plan, decide.WritePlan):
                    return plan, sent_at, sent_wall
                ok, current = await self._cas(
                    operation, key, plan.expected_mod_revision, plan.record
                )
                if ok and current is not None:
                    self._observations[key] = Observation(
                        current.mod_revision, plan.record.lease_id, self.clock()
                    )
                    return plan, sent_at, sent_wall
        except StoreUnavailable as error:
            return error.as_result(), sent_at, sent_wall
        return Unavailable("contention", f"lease {key} kept changing"), sent_at, sent_wall

    async def renew(self, namespace: str, name: str, lease_id: str, token: int) -> RenewResult:
        """Extend generation ``(lease_id, token)``; anything else is ``NotHeld`` (no change)."""
        key = LeaseKey(namespace, name)
        with metrics.STORE_LATENCY.labels("renew").time():
            outcome, sent_at, sent_wall = await self._rewrite(
                "renew",
                key,
                lambda cur, obs, now: decide.decide_renew(
                    cur, obs, now, lease_id=lease_id, token=token
                ),
            )
        result: RenewResult
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                d = record.duration_seconds
                result = Renewed(
                    lease_id=lease_id,
                    token=tok,
                    holder=record.holder,
                    duration=d,
                    deadline_monotonic=decide.holder_deadline(sent_at, d, self.skew_seconds),
                    valid_until=decide.valid_until(sent_wall, d, self.skew_seconds),
                    renewed_at=sent_wall,
                    renewals=record.renewals,
                )
            case NotHeld() | Unavailable():
                result = outcome
            case _:  # pragma: no cover - decide_renew returns nothing else
                raise AssertionError(outcome)
        metrics.RENEWALS.labels(result.kind).inc()
        return result

    def _released(
        self, kind: str, outcome: decide.WritePlan | Released | NotHeld | Busy | Unavailable
    ) -> ReleaseResult:
        result: ReleaseResult
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                result = Released(
                    record.lease_id, tok, forced=record.ended_by is EndedBy.FORCE_RELEASE
                )
            case Released() | NotHeld() | Unavailable():
                result = outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)
        metrics.RELEASES.labels(kind, result.kind).inc()
        return result

    async def release(self, namespace: str, name: str, lease_id: str, token: int) -> ReleaseResult:
        """End generation ``(lease_id, token)``; a late release of an older one changes nothing."""
        with metrics.STORE_LATENCY.labels("release").time():
            outcome, _, _ = await self._rewrite(
                "release",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_release(cur, lease_id=lease_id, token=token),
            )
        return self._released("release", outcome)

    async def force_release(self, namespace: str, name: str, lease_id: str) -> ReleaseResult:
        """Administrator revoke of generation ``lease_id``.  The old holder is not stopped:
        only a newer token at the resource fences it."""
        with metrics.STORE_LATENCY.labels("force_release").time():
            outcome, _, _ = await self._rewrite(
                "force_release",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_force_release(cur, lease_id=lease_id),
            )
        return self._released("force_release", outcome)

    async def expire(self, namespace: str, name: str, lease_id: str | None = None) -> ExpireResult:
        """Mark the held generation expired if this replica's clock says so (else ``Busy``)."""
        with metrics.STORE_LATENCY.labels("expire").time():
            outcome, _, _ = await self._rewrite(
                "expire",
                LeaseKey(namespace, name),
                lambda cur, obs, now: decide.decide_expire(cur, obs, now, lease_id=lease_id),
            )
        match outcome:
            case decide.WritePlan(record=record, token=tok):
                metrics.EXPIRIES.inc()
                return Expired(record.lease_id, tok, record.holder)
            case Busy() | NotHeld() | Unavailable():
                return outcome
            case _:  # pragma: no cover
                raise AssertionError(outcome)

    async def delete(self, namespace: str, name: str) -> None:
        """The FencedLease was deleted: drop its record.  Token grants and the high-water mark
        stay, so a re-created lease of the same name keeps rejecting old tokens."""
        key = LeaseKey(namespace, name)
        raw = self._lease_key(key)
        with metrics.STORE_LATENCY.labels("delete").time():
            await self._rpc("delete", lambda c: c.delete(raw))
        self._observations.pop(key, None)

    async def read(self, namespace: str, name: str) -> LeaseView | None:
        """The record, its token and this replica's expiry verdict (``None``: no record)."""
        key = LeaseKey(namespace, name)
        with metrics.STORE_LATENCY.labels("read").time():
            current, revision = await self._read_lease("read", key)
        obs, now = self._observe(key, current)
        if current is None:
            return None
        return LeaseView(
            record=current.record,
            mod_revision=current.mod_revision,
            token=current.token,
            expired=decide.is_expired(current, obs, now),
            remaining_seconds=decide.remaining_seconds(current, obs, now),
            header_revision=revision,
        )

    async def current_revision(self) -> int:
        """etcd's current revision (linearizable read of the response header)."""
        probe = self._key("revision")
        with metrics.STORE_LATENCY.labels("read").time():
            response = await self._rpc("read", lambda c: c.get_range(probe, probe + b"\0"))
        return int(response.header.revision)

    # --------------------------------------------------------------------- fencing

    async def token_grant(self, token: int) -> TokenGrant | None:
        """What ``token`` was issued for (``None``: never issued)."""
        raw = self._token_key(token)
        with metrics.STORE_LATENCY.labels("read").time():
            found = await self._rpc("read", lambda c: c.get(raw))
        return TokenGrant.from_json(found.value) if found is not None else None

    async def high_water_mark(self, namespace: str, name: str) -> HighWaterMark | None:
        """The fencing domain's high-water mark (``None``: nothing accepted yet).

        Raises :class:`StoreUnavailable` on etcd errors (as do the other plain queries)."""
        raw = self._hwm_key(LeaseKey(namespace, name))
        with metrics.STORE_LATENCY.labels("read").time():
            found = await self._rpc("read", lambda c: c.get(raw))
        return HighWaterMark.from_json(found.value) if found is not None else None

    async def fence(
        self,
        namespace: str,
        name: str,
        token: int,
        policy: FencingPolicy = FencingPolicy.ALLOW_EQUAL,
        operation_id: str | None = None,
        *,
        holder: str | None = None,
        holder_uid: str | None = None,
        dry_run: bool = False,
        operation: str = "update",
    ) -> FenceResult | Unavailable:
        """Check ``token`` against lease ``namespace/name``'s fencing domain and, if applied,
        advance its high-water mark atomically (compare-and-swap; skipped when ``dry_run``).

        For a resource that checks and commits in one step (the caller *is* the resource).
        The admission webhook does not use it: a write it admits may still fail to commit, so
        it only reads (:meth:`grant_and_mark`) and the mark follows committed writes
        (:meth:`record_commit`).  ``operation`` is a metric label (create, update, status,
        publish; else "other").
        """
        with metrics.STORE_LATENCY.labels("fence").time():
            result = await self._fence(
                LeaseKey(namespace, name), token, policy, operation_id, holder, holder_uid, dry_run
            )
        if isinstance(result, FenceResult):
            metrics.FENCE_RESULTS.labels(
                result.code.value, metrics.fence_operation_label(operation), await self.epoch()
            ).inc()
        return result

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

    async def _fence(
        self,
        domain: LeaseKey,
        token: int,
        policy: FencingPolicy,
        operation_id: str | None,
        holder: str | None,
        holder_uid: str | None,
        dry_run: bool,
    ) -> FenceResult | Unavailable:
        hwm_raw = self._hwm_key(domain)
        try:
            for _ in range(self._max_retries):
                grant, hwm, hwm_revision = await self._grant_and_mark(token, domain)
                result, new_hwm = fencing.evaluate(
                    domain,
                    grant,
                    hwm,
                    token,
                    policy,
                    operation_id=operation_id,
                    holder=holder,
                    holder_uid=holder_uid,
                )
                if new_hwm is None or dry_run:
                    return result
                if await self._advance(hwm_raw, hwm_revision, new_hwm):
                    return result
                # Lost a compare-and-swap race: re-read and re-decide (the verdict may change).
        except StoreUnavailable as error:
            return error.as_result()
        return Unavailable("contention", f"high-water mark of {domain} kept changing")

    async def _grant_and_mark(
        self, token: int, domain: LeaseKey
    ) -> tuple[TokenGrant | None, HighWaterMark | None, int | None]:
        """The token's grant record and the domain's mark (with its mod_revision), one read."""
        token_raw, hwm_raw = self._token_key(token), self._hwm_key(domain)

        async def read(client: Any) -> tuple[bool, list[Any]]:
            t = client.transactions
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=[], success=[t.get(token_raw), t.get(hwm_raw)], failure=[]
            )
            return result

        _, (grant_kvs, hwm_kvs) = await self._rpc("fence", read)
        grant = TokenGrant.from_json(grant_kvs[0][0]) if grant_kvs else None
        hwm = HighWaterMark.from_json(hwm_kvs[0][0]) if hwm_kvs else None
        return grant, hwm, (hwm_kvs[0][1].mod_revision if hwm_kvs else None)

    async def grant_and_mark(
        self, namespace: str, name: str, token: int
    ) -> tuple[TokenGrant | None, HighWaterMark | None]:
        """What ``token`` was issued for and lease ``namespace/name``'s high-water mark, read
        in one etcd transaction (the admission webhook's only store call).

        Raises :class:`StoreUnavailable` on etcd errors."""
        with metrics.STORE_LATENCY.labels("fence").time():
            grant, hwm, _ = await self._grant_and_mark(token, LeaseKey(namespace, name))
        return grant, hwm

    async def record_commit(self, namespace: str, name: str, token: int) -> MarkAdvance:
        """A write carrying ``token`` was committed to an artifact of lease ``namespace/name``
        (the controller saw it stored): advance the domain's high-water mark to cover it.

        Only a token issued for this lease moves the mark (an artifact written while the
        webhook was bypassed is reported, not trusted).  Idempotent; never moves backwards.
        Raises :class:`StoreUnavailable` on etcd errors.
        """
        domain = LeaseKey(namespace, name)
        hwm_raw = self._hwm_key(domain)
        with metrics.STORE_LATENCY.labels("record_commit").time():
            for _ in range(self._max_retries):
                grant, hwm, hwm_revision = await self._grant_and_mark(token, domain)
                current = hwm.token if hwm else None
                refusal = fencing.check_grant(grant, domain)
                if refusal is not None:
                    return MarkAdvance(token, current, advanced=False, verified=False)
                new_hwm = fencing.committed(hwm, token)
                if new_hwm is None:
                    return MarkAdvance(token, current, advanced=False, verified=True)
                if await self._advance(hwm_raw, hwm_revision, new_hwm):
                    return MarkAdvance(token, token, advanced=True, verified=True)
        raise StoreUnavailable("contention", f"high-water mark of {domain} kept changing")

    async def _advance(self, raw: bytes, expected: int | None, new_hwm: HighWaterMark) -> bool:
        async def call(client: Any) -> tuple[bool, list[Any]]:
            t = client.transactions
            compare = [t.version(raw) == 0] if expected is None else [t.mod(raw) == expected]
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=compare, success=[t.put(raw, new_hwm.to_json())], failure=[]
            )
            return result

        ok, _ = await self._rpc("fence", call)
        return bool(ok)
