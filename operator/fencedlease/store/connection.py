"""The etcd channel: endpoints and failover, TLS, deadlines, and the one place where etcd
errors become :class:`~fencedlease.authority.types.StoreUnavailable`.

This is the only module that touches aetcd's private attributes (``_connected``, ``_host``,
``_port``, ``_options``, ``_timeout`` and the stubs it sets in ``connect``) to open a TLS channel,
which aetcd 1.0 cannot; ``pyproject.toml`` pins aetcd to the version this was written against
and ``tests/unit/test_store_connection.py`` fails when those attributes change
(docs/etcd-client.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc, watcher

from fencedlease import metrics
from fencedlease.authority.types import StoreUnavailable
from fencedlease.health import EtcdContact
from fencedlease.store import ops

T = TypeVar("T")

TRANSIENT = (aetcd.exceptions.ClientError, grpc.RpcError, TimeoutError, OSError)
"""What a round trip may raise when etcd is unreachable, slow or refuses: ``StoreUnavailable``."""

PRIVATE_ATTRIBUTES = ("_connected", "_host", "_port", "_options", "_timeout", "metadata")
"""The attributes of ``aetcd.Client`` this module relies on (checked by a unit test)."""


def parse_endpoint(url: str) -> tuple[str, int, bool]:
    """``http://host:port`` → ``(host, port, tls)``; a bare ``host:port`` means plain http."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint must be http(s)://host:port, got {url!r}")
    return parts.hostname, parts.port or 2379, parts.scheme == "https"


class TlsClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """``aetcd.Client`` that can open a TLS channel (aetcd 1.0 only opens plaintext ones)."""

    def __init__(
        self, host: str, port: int, *, timeout: float, credentials: grpc.ChannelCredentials | None
    ) -> None:
        super().__init__(host=host, port=port, timeout=timeout)
        self._credentials = credentials

    @property
    def connected(self) -> bool:
        return bool(self._connected.is_set())

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


TlsFiles = tuple[Path | str | None, Path | str | None, Path | str | None]
"""``(ca_file, cert_file, key_file)``."""


class Connection:
    """One etcd client at a time over a list of endpoints.  Connects lazily, moves to the next
    endpoint after a failed request (the request itself raises ``StoreUnavailable``), counts
    ``fencedlease_etcd_errors_total{operation}``, and reports round trips to ``contact``.

    ``on_header`` sees the response header of every transaction (the store's lower bound of
    etcd's revision, for the restore guard)."""

    def __init__(
        self,
        endpoints: list[str],
        *,
        timeout: float,
        tls_files: TlsFiles,
        clock: Callable[[], float],
        on_header: Callable[[Any], None],
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        self._endpoints = [parse_endpoint(e) for e in endpoints]
        self._endpoint_index = 0
        self.timeout = timeout
        self._tls_files = tls_files
        self._clock = clock
        self._on_header = on_header
        self._client: TlsClient | None = None
        self.contact = EtcdContact(since=clock())
        """Round trips as this store saw them (liveness, readiness: :mod:`fencedlease.health`)."""

    def _new_client(self) -> TlsClient:
        host, port, tls = self._endpoints[self._endpoint_index]
        ca, cert, key = self._tls_files
        credentials = None
        if tls or ca is not None:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_bytes(ca),
                private_key=_read_bytes(key),
                certificate_chain=_read_bytes(cert),
            )
        return TlsClient(host, port, timeout=self.timeout, credentials=credentials)

    @property
    def client(self) -> Any:
        """The underlying ``aetcd.Client`` (for tests and maintenance: snapshot, status)."""
        if self._client is None:
            self._client = self._new_client()
        return self._client

    async def connect(self) -> None:
        """Open the channel (lazily retried on use; this only fails fast on bad config)."""
        client = self.client
        try:
            await client.connect()
        except TRANSIENT as error:
            raise StoreUnavailable("etcd_error", f"cannot connect to etcd: {error!r}") from error

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def rpc(self, operation: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """One etcd round trip; transient failures become :class:`StoreUnavailable`.

        The deadline is gRPC's (every call passes ``timeout``), so a request costs no extra
        task; only the first connect runs under ``asyncio.timeout``."""
        client = self.client
        try:
            if not client.connected:
                await self._connect(client)
            result = await call(client)
        except TRANSIENT as error:
            raise await self._failed(operation, client, error) from error
        except asyncio.CancelledError as error:
            if _cancelling():
                raise
            raise await self._failed(operation, client, error) from error
        self.contact.succeeded(self._clock())
        return result

    async def txn(
        self,
        operation: str,
        compare: list[ops.Cmp],
        success: list[ops.Op],
        failure: list[ops.Op] | None = None,
    ) -> Any:
        """One etcd transaction (one round trip): the raw ``TxnResponse``."""
        request = ops.txn_request(compare, success, failure)
        response = await self.rpc(
            operation,
            lambda c: c.kvstub.Txn(request, timeout=self.timeout, metadata=c.metadata),
        )
        self._on_header(response.header)
        return response

    async def grant_lease(self, operation: str, ttl_seconds: int) -> int:
        """A new etcd lease with ``ttl_seconds`` to live: its id."""
        request = rpc.LeaseGrantRequest(TTL=ttl_seconds)
        granted = await self.rpc(
            operation,
            lambda c: c.leasestub.LeaseGrant(request, timeout=self.timeout, metadata=c.metadata),
        )
        return int(granted.ID)

    async def _connect(self, client: TlsClient) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # arrives as the call completes (the caller then never stops).
        async with asyncio.timeout(self.timeout):
            await client.connect()

    async def _failed(
        self, operation: str, client: TlsClient, error: BaseException
    ) -> StoreUnavailable:
        metrics.ETCD_ERRORS.labels(operation).inc()
        self.contact.failed(self._clock(), f"{operation}: {error!r}"[:300])
        if len(self._endpoints) > 1 and client is self._client:
            # Fail over: the next call goes to the next endpoint.
            self._endpoint_index = (self._endpoint_index + 1) % len(self._endpoints)
            self._client = None
            await client.close()
        return StoreUnavailable("etcd_error", f"{operation}: etcd request failed: {error!r}")


def _cancelling() -> bool:
    """Whether the running task is being cancelled. A call can also end in ``CancelledError``
    when its channel is closed under it: failing over closes the channel every concurrent call
    shares (grpc.aio cancels their calls), and those calls failed like any etcd error."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0
