"""The S3 fence on a real S3 server (MinIO built from its Go module): the conditional writes
really are compare-and-swaps, a hand-written pointer is refused and kept, staged objects are
immutable, garbage collection never deletes what a pointer references."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fencedlease.client import Applied, Rejected, StaleFence
from fencedlease.client.fences import FenceInputError, FenceRequest
from fencedlease.client.fences.core import ReadMark, WriteMark, cas_plan
from fencedlease.client.fences.s3 import S3Fence, s3_client

from ..fence_servers import MinioServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def fence(minio: MinioServer) -> S3Fence:
    client = s3_client(minio.endpoint, minio.access_key, minio.secret_key)
    bucket = f"s3f-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    return S3Fence(client, bucket)


def body(fence: S3Fence, key: str) -> bytes:
    got: Any = fence.client.get_object(Bucket=fence.bucket, Key=key)
    return bytes(got["Body"].read())


def test_writer_paused_between_read_and_write(fence: S3Fence) -> None:
    a_key, b_key = fence.stage("p", 41, b"a"), fence.stage("p", 42, b"b")
    a = cas_plan(FenceRequest.checked("p", 41, a_key), "p")
    assert isinstance(next(a), ReadMark)
    a_write = a.send(fence._read("p"))
    assert isinstance(a_write, WriteMark) and a_write.tag is None  # would be the first publish
    assert isinstance(fence.publish("p", b_key, 42), Applied)  # B first (If-None-Match: *)
    assert fence._write("p", a_write) is False  # 412: the pointer exists now
    assert isinstance(a.send(False), ReadMark)
    with pytest.raises(StopIteration) as done:
        a.send(fence._read("p"))
    assert isinstance(done.value.value, StaleFence)
    assert fence.resolve("p") == b"b"
    # The same with If-Match: A decides on B's ETag, C publishes 43, A's write fails.
    a = cas_plan(FenceRequest.checked("p", 42, a_key, operation_id="a"), "p")
    next(a)
    a_write = a.send(fence._read("p"))
    assert isinstance(a_write, WriteMark) and a_write.tag is not None
    assert isinstance(fence.publish("p", fence.stage("p", 43, b"c"), 43), Applied)
    assert fence._write("p", a_write) is False
    next_step = a.send(False)
    assert isinstance(next_step, ReadMark)
    with pytest.raises(StopIteration) as done:
        a.send(fence._read("p"))
    assert isinstance(done.value.value, StaleFence)
    assert fence.resolve("p") == b"c"


def test_hand_written_pointer_is_refused_and_kept(fence: S3Fence) -> None:
    evil = b'{"visible": "reports/evil", "fence": 1}'
    fence.client.put_object(Bucket=fence.bucket, Key="pointers/july", Body=evil)
    result = fence.publish("pointers/july", fence.stage("pointers/july", 99, b"x"), 99)
    assert isinstance(result, Rejected) and result.code == "invalid_mark", result
    assert "is not a fence mark" in result.message and "nothing changed" in result.message
    assert body(fence, "pointers/july") == evil


def test_bad_input_changes_nothing(fence: S3Fence) -> None:
    key = fence.stage("p", 1, b"x")
    for bad in ("abc", -1, 0, True, 4.2):
        with pytest.raises(FenceInputError, match="invalid token"):
            fence.publish("p", key, bad)
        with pytest.raises(FenceInputError, match="invalid token"):
            fence.stage("p", bad, b"y")
    with pytest.raises(FenceInputError, match="pointer key"):
        fence.publish("", key, 1)
    assert fence.read("p") is None
    missing = fence.publish("p", "staging/never-written", 1)
    assert isinstance(missing, Rejected) and missing.code == "not_found"
    assert fence.read("p") is None


def test_staged_objects_are_immutable(fence: S3Fence) -> None:
    key = fence.stage("p", 7, b"first")
    with pytest.raises(Exception, match=r"PreconditionFailed|412"):
        fence.client.put_object(Bucket=fence.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert body(fence, key) == b"first"


def test_garbage_collection_deletes_only_what_can_never_be_visible(fence: S3Fence) -> None:
    crashed = fence.stage("pointers/july", 41, b"A crashed before publishing")
    current = fence.stage("pointers/july", 42, b"B's next output, not yet published")
    published = fence.stage("pointers/july", 42, b"B's published output")
    assert isinstance(fence.publish("pointers/july", published, 42), Applied)
    young = fence.collect_garbage(min_age=3600)
    assert young.deleted == [] and young.kept_young == 1
    done = fence.collect_garbage()
    assert done.deleted == [crashed]  # token 41 < the accepted 42: it can never be published
    assert done.kept_referenced == 1 and done.kept_current == 1  # 42 may still publish it
    assert isinstance(fence.publish("pointers/july", crashed, 41), Rejected | StaleFence)
    assert fence.resolve("pointers/july") == b"B's published output"
    assert isinstance(fence.publish("pointers/july", current, 42), Applied)
    # A pointer someone else wrote: its objects are left alone.
    orphan = fence.stage("pointers/hand", 1, b"x")
    fence.client.put_object(Bucket=fence.bucket, Key="pointers/hand", Body=b"{}")
    newest = fence.stage("pointers/july", 43, b"C's output")
    assert isinstance(fence.publish("pointers/july", newest, 43), Applied)
    later = fence.collect_garbage()
    assert sorted(later.deleted) == sorted([published, current])  # 42 < 43, neither visible
    assert orphan not in later.deleted and later.kept_referenced == 1
    assert fence.resolve("pointers/july") == b"C's output"
