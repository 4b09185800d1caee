"""A fence for etcd keys of your own: a fenced put/delete as one transaction with a mark key.

For users who already run etcd and keep their output (a config, a leader's announcement, a
pointer to a blob) in it.  The fencing domain's **mark key** holds the fence mark
(:class:`~fencedlease.client.fences.core.Mark`, JSON); every fenced write is one etcd
transaction::

    IF   mod_revision(mark_key) == <the revision read>     (or: mark_key absent)
    THEN PUT mark_key <new mark>; PUT key value            (or DELETE key)

so the key changes only together with a mark that accepted the token, and a writer that read
an older mark loses the compare, re-reads and is told ``stale_fence``.  Writes that bypass this
helper are not stopped by etcd (it has no triggers): give writers an etcd role that may only
use this path, or keep the data in the same transaction-only key range (docs/fences.md).

The client is ``aetcd`` (the project's etcd client; ``pip install 'fencedlease-client[etcd]'``).
Results: ``Applied | Duplicate | StaleFence | Rejected | Unavailable`` (an etcd error after the
request was built).

etcd runs no code of ours: the transaction's compare (the mark's ``mod_revision``) is the only
condition it checks.  What it stores is checked when read back instead: a mark this library
did not write (a fence ``"0041"``, ``-42``, ``41.9``, ``4e10``, 23 digits, a field twice) is
``Rejected("invalid_mark")`` and never overwritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

try:
    import aetcd
    import aetcd.exceptions
    import grpc
except ModuleNotFoundError as missing:  # say which extra brings it, not a bare module name
    raise ModuleNotFoundError(
        f"fencedlease.client.fences.etcd needs {missing.name}: "
        "pip install 'fencedlease-client[etcd]' (docs/fences.md)",
        name=missing.name,
    ) from None

from fencedlease.client.fences import core
from fencedlease.client.fences.core import (
    FenceInputError,
    FenceRequest,
    FenceResult,
    Mark,
    Snapshot,
    WriteMark,
    WriteOptions,
    check_name,
    decode_mark,
)
from fencedlease.client.results import Unavailable

_TRANSIENT = (aetcd.exceptions.ClientError, grpc.RpcError, TimeoutError, OSError)


class EtcdFence:
    """Fenced writes to keys of one fencing domain, marked at ``mark_key``.

    >>> fence = EtcdFence(aetcd.Client(host="127.0.0.1"), mark_key="/jobs/july/.fence")
    >>> await fence.put("/jobs/july/result", b"s3://bucket/july-b9", token=42)  # doctest: +SKIP
    """

    def __init__(self, client: Any, *, mark_key: str, attempts: int = 32) -> None:
        self.client = client
        self.mark_key = check_name(mark_key, "mark key").encode()
        self.attempts = attempts

    async def put(
        self, key: str, value: bytes | str, token: object, **options: Unpack[WriteOptions]
    ) -> FenceResult:
        """Put ``value`` at ``key`` if ``token`` may write (the mark's ``visible`` records
        ``key``); ``operation_id``, ``expected_version``, ``strict``: :class:`FenceRequest`."""
        data = value.encode() if isinstance(value, str) else value
        if not isinstance(data, bytes):
            raise TypeError(f"value must be bytes or str, not {type(value).__name__}")
        req = FenceRequest.checked(self._key(key), token, key, **options)
        return await self._run(req, data)

    async def delete(self, key: str, token: object, **options: Unpack[WriteOptions]) -> FenceResult:
        """Delete ``key`` if ``token`` may write (the mark's ``visible`` becomes ``None``)."""
        req = FenceRequest.checked(self._key(key), token, None, **options)
        return await self._run(req, None)

    async def mark(self) -> Mark | None:
        """The domain's mark as stored (``None`` before the first write)."""
        got = await self.client.get(self.mark_key)
        return None if got is None else decode_mark(got.value, self._where())

    def _key(self, key: str) -> str:
        if check_name(key, "key").encode() == self.mark_key:
            raise FenceInputError(f"invalid key {key!r}: it is the fence's own mark key")
        return key

    def _where(self) -> str:
        return f"etcd mark {self.mark_key.decode()}"

    async def _run(self, req: FenceRequest, data: bytes | None) -> FenceResult:
        plan = core.cas_plan(req, self._where(), self.attempts)

        async def write(step: WriteMark) -> bool:
            return await self._write(step, data)

        try:
            return await core.drive_async(plan, self._read, write)
        except _TRANSIENT as exc:
            return Unavailable(f"{self._where()}: etcd request failed: {exc!r}", 1)

    async def _read(self) -> Snapshot:
        got = await self.client.get(self.mark_key)
        if got is None:
            return Snapshot(None, None)
        return Snapshot(bytes(got.value), str(got.mod_revision))

    async def _write(self, step: WriteMark, data: bytes | None) -> bool:
        tx = self.client.transactions
        if step.tag is None:
            compare = [tx.version(self.mark_key) == 0]
        else:
            compare = [tx.mod(self.mark_key) == int(step.tag)]
        key = step.request.resource.encode()
        effect = tx.delete(key) if data is None else tx.put(key, data)
        ok, _ = await self.client.transaction(
            compare=compare,
            success=[tx.put(self.mark_key, step.mark.encode()), effect],
            failure=[],
        )
        return bool(ok)
