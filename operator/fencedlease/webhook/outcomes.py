"""Each fenced write's outcome, once: pure, with an injected clock.

The API server may call the webhook several times for one write: a PATCH or PUT is tried on
the watch cache's copy of the object first and re-run on the current one when that copy was
stale, and a write that loses a race in storage is re-run on the winner's object.  Only the
last call decides what the client sees.  :class:`WriteOutcomes` therefore keys the calls by the
write's identity (:class:`WriteId`: the artifact, kind of write, writer, token, operation id
and a digest of the written content) and decides when an outcome is final:

* a **denial** ends the request: it is counted at once; the same denial again within
  :attr:`~WriteOutcomes.window` seconds is the API server re-running the request (a write
  denied on a stale copy is denied on the current one), not counted again;
* an **admission** may still be re-run (a conflict in storage): it is pending until its
  identity has been quiet for ``window`` seconds (then counted), replaced by a later call, or
  voided by a call whose write cannot commit (the resourceVersion precondition fails: the
  client sees 409 Conflict, not a fence result);
* a **void** call counts nothing.

Limit: the same writer sending the very same write (same artifact, token, operation id and
content) twice within ``window`` seconds is counted once.  State is bounded: past
``max_writes`` identities the oldest is settled early.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")

WINDOW = 5.0
MAX_WRITES = 10_000


class Ruling(enum.Enum):
    """What one admission call decided for a write."""

    ALLOWED = "allowed"
    DENIED = "denied"
    VOID = "void"
    """Admitted, but the write cannot commit (its precondition fails)."""


@dataclass(frozen=True, slots=True)
class WriteId:
    """The identity of one write across the API server's re-runs of its admission."""

    namespace: str
    name: str
    kind: str
    writer: str
    token: int
    operation_id: str | None
    content: str
    """Digest of what the write sets (the new object's spec, or status for status writes)."""


def content_digest(value: Any) -> str:
    """A short, stable digest of a JSON value (key order does not matter)."""
    try:
        raw = orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # what orjson refuses (a lone surrogate, a non-str key): json's form
        raw = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(slots=True)
class _Entry(Generic[T]):
    call: Ruling
    outcome: T
    at: float


class WriteOutcomes(Generic[T]):
    """Turns admission calls into write outcomes, each counted once (see the module doc).

    :meth:`observe`, :meth:`due` and :meth:`flush` return the outcomes that became final, in
    order; the caller counts them (and posts their Events).
    """

    def __init__(
        self, clock: Callable[[], float], *, window: float = WINDOW, max_writes: int = MAX_WRITES
    ) -> None:
        if window <= 0 or max_writes < 1:
            raise ValueError("window must be positive and max_writes at least 1")
        self.clock = clock
        self.window = window
        self.max_writes = max_writes
        self._writes: OrderedDict[WriteId, _Entry[T]] = OrderedDict()

    def observe(self, write: WriteId, call: Ruling, outcome: T) -> list[T]:
        """One admission call for ``write``; returns the outcomes final now."""
        now = self.clock()
        final = self._expire(now)
        entry = self._writes.pop(write, None)
        if call is Ruling.DENIED:
            if entry is None or entry.call is not Ruling.DENIED:
                final.append(outcome)  # a denial ends the request (a pending admission lost)
            entry = _Entry(Ruling.DENIED, outcome, now)
        elif call is Ruling.ALLOWED:
            entry = _Entry(Ruling.ALLOWED, outcome, now)  # pending: the last admission wins
        elif entry is None or entry.call is Ruling.ALLOWED:
            entry = _Entry(Ruling.VOID, outcome, now)  # the pending admission cannot commit
        else:
            entry.at = now
        self._writes[write] = entry
        while len(self._writes) > self.max_writes:
            _, oldest = self._writes.popitem(last=False)
            if oldest.call is Ruling.ALLOWED:
                final.append(oldest.outcome)
        return final

    def due(self) -> list[T]:
        """Admissions whose write has been quiet for ``window`` seconds (now final)."""
        return self._expire(self.clock())

    def flush(self) -> list[T]:
        """Every pending admission, final now (shutdown; tests once the clients finished)."""
        final = [e.outcome for e in self._writes.values() if e.call is Ruling.ALLOWED]
        self._writes.clear()
        return final

    @property
    def pending(self) -> int:
        """Admissions not yet counted."""
        return sum(1 for e in self._writes.values() if e.call is Ruling.ALLOWED)

    def _expire(self, now: float) -> list[T]:
        final: list[T] = []
        while self._writes:
            write, oldest = next(iter(self._writes.items()))
            if now - oldest.at < self.window:
                break
            del self._writes[write]
            if oldest.call is Ruling.ALLOWED:
                final.append(oldest.outcome)
        return final
