"""The fences' shared core without I/O: token checks, the decision, the mark, the CAS plan
interleaved step by step (the paused writer, deterministic: no threads, no sleeps)."""

from __future__ import annotations

from typing import Any

import pytest

from fencedlease.client import Applied, Duplicate, Rejected, StaleFence, Unavailable
from fencedlease.client.fences import FenceInputError, FenceRequest, Mark, check_token, decide
from fencedlease.client.fences.core import (
    MAX_OPERATIONS,
    CasPlan,
    InvalidMark,
    ReadMark,
    Snapshot,
    WriteMark,
    cas_plan,
    decode_mark,
    drive,
)


@pytest.mark.parametrize("good", [1, 42, "42", 2**63 - 1, str(2**63 - 1)])
def test_tokens_accepted(good: object) -> None:
    assert check_token(good) == int(str(good))


NOT_TOKENS: list[object] = [0, -1, "-1", "abc", "", " 42", "4.2", "0x2a", 4.2, True, False, None]
NOT_TOKENS += [2**63, b"42", "0041", "0", "42\n", "+42", "4e10", "1" * 23, "\u0664\u0662", "1_0"]


@pytest.mark.parametrize("bad", NOT_TOKENS)
def test_tokens_refused_with_one_line(bad: object) -> None:
    with pytest.raises(FenceInputError, match="invalid token") as info:
        check_token(bad)
    assert "\n" not in str(info.value)


def req(token: int, value: str = "v", **kw: Any) -> FenceRequest:
    return FenceRequest("r", token, value, **kw)


def test_decide_the_article_rule() -> None:
    m42 = Mark(42, 3, "b", ("op-b",))
    assert isinstance(decide(m42, req(41), "r"), StaleFence)
    assert isinstance(decide(m42, req(42, strict=True), "r"), StaleFence)
    assert isinstance(decide(m42, req(42, operation_id="op-b"), "r"), Duplicate)
    conflict = decide(m42, req(42, operation_id="x", expected_version=2), "r")
    assert isinstance(conflict, Rejected) and conflict.code == "version_conflict"
    assert decide(m42, req(42, "c", operation_id="c"), "r") == Mark(42, 4, "c", ("op-b", "c"))
    assert decide(m42, req(43, "d", operation_id="d"), "r") == Mark(43, 4, "d", ("d",))
    assert decide(None, req(1, "e"), "r") == Mark(1, 1, "e", ())
    # A retry of an operation of an older token is stale, not a duplicate.
    assert isinstance(
        decide(Mark(43, 5, "d", ("d",)), req(42, operation_id="op-b"), "r"), StaleFence
    )


def test_operations_are_bounded() -> None:
    mark = Mark(7, 0, None, ())
    for i in range(MAX_OPERATIONS + 5):
        new = decide(mark, req(7, operation_id=f"o{i}"), "r")
        assert isinstance(new, Mark)
        mark = new
    assert (
        len(mark.operations) == MAX_OPERATIONS and mark.operations[-1] == f"o{MAX_OPERATIONS + 4}"
    )


def test_mark_round_trip_and_hand_written_marks() -> None:
    mark = Mark(2**62, 9, "staging/x", ("a", "b"))
    assert decode_mark(mark.encode(), "p") == mark
    for data in (
        b"not json",
        b'{"fence": 1}',
        b'["fencedlease.io/fence-mark/v1"]',
        mark.encode().replace(b'"fence":4611686018427387904', b'"fence":-1'),
        mark.encode().replace(b'"fence":4611686018427387904', b'"fence":true'),
        mark.encode().replace(b'"version":9', b'"version":9.5'),
        mark.encode().replace(b'"visible":"staging/x"', b'"visible":7'),
        mark.encode()[:-1] + b',"extra":1}',
    ):
        with pytest.raises(InvalidMark):
            decode_mark(data, "p")


