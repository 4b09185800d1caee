"""Event correlation: which Event an observation updates, and whether it is posted at all.

The decisions of client-go's ``EventCorrelator`` (``tools/record/events_cache.go``), pure and
with an injected clock; :class:`fencedlease.events.KubeEvents` does the I/O.

1. **Similar events are aggregated.** Observations with the same involved object, type and
   reason but different messages are separate Events until :attr:`similar_max` distinct
   messages were seen without a pause of :attr:`similar_window` seconds; from then on they all
   update one Event whose message starts with :data:`COMBINED`.
2. **Identical events are one Event with a growing count.** The same object, type, reason and
   message (or the combined Event) → one Event: the first observation creates it, each later
   one PATCHes its ``count`` (and ``series``) instead of creating another object.
3. **Spam is filtered per object.** Each involved object has a token bucket of :attr:`burst`
   posts, refilled by one every :attr:`refill_seconds`; an observation without a token is
   :class:`Dropped` (counted by the caller, never in an Event's count).

So for every (object, reason): the counts of its Events plus the dropped observations are
all the observations.  State is bounded (least recently used entries are forgotten first):
forgetting a series means the next observation creates a new Event; forgetting a bucket
gives that object a full burst again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

COMBINED = "(combined from similar events): "
"""Prefix of the message of an aggregated Event (client-go's wording)."""

BURST = 25
REFILL_SECONDS = 300.0
SIMILAR_MAX = 10
SIMILAR_WINDOW = 600.0
MAX_ENTRIES = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Record:
    """Post this observation: create an Event (``name is None``) or patch Event ``name``.

    ``count`` is the Event's count once posted; ``first``/``last`` are clock readings of its
    first and this observation.  Hand it back with :meth:`EventCorrelator.posted` once the API
    took it (the series then knows the Event's name and count).
    """

    key: tuple[Hashable, ...]
    message: str
    count: int
    first: float
    last: float
    name: str | None


@dataclass(frozen=True, slots=True)
class Dropped:
    """Not posted: the involved object's bucket is empty (``cause`` is ``rate_limited``)."""

    cause: str = "rate_limited"


@dataclass(slots=True)
class _Series:
    name: str
    count: int
    first: float


@dataclass(slots=True)
class _Similar:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class _Lru(Generic[K, V]):
    """A dict that forgets its least recently used entries beyond ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class EventCorrelator:
    """Decides, for each observation, which Event it updates or that it is dropped.

    ``clock``: seconds (wall time: the records' ``first``/``last`` become Event timestamps).
    Not thread safe; the caller serializes the observe → post → :meth:`posted` of one
    (object, type, reason) so that a create completes before its first patch.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        burst: int = BURST,
        refill_seconds: float = REFILL_SECONDS,
        similar_max: int = SIMILAR_MAX,
        similar_window: float = SIMILAR_WINDOW,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        if burst < 1 or refill_seconds <= 0 or similar_max < 1:
            raise ValueError("burst and similar_max must be >= 1, refill_seconds > 0")
        self.clock = clock
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.similar_max = similar_max
        self.similar_window = similar_window
        self._series: _Lru[tuple[Hashable, ...], _Series] = _Lru(max_entries)
        self._similar: _Lru[tuple[Hashable, ...], _Similar] = _Lru(max_entries)
        self._buckets: _Lru[Hashable, _Bucket] = _Lru(max_entries)

    def observe(self, obj: Hashable, type_: str, reason: str, message: str) -> Record | Dropped:
        """One observation of an Event about ``obj`` (any hashable identity of the object)."""
        now = self.clock()
        key, message = self._aggregate(obj, type_, reason, message, now)
        if not self._take_token(obj, now):
            return Dropped()
        series = self._series.get(key)
        if series is None:
            return Record(key, message, 1, now, now, None)
        return Record(key, message, series.count + 1, series.first, now, series.name)

    def posted(self, record: Record, name: str) -> None:
        """The API holds ``record`` as Event ``name`` (created or patched)."""
        self._series.put(record.key, _Series(name, record.count, record.first))

    def _aggregate(
        self, obj: Hashable, type_: str, reason: str, message: str, now: float
    ) -> tuple[tuple[Hashable, ...], str]:
        similar_key: tuple[Hashable, ...] = (obj, type_, reason)
        similar = self._similar.get(similar_key)
        if similar is None or now - similar.last > self.similar_window:
            similar = _Similar()
        similar.last = now
        similar.messages.add(message)
        if len(similar.messages) < self.similar_max:
            self._similar.put(similar_key, similar)
            return (*similar_key, message), message
        similar.messages.discard(message)  # the set never grows past similar_max
        self._similar.put(similar_key, similar)
        return similar_key, COMBINED + message

    def _take_token(self, obj: Hashable, now: float) -> bool:
        bucket = self._buckets.get(obj)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
        else:
            refill = max(now - bucket.at, 0.0) / self.refill_seconds
            bucket.tokens = min(float(self.burst), bucket.tokens + refill)
            bucket.at = now
        allowed = bucket.tokens >= 1.0
        if allowed:
            bucket.tokens -= 1.0
        self._buckets.put(obj, bucket)
        return allowed
