"""A fence for object storage (the S3 API): immutable staging objects and a fenced pointer.

The article's pattern for a store that cannot compare a token: write the output as an
**immutable** object under a new key (harmless: nothing shows it), then atomically advance a
small **pointer object** that says which object is visible and which fence it accepted.  The
pointer is advanced with S3 conditional writes, the store's compare-and-swap:

* first publish: ``PUT pointer`` with ``If-None-Match: *`` (only if there is none);
* later ones: ``PUT pointer`` with ``If-Match: <the ETag read>`` (only if unchanged),

after :func:`~fencedlease.client.fences.core.decide` compared the token with the fence the
pointer recorded (``412 Precondition Failed``: someone published in between; re-read,
re-decide, which says ``stale_fence`` if they carried a newer token).  The pointer's body is the
fence mark (JSON: ``fence``, ``version``, ``visible``, ``operations``); a pointer this library
did not write (hand-edited, another tool's) is refused (``Rejected("invalid_mark")``) and left
as it is.  Readers resolve the pointer and read the object it names, never a fixed key.

Staged objects are written with ``If-None-Match: *`` too (never overwritten), under a key that
names their pointer and token, and belong to that pointer: ``publish`` refuses another
pointer's staged object, and one staged under another token unless the pointer already shows it
(to advance the fence and keep what is visible).  So :meth:`S3Fence.collect_garbage` can decide
on each staged object by its own pointer alone: it deletes it only when it can never become
visible, i.e. that pointer shows another object *and* accepted a fence above the object's token
(a crash between staging and publication leaves such objects behind; the next generation's
publish makes them collectable).  Keys under the staging prefix that :meth:`S3Fence.stage` did
not write (``staging/p/uni/²-x``) are not ours: left alone.

The client is ``botocore`` (``pip install 'fencedlease-client[s3]'``): it signs (SigV4), retries and
speaks every S3-compatible server, without boto3's resource layer; we call three operations.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from 3.11 on

from fencedlease.client.fences.core import (
    FenceInputError,
    FenceRequest,
    FenceResult,
    InvalidMark,
    Mark,
    Snapshot,
    WriteMark,
    WriteOptions,
    cas_plan,
    check_name,
    check_token,
    decode_mark,
    drive,
)
from fencedlease.client.results import Rejected, Unavailable
from fencedlease.client.validation import MAX_TOKEN


class _Missing(Exception):
    """The object to publish does not exist (raised between the decision and the write)."""


class _OtherToken(Exception):
    """A staged object published under a token other than its own, and not to keep what the
    pointer already shows (raised between the decision and the write)."""


def _shows(last: list[Snapshot], key: str) -> bool:
    """Does the pointer as last read (and decided on) show ``key``?"""
    if not last or last[0].data is None:
        return False
    return decode_mark(last[0].data, "pointer").visible == key


_RACE_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_ABSENT_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def s3_client(
    endpoint_url: str | None,
    access_key: str | None,
    secret_key: str | None,
    *,
    region: str = "us-east-1",
    path_style: bool = True,
    attempts: int = 3,
) -> Any:
    """A botocore S3 client (``endpoint_url=None``: AWS; path-style for MinIO and friends)."""
    try:
        import botocore.config
        import botocore.session
    except ModuleNotFoundError as missing:  # say which extra brings it
        raise ModuleNotFoundError(
            f"the S3 fence needs {missing.name}: pip install 'fencedlease-client[s3]' "
            "(docs/fences.md)",
            name=missing.name,
        ) from None

    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=botocore.config.Config(
            s3={"addressing_style": "path" if path_style else "auto"},
            retries={"max_attempts": attempts, "mode": "standard"},
        ),
    )


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@dataclass
class Collected:
    """What :meth:`S3Fence.collect_garbage` did: deleted keys, and how many it kept because a
    pointer shows them, because their token may still publish, because they are young."""

    deleted: list[str]
    kept_referenced: int
    kept_current: int
    kept_young: int


_LEAF = re.compile(r"([1-9][0-9]{0,18})-[0-9a-f]{32}\Z")
"""The last part of a key :meth:`S3Fence.stage` writes: ``<token>-<uuid4 hex>``."""


def _staged(key: str, prefix: str) -> tuple[str, int] | None:
    """``(pointer, token)`` of a staged key (``None``: not one of ours, left alone: a stray
    ``staging/p/uni/²-x`` or ``staging/p/٤٢-x`` is not a token, whatever ``str.isdigit``
    says)."""
    if not key.startswith(prefix):
        return None
    pointer, _, leaf = key.removeprefix(prefix).rpartition("/")
    found = _LEAF.match(leaf)
    if not pointer or found is None or int(found[1]) > MAX_TOKEN:
        return None
    return pointer, int(found[1])


class S3Fence:
    """Fenced pointers in ``bucket``.

    >>> fence = S3Fence(s3_client("http://127.0.0.1:9000", "key", "secret"), "reports")
    >>> key = fence.stage("pointers/july", 42, render())                # doctest: +SKIP
    >>> fence.publish("pointers/july", key, token=42)                   # doctest: +SKIP
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        *,
        staging_prefix: str = "staging/",
        attempts: int = 32,
        check_object: bool = True,
    ) -> None:
        self.client = client
        self.bucket = check_name(bucket, "bucket", limit=63)
        if not check_name(staging_prefix, "staging prefix").endswith("/"):
            raise FenceInputError(
                f"invalid staging prefix {staging_prefix!r}: a folder, ending with '/'"
            )
        self.staging_prefix = staging_prefix
        self.attempts = attempts
        self.check_object = check_object

    # ------------------------------------------------------------------ staging

    def stage(self, pointer: str, token: object, data: bytes) -> str:
        """Write ``data`` as a new immutable object for ``pointer`` under ``token``; its key,
        ``<staging prefix><pointer>/<token>-<nonce>`` (the collector reads both back)."""
        checked = check_token(token)
        self._pointer(pointer)
        key = f"{self.staging_prefix}{pointer}/{checked}-{uuid.uuid4().hex}"
        check_name(key, "object key")
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, IfNoneMatch="*")
        return key

    # ------------------------------------------------------------------ publish

    def publish(
        self, pointer: str, object_key: str, token: object, **options: Unpack[WriteOptions]
    ) -> FenceResult:
        """Point ``pointer`` at ``object_key`` if ``token`` may write (``operation_id``,
        ``expected_version``, ``strict``: :class:`FenceRequest`)."""
        import botocore.exceptions

        visible = check_name(object_key, "object key")
        req = FenceRequest.checked(self._pointer(pointer), token, visible, **options)
        staged = self._own_staged(pointer, object_key)
        where = f"s3://{self.bucket}/{pointer}"
        checked = not self.check_object
        last: list[Snapshot] = []

        def read() -> Snapshot:
            last[:] = [self._read(pointer)]
            return last[0]

        def write(step: WriteMark) -> bool:
            nonlocal checked
            if staged is not None and staged != req.token and not _shows(last, object_key):
                raise _OtherToken
            if not checked:  # only a publish the fence admits asks; a stale one is told so
                if not self._exists(object_key):
                    raise _Missing
                checked = True
            return self._write(pointer, step)

        try:
            return drive(cas_plan(req, where, self.attempts), read, write)
        except _Missing:
            return Rejected(
                "not_found", f"not_found: s3://{self.bucket}/{object_key} does not exist"
            )
        except _OtherToken:
            return Rejected(
                "invalid",
                f"invalid: {object_key} was staged under token {staged}, not {req.token}: "
                f"publish it under {staged} or stage the output again (nothing changed)",
            )
        except (
            botocore.exceptions.ClientError,
            botocore.exceptions.BotoCoreError,
        ) as exc:
            return Unavailable(f"{where}: S3 request failed: {exc}", 1)

    def read(self, pointer: str) -> Mark | None:
        """The pointer as stored (``None``: never published); :class:`InvalidMark` if someone
        else wrote it."""
        snap = self._read(pointer)
        if snap.data is None:
            return None
        return decode_mark(snap.data, f"s3://{self.bucket}/{pointer}")

    def resolve(self, pointer: str) -> bytes | None:
        """The bytes of the object ``pointer`` makes visible (``None``: nothing published)."""
        mark = self.read(pointer)
        if mark is None or mark.visible is None:
            return None
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=mark.visible)["Body"].read()
        return body

    # ------------------------------------------------------------------ garbage

    def collect_garbage(self, *, min_age: float = 0.0, now: float | None = None) -> Collected:
        """Delete staged objects that can never become visible: not what their pointer shows,
        and staged under a token **below** the pointer's accepted fence (a publish of them
        would be stale, forever).  Staged output of a crashed writer goes once a newer
        generation published; output of the current generation stays.  ``min_age`` keeps
        objects younger than that (a reader may still be reading one it resolved just before
        the pointer moved).  A pointer someone else wrote is left alone with its objects."""
        now = time.time() if now is None else now
        by_pointer: dict[str, list[tuple[str, int, float]]] = {}
        for key, modified in self._list(self.staging_prefix):
            parsed = _staged(key, self.staging_prefix)
            if parsed is not None:
                by_pointer.setdefault(parsed[0], []).append((key, parsed[1], modified))
        out = Collected([], 0, 0, 0)
        for pointer, objects in sorted(by_pointer.items()):
            try:
                mark = self.read(pointer)
            except InvalidMark:
                out.kept_current += len(objects)
                continue
            for key, token, modified in objects:
                if mark is not None and key == mark.visible:
                    out.kept_referenced += 1
                elif mark is None or token >= mark.fence:
                    out.kept_current += 1
                elif now - modified < min_age:
                    out.kept_young += 1
                else:
                    self.client.delete_object(Bucket=self.bucket, Key=key)
                    out.deleted.append(key)
        return out

    # ------------------------------------------------------------------ checks

    def _pointer(self, pointer: str) -> str:
        if check_name(pointer, "pointer key").startswith(self.staging_prefix):
            raise FenceInputError(
                f"invalid pointer key {pointer!r}: it is under the staging prefix "
                f"{self.staging_prefix!r}, where the collector deletes what it finds"
            )
        return pointer

    def _own_staged(self, pointer: str, object_key: str) -> int | None:
        """The token ``object_key`` was staged under, if it is a staged key; refuses another
        pointer's staged object: the collector decides on each object by its own pointer
        alone, so a staged object is published by that pointer only (docs/fences.md)."""
        if object_key == pointer:
            raise FenceInputError(f"invalid object key {object_key!r}: it is the pointer itself")
        staged = _staged(object_key, self.staging_prefix)
        if staged is None:
            return None
        if staged[0] != pointer:
            raise FenceInputError(
                f"invalid object key {object_key!r}: it was staged for pointer {staged[0]!r}, "
                f"not {pointer!r}; stage the output for {pointer!r} (a staged object belongs "
                "to one pointer)"
            )
        return staged[1]

    # ------------------------------------------------------------------ I/O

    def _exists(self, key: str) -> bool:
        import botocore.exceptions

        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _ABSENT_CODES:
                return False
            raise
        return True

    def _read(self, pointer: str) -> Snapshot:
        import botocore.exceptions

        try:
            got = self.client.get_object(Bucket=self.bucket, Key=pointer)
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _ABSENT_CODES:
                return Snapshot(None, None)
            raise
        return Snapshot(got["Body"].read(), str(got["ETag"]))

    def _write(self, pointer: str, step: WriteMark) -> bool:
        import botocore.exceptions

        condition = {"IfNoneMatch": "*"} if step.tag is None else {"IfMatch": step.tag}
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=pointer,
                Body=step.mark.encode(),
                ContentType="application/json",
                **condition,
            )
        except botocore.exceptions.ClientError as exc:
            if _code(exc) in _RACE_CODES:
                return False
            raise
        return True

    def _list(self, prefix: str) -> Iterator[tuple[str, float]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                yield str(obj["Key"]), obj["LastModified"].timestamp()


__all__ = ["Collected", "InvalidMark", "S3Fence", "s3_client"]