class Store:
    """An in-memory compare-and-swap record (an S3 object with an ETag, an etcd key)."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.tag = 0

    def read(self) -> Snapshot:
        return Snapshot(self.data, None if self.data is None else str(self.tag))

    def write(self, step: WriteMark) -> bool:
        current = None if self.data is None else str(self.tag)
        if step.tag != current:
            return False
        self.data, self.tag = step.mark.encode(), self.tag + 1
        return True


def test_paused_between_read_and_write_then_stale() -> None:
    store = Store()
    a: CasPlan = cas_plan(req(41, "a"), "p")
    assert isinstance(next(a), ReadMark)
    a_write = a.send(store.read())  # A decided on an empty pointer ...
    assert isinstance(a_write, WriteMark)
    b = drive(cas_plan(req(42, "b"), "p"), store.read, store.write)  # ... B publishes meanwhile
    assert isinstance(b, Applied)
    assert isinstance(a.send(store.write(a_write)), ReadMark)  # A's conditional write loses
    with pytest.raises(StopIteration) as done:
        a.send(store.read())
    assert isinstance(done.value.value, StaleFence)
    assert decode_mark(store.data or b"", "p").visible == "b"


def test_a_hand_written_pointer_is_refused_and_kept() -> None:
    store = Store()
    store.data = b'{"visible": "reports/evil"}'
    result = drive(cas_plan(req(99, "x"), "s3://b/p"), store.read, store.write)
    assert isinstance(result, Rejected) and result.code == "invalid_mark"
    assert "s3://b/p is not a fence mark" in result.message
    assert store.data == b'{"visible": "reports/evil"}'


def test_endless_races_end_unavailable() -> None:
    store = Store()
    result = drive(cas_plan(req(5), "p", attempts=3), store.read, lambda step: False)
    assert isinstance(result, Unavailable) and result.attempts == 3
    assert store.data is None


def test_request_checked_refuses_bad_names() -> None:
    with pytest.raises(FenceInputError, match="resource"):
        FenceRequest.checked("", 1, "v")
    with pytest.raises(FenceInputError, match="operation id"):
        FenceRequest.checked("r", 1, "v", operation_id="has space")
    with pytest.raises(FenceInputError, match="expected version"):
        FenceRequest.checked("r", 1, "v", expected_version=True)


@pytest.mark.parametrize("bad", [True, 4.2, "abc", 0, -3, 2**63])
def test_sql_fence_refuses_bad_tokens_and_writes_nothing(bad: object) -> None:
    """Regression: SqlFence.publish took ``True`` as fence 1 and stored ``4.2`` as a fence."""
    import sqlite3

    from fencedlease.client import SqlFence
    from fencedlease.client.validation import InvalidInput

    conn = sqlite3.connect(":memory:")
    fence = SqlFence("catalog")
    fence.create_tables(conn)
    with pytest.raises(InvalidInput, match="fence must be"):
        fence.publish(conn, "r", bad, "k")  # type: ignore[arg-type]
    assert fence.read(conn, "r") is None


@pytest.mark.parametrize("bad", ["a b", "abc\n", "", "x" * 201, "\u00e9"])
def test_operation_ids_refused(bad: str) -> None:
    with pytest.raises(FenceInputError, match="invalid operation id"):
        FenceRequest.checked("r", 1, "v", operation_id=bad)


def test_a_mark_with_a_field_twice_is_refused() -> None:
    """``{"fence": 99, "fence": 1}`` reads as 1 here and as 99 elsewhere: not a mark."""
    good = Mark(42, 1, "k", ("a",)).encode()
    assert decode_mark(good, "m") == Mark(42, 1, "k", ("a",))
    twice = good.replace(b'"fence":42', b'"fence":99,"fence":42')
    with pytest.raises(InvalidMark, match="twice"):
        decode_mark(twice, "m")
    with pytest.raises(InvalidMark, match="visible"):
        decode_mark(good.replace(b'"visible":"k"', b'"visible":""'), "m")


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("staging/p/42-" + "a" * 32, ("p", 42)),
        ("staging/p/uni/42-" + "0" * 32, ("p/uni", 42)),
        ("staging/p/uni/\u00b2-x", None),  # issue 42 item 19: isdigit() then int() raised
        ("staging/p/\u0664\u0662-" + "a" * 32, None),
        ("staging/p/0041-" + "a" * 32, None),
        ("staging/p/9223372036854775808-" + "a" * 32, None),
        ("staging/p/42-x", None),
        ("staging/42-" + "a" * 32, None),
        ("other/p/42-" + "a" * 32, None),
    ],
)
def test_staged_keys_parsed(key: str, parsed: tuple[str, int] | None) -> None:
    from fencedlease.client.fences.s3 import _staged

    assert _staged(key, "staging/") == parsed


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == sys.argv[1]:
            raise ModuleNotFoundError(f"No module named {sys.argv[1]!r}", name=sys.argv[1])
sys.meta_path.insert(0, Block())
try:
    exec(sys.argv[2])
except ModuleNotFoundError as exc:
    print(exc)
"""


@pytest.mark.parametrize(
    ("module", "code", "extra"),
    [
        ("aetcd", "import fencedlease.client.fences.etcd", "etcd"),
        ("grpc", "import fencedlease.client.fences.etcd", "etcd"),
        (
            "botocore",
            "from fencedlease.client.fences.s3 import s3_client; s3_client(None, 'a', 'b')",
            "s3",
        ),
    ],
)
def test_a_missing_extra_is_named(module: str, code: str, extra: str) -> None:
    """Issue 42 item 21: ``ModuleNotFoundError: aetcd`` said nothing of the extra to install."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", BLOCK, module, code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert f"needs {module}: pip install 'fencedlease-client[{extra}]'" in out.stdout, out.stdout
