"""etcd request building: compares and operations as plain tuples, turned into one
``TxnRequest`` (no I/O).  The only module besides :mod:`.connection` that uses aetcd's
generated protobuf classes (``aetcd.rpc``)."""

from __future__ import annotations

from typing import Any, TypeVar

from aetcd import rpc

_EQUAL = rpc.Compare.CompareResult.EQUAL
_VERSION = rpc.Compare.CompareTarget.VERSION
_MOD = rpc.Compare.CompareTarget.MOD


# Compares and ops are plain tuples, turned into one ``TxnRequest`` by ``_txn_request``: filling
# the request's repeated fields in place costs about half of building every sub-message and
# copying it in (a measurable share of a renewal, docs/performance.md).
Cmp = tuple[int, bytes, int]  # (target, key, value): "equal" compares only
Op = tuple[str, bytes, bytes] | Any  # ("put" | "get" | "delete", key, value) or a RequestOp


def absent(key: bytes) -> Cmp:
    return (_VERSION, key, 0)


def mod_is(key: bytes, revision: int) -> Cmp:
    return (_MOD, key, revision)


def get(key: bytes) -> Op:
    return ("get", key, b"")


def put(key: bytes, value: bytes) -> Op:
    return ("put", key, value)


def put_leased(key: bytes, value: bytes, lease: int) -> Op:
    """A put that attaches ``key`` to etcd lease ``lease`` (deleted when it expires)."""
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> Op:
    return ("delete", key, b"")


def add_ops(field: Any, ops: list[Op]) -> None:
    for op in ops:
        if not isinstance(op, tuple):
            field.append(op)
            continue
        kind, key, value = op
        if kind == "get":
            field.add().request_range.key = key
        elif kind == "put":
            put = field.add().request_put
            put.key, put.value = key, value
        else:
            field.add().request_delete_range.key = key


def txn_request(compare: list[Cmp], success: list[Op], failure: list[Op] | None) -> Any:
    request = rpc.TxnRequest()
    for target, key, value in compare:
        if target == _VERSION:
            request.compare.add(result=_EQUAL, target=target, key=key, version=value)
        else:
            request.compare.add(result=_EQUAL, target=target, key=key, mod_revision=value)
    add_ops(request.success, success)
    if failure:
        add_ops(request.failure, failure)
    return request


C = TypeVar("C")


def chunks(items: list[C], size: int) -> list[list[C]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def prefix_end(prefix: bytes) -> bytes:
    """The end of the range of keys that start with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def range_kv(response_op: Any) -> Any | None:
    """The one key-value of a ``get`` in a transaction's responses (``None``: absent)."""
    kvs = response_op.response_range.kvs
    return kvs[0] if kvs else None


def scan(key: bytes, end: bytes, **filters: int) -> Any:
    """A range request over ``[key, end)`` as a transaction operation (``limit``,
    ``min_mod_revision``, ``max_mod_revision`` ...)."""
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=end, **filters))
