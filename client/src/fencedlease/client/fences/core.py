"""What every fence shares: token and name checks, the fence mark, the decision, the CAS plan.

A fence keeps a **mark** next to the state it protects: the highest fencing token it accepted,
a version that counts applied writes, what is visible, and the operation ids applied under the
current token (so a retry is a ``Duplicate``, never a second apply).  :func:`decide` is the
article's rule, without I/O::

    token < mark.fence                       -> StaleFence   (definitive)
    token == mark.fence, operation applied   -> Duplicate    (success)
    expected_version != mark.version         -> Rejected("version_conflict")
    otherwise                                -> the new mark (fence = token, version + 1)

Stores with a compare-and-swap on a whole record (etcd's ``mod_revision``, S3's ``ETag``) run it
as :func:`cas_plan`: read the mark, decide, write conditionally on what was read; a lost race is
re-read and re-decided.  Redis runs the same rule inside one Lua script (docs/fences.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypedDict, Union

from fencedlease.client.errors import FencedLeaseError
from fencedlease.client.plans import Run
from fencedlease.client.results import Applied, Duplicate, Rejected, StaleFence, Unavailable
from fencedlease.client.validation import MAX_TOKEN, InvalidInput

FenceResult = Union[Applied, Duplicate, StaleFence, Rejected, Unavailable]
"""What every fence's ``publish``/``put``/``delete`` returns (:mod:`fencedlease.client.results`)."""

"""Tokens are etcd revisions (int64), stored as BIGINT by the SQL fences."""

MAX_OPERATIONS = 64
"""Operation ids remembered per token: a retry of an older one (65 same-token writes later) is no
longer recognised as a ``Duplicate`` (pass ``expected_version`` to refuse it instead)."""

MARK_FORMAT = "fencedlease.io/fence-mark/v1"

# \Z, not $: "$" also matches before a final newline ("42\n" is not a token).
_OPERATION = re.compile(r"[\x21-\x7e]{1,200}\Z")
_DIGITS = re.compile(r"[1-9][0-9]{0,18}\Z")
"""A token's one text (the servers' own checks use the same: docs/fences.md)."""


class FenceInputError(InvalidInput):
    """Bad input to a fence (a token that is not a positive integer, an unsafe name): refused
    before anything is sent, so nothing changed."""


def check_token(token: object) -> int:
    """``token`` as a positive int64, or :class:`FenceInputError`.

    Accepts an ``int`` (never a ``bool``) or a string of ASCII decimal digits without a leading
    zero (a token read from a file or a command line); refuses floats, signs, blanks, zero and
    anything above int64."""
    if isinstance(token, bool) or not isinstance(token, (int, str)):
        raise FenceInputError(
            f"invalid token {token!r}: a fencing token is a positive integer, "
            f"not {type(token).__name__}"
        )
    if isinstance(token, str):
        if not _DIGITS.match(token):
            raise FenceInputError(
                f"invalid token {token!r}: a fencing token is a positive decimal integer"
            )
        token = int(token)
    if not 1 <= token <= MAX_TOKEN:
        raise FenceInputError(f"invalid token {token}: must be between 1 and {MAX_TOKEN}")
    return token


def check_operation_id(operation_id: object) -> str | None:
    """``None`` or 1-200 printable ASCII characters without spaces."""
    if operation_id is None:
        return None
    if not isinstance(operation_id, str) or not _OPERATION.match(operation_id):
        raise FenceInputError(
            f"invalid operation id {operation_id!r}: 1-200 printable ASCII characters, no spaces"
        )
    return operation_id


def check_version(version: object) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise FenceInputError(f"invalid expected version {version!r}: a non-negative integer")
    return version


def check_name(name: object, what: str, limit: int = 1024) -> str:
    """A key or resource name: a non-empty string of at most ``limit`` UTF-8 bytes, no NUL."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise FenceInputError(f"invalid {what} {name!r}: a non-empty string without NUL")
    if len(name.encode()) > limit:
        raise FenceInputError(f"invalid {what}: longer than {limit} bytes")
    return name


class WriteOptions(TypedDict, total=False):
    """The keywords of every fenced write (see :class:`FenceRequest`)."""

    operation_id: object
    expected_version: object
    strict: bool


@dataclass(frozen=True)
class FenceRequest:
    """One fenced write: make ``value`` visible at ``resource`` under ``token``.

    ``value=None`` removes it (a fenced delete).  ``strict``: one write per grant
    (``accepted < token``) instead of ``accepted <= token``."""

    resource: str
    token: int
    value: str | None
    operation_id: str | None = None
    expected_version: int | None = None
    strict: bool = False

    @classmethod
    def checked(
        cls,
        resource: object,
        token: object,
        value: str | None,
        *,
        operation_id: object = None,
        expected_version: object = None,
        strict: bool = False,
    ) -> FenceRequest:
        """A request from untrusted arguments (:class:`FenceInputError` when one is bad)."""
        if value is not None:
            check_name(value, "value", limit=1 << 20)
        return cls(
            check_name(resource, "resource"),
            check_token(token),
            value,
            check_operation_id(operation_id),
            check_version(expected_version),
            bool(strict),
        )


@dataclass(frozen=True)
class Mark:
    """A fence's memory: accepted fence, version (applied writes), the visible value, the
    operation ids applied under ``fence`` (the newest :data:`MAX_OPERATIONS`)."""

    fence: int = 0
    version: int = 0
    visible: str | None = None
    operations: tuple[str, ...] = ()

    def encode(self) -> bytes:
        body = {
            "format": MARK_FORMAT,
            "fence": self.fence,
            "version": self.version,
            "visible": self.visible,
            "operations": list(self.operations),
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


class InvalidMark(FencedLeaseError):
    """A stored mark (an S3 pointer, an etcd mark key) that this library did not write."""


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose fields are all different (``{"fence": 99, "fence": 1}`` reads
    differently to different parsers: not a mark)."""
    body = dict(pairs)
    if len(body) != len(pairs):
        raise ValueError(f"a field appears twice in {sorted(k for k, _ in pairs)}")
    return body


