"""What the checklist does not cover for the Redis and etcd fences, on the real servers:
a writer paused between its read and its conditional write (etcd), hand-written marks,
deletes, fenced PUBLISH, tokens above 2**53 (exact), bad input changing nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import aetcd
import pytest
import redis

from fencedlease.client import Applied, Duplicate, Rejected, StaleFence
from fencedlease.client.fences import FenceInputError, FenceRequest
from fencedlease.client.fences.core import ReadMark, WriteMark, cas_plan
from fencedlease.client.fences.etcd import EtcdFence
from fencedlease.client.fences.redis import AsyncRedisFence, RedisFence
from fencedlease.local.cluster import EtcdServer

from ..fence_servers import RedisServer

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
