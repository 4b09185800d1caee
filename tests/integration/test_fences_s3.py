"""The S3 fence on a real S3 server (MinIO built from its Go module): the conditional writes
really are compare-and-swaps, a hand-written pointer is refused and kept, staged objects are
immutable, garbage collection never deletes what a pointer references."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fencedlease.client import Applied, Rejected, StaleFence
from fencedlease.client.fences import FenceInputError, FenceRequest
from fencedlease.client.fences.core import MARK_FORMAT, ReadMark, WriteMark, cas_plan
from fencedlease.client.fences.s3 import S3Fence, s3_client

from ..fence_servers import MinioServer
from .fence_adapters import HOSTILE_MARKS

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


# ----------------------------------------------------------------------------- issue 42


def test_a_staged_object_belongs_to_its_pointer(fence: S3Fence) -> None:
    """Issue 42 item 6, the exact reproduction: one staged object published by two pointers;
    the first moves on; the collector deleted the object the second still published (NoSuchKey).
    A staged object now belongs to the pointer it was staged for: the second publish is refused
    before anything is sent, so the collector's per-pointer decision is sound."""
    shared = fence.stage("pointers/p1", 42, b"report")
    assert isinstance(fence.publish("pointers/p1", shared, 42), Applied)
    with pytest.raises(FenceInputError, match="staged for pointer 'pointers/p1'"):
        fence.publish("pointers/p2", shared, 42)
    assert fence.read("pointers/p2") is None
    # Publishing it for p2 means staging it for p2: then each pointer has its own object.
    own = fence.stage("pointers/p2", 42, fence.resolve("pointers/p1") or b"")
    assert isinstance(fence.publish("pointers/p2", own, 42), Applied)
    newer = fence.stage("pointers/p1", 43, b"next")
    assert isinstance(fence.publish("pointers/p1", newer, 43), Applied)  # the first moves on
    done = fence.collect_garbage()
    assert done.deleted == [shared]
    assert fence.resolve("pointers/p2") == b"report"  # still there
    assert fence.resolve("pointers/p1") == b"next"


def test_a_staged_object_is_published_under_its_own_token(fence: S3Fence) -> None:
    """Else the collector could delete it while a current writer publishes it: 41's object,
    collectable once 42 is accepted, must not become visible under 42 or 43."""
    old = fence.stage("p", 41, b"a")
    assert isinstance(fence.publish("p", fence.stage("p", 42, b"b"), 42), Applied)
    for token in (42, 43):
        refused = fence.publish("p", old, token)
        assert isinstance(refused, Rejected) and refused.code == "invalid", refused
        assert "staged under token 41" in refused.message
    assert fence.resolve("p") == b"b" and fence.read("p") is not None
    assert fence.collect_garbage().deleted == [old]
    # Advancing the fence while keeping what is visible is still allowed.
    shown = fence.read("p")
    assert shown is not None and shown.visible is not None
    assert isinstance(fence.publish("p", shown.visible, 44, operation_id="advance"), Applied)
    assert fence.resolve("p") == b"b"


def test_pointer_and_object_keys_that_would_confuse_the_collector(fence: S3Fence) -> None:
    key = fence.stage("p", 1, b"x")
    for pointer in ("staging/q", "staging/q/5-" + "a" * 32):
        with pytest.raises(FenceInputError, match="under the staging prefix"):
            fence.publish(pointer, key, 1)
        with pytest.raises(FenceInputError, match="under the staging prefix"):
            fence.stage(pointer, 1, b"x")
    with pytest.raises(FenceInputError, match="the pointer itself"):
        fence.publish("p", "p", 1)
    for prefix in ("", "staging"):
        with pytest.raises(FenceInputError, match="staging prefix"):
            S3Fence(fence.client, fence.bucket, staging_prefix=prefix)
    assert fence.read("p") is None


STRAYS = [
    "staging/p/uni/\u00b2-x",  # isdigit() is True, int() raises
    "staging/p/\u0664\u0662-" + "a" * 32,  # Arabic-Indic 42: isdigit() and int() both accept
    "staging/p/0041-" + "a" * 32,
    "staging/p/" + "1" * 23 + "-" + "a" * 32,
    "staging/p/9223372036854775808-" + "a" * 32,
    "staging/p/41-x",
    "staging/p/41-" + "A" * 32,
    "staging/41-" + "a" * 32,
    "staging/p/41-" + "a" * 32 + "/",
]


def test_garbage_collection_skips_keys_that_are_not_ours(fence: S3Fence) -> None:
    """Issue 42 item 19: a stray ``staging/p/uni/²-x`` made the collector raise ValueError.
    Keys ``stage`` could not have written are not ours: left alone, whatever their pointer."""
    for key in STRAYS:
        fence.client.put_object(Bucket=fence.bucket, Key=key, Body=b"someone's")
    for pointer in ("p", "p/uni"):
        staged = fence.stage(pointer, 43, b"ours")
        assert isinstance(fence.publish(pointer, staged, 43), Applied)
    ours = fence.stage("p", 42, b"collectable")
    done = fence.collect_garbage()
    assert done.deleted == [ours]
    left = {k for k, _ in fence._list("staging/")}
    assert set(STRAYS) <= left


@pytest.mark.parametrize("template", HOSTILE_MARKS)
def test_hand_written_hostile_pointers_are_refused(fence: S3Fence, template: bytes) -> None:
    """S3 runs no code of ours (its conditions compare ETags only): a pointer written by hand is
    checked when read back, refused, kept, and its staged objects are not collected."""
    mark = template.replace(b"%s", MARK_FORMAT.encode())
    staged = fence.stage("p", 1, b"x")
    fence.client.put_object(Bucket=fence.bucket, Key="p", Body=mark)
    result = fence.publish("p", staged, 100)
    assert isinstance(result, Rejected) and result.code == "invalid_mark", result
    assert body(fence, "p") == mark
    assert fence.collect_garbage().deleted == []