def decode_mark(data: bytes, where: str) -> Mark:
    """Parse a stored mark, checking every field; :class:`InvalidMark` says what is wrong."""
    try:
        body: Any = json.loads(data, object_pairs_hook=_unique_fields)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMark(f"{where} is not a fence mark (not JSON: {exc})") from None
    if not isinstance(body, dict) or body.get("format") != MARK_FORMAT:
        raise InvalidMark(f"{where} is not a fence mark (no format {MARK_FORMAT!r})")
    if set(body) != {"format", "fence", "version", "visible", "operations"}:
        raise InvalidMark(f"{where}: unexpected fields {sorted(body)}")
    fence, version, visible, ops = (body[k] for k in ("fence", "version", "visible", "operations"))
    for name, number in (("fence", fence), ("version", version)):
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_TOKEN:
            raise InvalidMark(f"{where}: {name} {number!r} is not a non-negative int64")
    if visible is not None and (not isinstance(visible, str) or not visible or "\x00" in visible):
        raise InvalidMark(f"{where}: visible {visible!r:.80} is not a key")
    if (
        not isinstance(ops, list)
        or len(ops) > MAX_OPERATIONS
        or not all(isinstance(o, str) and _OPERATION.match(o) for o in ops)
    ):
        raise InvalidMark(f"{where}: operations is not a list of operation ids")
    return Mark(fence, version, visible, tuple(ops))


def decide(mark: Mark | None, req: FenceRequest, where: str) -> Mark | FenceResult:
    """The new mark to write, or the final result (no I/O)."""
    cur = mark or Mark()
    if (
        req.operation_id is not None
        and req.token == cur.fence
        and req.operation_id in cur.operations
    ):
        return Duplicate(
            req.token,
            req.operation_id,
            f"duplicate: operation {req.operation_id} was already applied to {where} "
            f"(accepted fence {cur.fence})",
        )
    if req.token < cur.fence or (req.strict and req.token == cur.fence):
        rule = "is not above" if req.token == cur.fence else "is below"
        return StaleFence(
            req.token,
            f"stale_fence: fence {req.token} {rule} the accepted fence {cur.fence} of {where}",
        )
    if req.expected_version is not None and req.expected_version != cur.version:
        return Rejected(
            "version_conflict",
            f"version_conflict: {where} is at version {cur.version}, the write was prepared "
            f"against {req.expected_version}",
        )
    ops = cur.operations if req.token == cur.fence else ()
    if req.operation_id is not None:
        ops = (*ops, req.operation_id)[-MAX_OPERATIONS:]
    return Mark(req.token, cur.version + 1, req.value, ops)


def applied(req: FenceRequest, mark: Mark, where: str) -> Applied:
    shows = "nothing" if mark.visible is None else mark.visible
    return Applied(
        req.token,
        req.value,
        req.operation_id,
        str(mark.version),
        f"applied: {where} shows {shows} at fence {req.token} (version {mark.version})",
    )


# ----------------------------------------------------------------------------- the CAS plan


@dataclass(frozen=True)
class ReadMark:
    """Read the stored mark; answer with a :class:`Snapshot`."""


@dataclass(frozen=True)
class Snapshot:
    """The stored mark's bytes (``None``: absent) and its CAS tag (ETag, mod_revision)."""

    data: bytes | None
    tag: str | None


@dataclass(frozen=True)
class WriteMark:
    """Write ``mark`` (and the store's own effect of ``request``) only if the stored mark still
    has tag ``tag`` (``None``: only if still absent).  Answer ``True`` if written, ``False`` if
    the precondition failed."""

    mark: Mark
    tag: str | None
    request: FenceRequest


CasStep = Union[ReadMark, WriteMark]
CasPlan = Generator[CasStep, Union[Snapshot, bool], FenceResult]


def cas_plan(req: FenceRequest, where: str, attempts: int = 32) -> CasPlan:
    """Read, decide, write conditionally; a lost race is re-read and re-decided (bounded)."""
    for _ in range(max(1, attempts)):
        snap = yield ReadMark()
        assert isinstance(snap, Snapshot)
        try:
            mark = None if snap.data is None else decode_mark(snap.data, where)
        except InvalidMark as exc:
            return Rejected(
                "invalid_mark", f"invalid_mark: {exc}; refusing to overwrite it (nothing changed)"
            )
        decision = decide(mark, req, where)
        if not isinstance(decision, Mark):
            return decision
        written = yield WriteMark(decision, snap.tag, req)
        if written:
            return applied(req, decision, where)
    return Unavailable(f"{where}: lost {attempts} compare-and-swap races in a row", attempts)


def drive(
    plan: CasPlan, read: Callable[[], Snapshot], write: Callable[[WriteMark], bool]
) -> FenceResult:
    """Run a :func:`cas_plan` with blocking I/O (``read`` the mark, ``write`` conditionally)."""
    run = Run(plan)
    for step in run:
        run.answer = read() if isinstance(step, ReadMark) else write(step)
    return run.result


async def drive_async(
    plan: CasPlan,
    read: Callable[[], Awaitable[Snapshot]],
    write: Callable[[WriteMark], Awaitable[bool]],
) -> FenceResult:
    """Run a :func:`cas_plan` with asyncio I/O; same steps as :func:`drive`."""
    run = Run(plan)
    for step in run:
        run.answer = await read() if isinstance(step, ReadMark) else await write(step)
    return run.result
