"""What the checklist does not cover for the Redis and etcd fences, on the real servers:
a writer paused between its read and its conditional write (etcd), hand-written marks,
deletes, fenced PUBLISH, tokens above 2**53 (exact), bad input changing nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aetcd
import pytest
import redis

from fencedlease.client import Applied, Duplicate, Rejected, StaleFence
from fencedlease.client.fences import FenceInputError, FenceRequest
from fencedlease.client.fences.core import MARK_FORMAT, ReadMark, WriteMark, cas_plan
from fencedlease.client.fences.etcd import EtcdFence
from fencedlease.client.fences.redis import SCRIPT, AsyncRedisFence, RedisCall, RedisFence
from fencedlease.local.cluster import EtcdServer

from ..fence_servers import RedisServer
from .fence_adapters import HOSTILE_MARKS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
async def etcd_client(etcd: EtcdServer) -> AsyncIterator[aetcd.Client]:
    host, port = etcd.endpoint.removeprefix("http://").split(":")
    async with aetcd.Client(host=host, port=int(port)) as client:
        yield client


def test_redis_tokens_above_2_53_compare_exactly(r: redis.Redis) -> None:
    fence = RedisFence(r, mark_key="{j}:fence")
    big = 2**53 + 2
    assert isinstance(fence.set("{j}:out", "b", big), Applied)
    # As doubles, 2**53 + 1 == 2**53 + 2: the script compares digits, not numbers.
    assert isinstance(fence.set("{j}:out", "a", big - 1), StaleFence)
    assert r.get("{j}:out") == b"b"
    assert r.hget("{j}:fence", "fence") == str(big).encode()


def test_redis_delete_and_publish_are_fenced(r: redis.Redis) -> None:
    fence = RedisFence(r, mark_key="{j}:fence")
    pubsub = r.pubsub()
    pubsub.subscribe("{j}:events")
    assert pubsub.get_message(timeout=5) is not None  # the subscription confirmation
    assert isinstance(fence.set("{j}:out", "b", 42), Applied)
    assert isinstance(fence.delete("{j}:out", 41), StaleFence)
    assert r.get("{j}:out") == b"b"
    assert isinstance(fence.publish("{j}:events", "stale", 41, operation_id="e1"), StaleFence)
    assert isinstance(fence.publish("{j}:events", "done", 42, operation_id="e2"), Applied)
    assert isinstance(fence.publish("{j}:events", "done", 42, operation_id="e2"), Duplicate)
    message = pubsub.get_message(timeout=5)
    assert message is not None and message["data"] == b"done"
    assert pubsub.get_message(timeout=0.2) is None  # the stale one and the retry: never sent
    assert isinstance(fence.delete("{j}:out", 43), Applied)
    assert r.get("{j}:out") is None
    assert r.hget("{j}:fence", "visible") is None
    pubsub.close()


def test_redis_hand_written_mark_is_refused(r: redis.Redis) -> None:
    fence = RedisFence(r, mark_key="m")
    r.set("m", "42")  # someone's own idea of a mark
    result = fence.set("k", "v", 99)
    assert isinstance(result, Rejected) and result.code == "invalid_mark", result
    r.delete("m")
    r.hset("m", mapping={"fence": "1", "version": "1"})  # no format: not ours
    result = fence.set("k", "v", 99)
    assert isinstance(result, Rejected) and result.code == "invalid_mark"
    assert r.get("k") is None and r.hgetall("m") == {b"fence": b"1", b"version": b"1"}


def test_redis_bad_input_changes_nothing(r: redis.Redis) -> None:
    fence = RedisFence(r, mark_key="m")
    for bad in ("abc", -1, 0, True, 4.2, "4.2"):
        with pytest.raises(FenceInputError, match="invalid token"):
            fence.set("k", "v", bad)
    with pytest.raises(FenceInputError, match="invalid key"):
        fence.set("", "v", 1)
    assert r.keys("*") == []


async def test_redis_asyncio_client(redis_server: RedisServer) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url)
    fence = AsyncRedisFence(client, mark_key=f"{uuid.uuid4().hex}:fence")
    assert isinstance(await fence.set("ak", "b", 42, operation_id="x"), Applied)
    assert isinstance(await fence.set("ak", "b", 42, operation_id="x"), Duplicate)
    assert isinstance(await fence.delete("ak", 41), StaleFence)
    await client.aclose()


async def test_etcd_writer_paused_between_read_and_write(etcd_client: aetcd.Client) -> None:
    """A reads the mark and decides; B publishes; A's transaction loses the compare, A
    re-reads and is told stale_fence (driven step by step on the real etcd)."""
    prefix = f"/p-{uuid.uuid4().hex[:8]}"
    fence = EtcdFence(etcd_client, mark_key=f"{prefix}/mark")
    key = f"{prefix}/out"
    assert isinstance(await fence.put(key, b"a-1", 41), Applied)
    a = cas_plan(FenceRequest.checked(key, 41, key), "mark")
    assert isinstance(next(a), ReadMark)
    a_write = a.send(await fence._read())
    assert isinstance(a_write, WriteMark)  # A may write ... and pauses here
    assert isinstance(await fence.put(key, b"b", 42), Applied)
    assert await fence._write(a_write, b"a-2") is False  # the compare on mod_revision fails
    assert isinstance(a.send(False), ReadMark)
    with pytest.raises(StopIteration) as done:
        a.send(await fence._read())
    assert isinstance(done.value.value, StaleFence)
    got = await etcd_client.get(key.encode())
    assert got is not None and got.value == b"b"


async def test_etcd_delete_hand_written_mark_and_bad_input(etcd_client: aetcd.Client) -> None:
    prefix = f"/p-{uuid.uuid4().hex[:8]}"
    fence = EtcdFence(etcd_client, mark_key=f"{prefix}/mark")
    key = f"{prefix}/out"
    assert isinstance(await fence.put(key, "b", 42), Applied)
    assert isinstance(await fence.delete(key, 41), StaleFence)
    assert isinstance(await fence.delete(key, 42, operation_id="d"), Applied)
    assert await etcd_client.get(key.encode()) is None
    for bad in ("abc", -1, True, 4.2):
        with pytest.raises(FenceInputError):
            await fence.put(key, "x", bad)
    await etcd_client.put(f"{prefix}/mark".encode(), b"42")  # someone wrote the mark by hand
    result = await fence.put(key, "x", 99)
    assert isinstance(result, Rejected) and result.code == "invalid_mark"
    assert await etcd_client.get(key.encode()) is None


# ----------------------------------------------------------------------------- issue 42

HOSTILE_TOKENS = [
    "0041", "-42", "41.9", "4e10", "1" * 23, "+42", " 42", "42 ", "42\n", "", "0",
    "9223372036854775808", "99999999999999999999", "\u0664\u0662", "0x2a", "inf", "nan", "1_0",
]  # fmt: skip


def evalsha(r: redis.Redis, *keys_and_args: str) -> list[bytes]:
    """The fence's own script called directly (the hardening the docs recommend: writers may
    only EVALSHA it), with whatever the caller chooses to send."""
    sha = r.script_load(SCRIPT)
    reply: list[bytes] = r.evalsha(sha, 3, *keys_and_args)
    return reply


def snapshot(r: redis.Redis) -> dict[Any, Any]:
    return {k: r.dump(k) for k in sorted(r.keys("*"))}


def test_redis_script_validates_tokens_itself(r: redis.Redis) -> None:
    """Issue 42 item 4: the script trusted its token (compared by length): after 42, EVALSHA
    with 0041, -42, 41.9, 4e10 or 23 digits applied, and the mark was left invalid or unbeatable.
    Now each is refused by the script itself and nothing changes."""
    fence = RedisFence(r, mark_key="{j}:fence")
    assert isinstance(fence.set("{j}:out", "b", 42), Applied)
    before = snapshot(r)
    keys = ("{j}:out", "{j}:fence", "{j}:fence:ops")
    for bad in HOSTILE_TOKENS:
        for action, channel in (("set", ""), ("del", ""), ("publish", "{j}:out")):
            reply = evalsha(r, *keys, bad, "", "", "0", action, "evil", channel)
            assert reply[0] == b"invalid" and b"token" in reply[1], (bad, action, reply)
    assert snapshot(r) == before
    # The largest int64 is a token; one above it is not (and the mark still compares exactly).
    top = str(2**63 - 1)
    assert evalsha(r, *keys, top, "", "", "0", "set", "top", "")[0] == b"applied"
    assert r.hget("{j}:fence", "fence") == top.encode() and r.get("{j}:out") == b"top"


@pytest.mark.parametrize(
    ("keys", "args"),
    [
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "has space", "", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "a" * 201, "", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "01", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "-1", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "2", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "flushall", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "publish", "x", "{j}:o")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "set", "x", "{j}:out")),
        (("{j}:fence", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "set", "x", "")),
        (("{j}:fence:ops", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:other"), ("43", "", "", "0", "set", "x", "")),
        (("{j}:out", "{j}:fence", "{j}:fence:ops"), ("43", "", "", "0", "set", "x")),
    ],
)
def test_redis_script_validates_its_other_arguments(
    r: redis.Redis, keys: tuple[str, ...], args: tuple[str, ...]
) -> None:
    fence = RedisFence(r, mark_key="{j}:fence")
    assert isinstance(fence.set("{j}:out", "b", 42, operation_id="b"), Applied)
    before = snapshot(r)
    sha = r.script_load(SCRIPT)
    reply: Any = r.evalsha(sha, len(keys), *keys, *args)
    assert reply[0] == b"invalid", reply
    assert snapshot(r) == before


@pytest.mark.parametrize(
    "stored",
    ["0041", "-1", "41.9", "4e10", "1" * 23, "9223372036854775808", " 42", "", "\u0664\u0662"],
)
def test_redis_stored_mark_is_verified_when_read(r: redis.Redis, stored: str) -> None:
    """A mark whose fence (or version) is not one canonical int64 is refused, never compared:
    "0041" would have beaten 42 by length, 23 digits would never be beaten."""
    fence = RedisFence(r, mark_key="m")
    for field in ("fence", "version"):
        r.delete("m", "m:ops", "k")
        mark: dict[Any, Any] = {"format": MARK_FORMAT, "fence": "42", "version": "3"}
        mark[field] = stored
        r.hset("m", mapping=mark)
        before = snapshot(r)
        result = fence.set("k", "v", 99)
        assert isinstance(result, Rejected) and result.code == "invalid_mark", (field, result)
        assert snapshot(r) == before
    r.delete("m")
    r.hset("m", mapping={"format": MARK_FORMAT, "fence": "42", "version": "3", "extra": "1"})
    result = fence.set("k", "v", 99)
    assert isinstance(result, Rejected) and result.code == "invalid_mark"


def test_redis_key_may_not_be_the_mark(r: redis.Redis) -> None:
    fence = RedisFence(r, mark_key="m")
    for key in ("m", "m:ops"):
        with pytest.raises(FenceInputError, match="mark key"):
            fence.set(key, "v", 1)
    assert r.keys("*") == []


async def test_etcd_hand_written_hostile_marks_are_refused(etcd_client: aetcd.Client) -> None:
    for template in HOSTILE_MARKS:
        prefix = f"/p-{uuid.uuid4().hex[:8]}"
        fence = EtcdFence(etcd_client, mark_key=f"{prefix}/mark")
        mark = template.replace(b"%s", MARK_FORMAT.encode())
        await etcd_client.put(f"{prefix}/mark".encode(), mark)
        result = await fence.put(f"{prefix}/out", "x", 99)
        assert isinstance(result, Rejected) and result.code == "invalid_mark", (mark, result)
        got = await etcd_client.get(f"{prefix}/mark".encode())
        assert got is not None and got.value == mark
        assert await etcd_client.get(f"{prefix}/out".encode()) is None
        with pytest.raises(FenceInputError, match="mark key"):
            await fence.put(f"{prefix}/mark", "x", 99)


def test_redis_script_refusal_is_a_result(r: redis.Redis) -> None:
    """A call the script refuses (here a request built without the library's checks) is
    ``Rejected("invalid")``, one line, not an exception."""
    fence = RedisFence(r, mark_key="m")
    call = RedisCall(
        ("k", "m", "m:ops"),
        ("0041", "", "", "0", "set", "v", ""),
        FenceRequest("k", 41, "k"),
        "redis mark m",
    )
    result = fence._run(call)
    assert isinstance(result, Rejected) and result.code == "invalid", result
    assert "not a positive 64-bit integer" in result.message and "\n" not in result.message
    assert r.keys("*") == []
