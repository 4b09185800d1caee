"""A fault campaign's history: what every holder saw and did, and when (pure data).

Times are seconds on one clock (the campaign's). A history is saved as JSON lines, one event
per line with a ``type`` field, so a run can be re-checked later without re-running it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Policy = Literal["AllowEqual", "StrictlyGreater"]


@dataclass(frozen=True, slots=True)
class Grant:
    """A holder observed a grant: ``token`` / ``lease_id`` of ``lease`` belong to ``holder``."""

    t: float
    lease: str
    holder: str
    token: int
    lease_id: str


@dataclass(frozen=True, slots=True)
class Vacant:
    """The lease's status showed no live grant (``phase``: ``Pending``, ``Expired``,
    ``Released``, ``Unavailable``). Renewals do not write the status (docs/operations.md, "What a
    renewal writes"), so a grant is observed once: this is what ends it."""

    t: float
    lease: str
    phase: str


@dataclass(frozen=True, slots=True)
class WriteInvoke:
    """A holder sent a fenced write of ``artifact`` carrying ``token`` (operation ``op_id``)."""

    t: float
    op_id: str
    lease: str
    holder: str
    token: int
    lease_id: str
    artifact: str


@dataclass(frozen=True, slots=True)
class WriteOk:
    """The write ``op_id`` was admitted and committed."""

    t: float
    op_id: str


@dataclass(frozen=True, slots=True)
class WriteFail:
    """The write ``op_id`` was refused with a denial ``code`` (``stale_fence``, ...)."""

    t: float
    op_id: str
    code: str


@dataclass(frozen=True, slots=True)
class WriteTimeout:
    """The write ``op_id`` got no answer: it may or may not have been committed."""

    t: float
    op_id: str


@dataclass(frozen=True, slots=True)
class ArtifactState:
    """A state of ``artifact`` seen through a watch: the token it was written with and the
    object it points at."""

    t: float
    artifact: str
    lease: str
    token: int
    pointer: str


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault window ``[t, end]`` (``kind``: ``pause``, ``webhook_down``, ``etcd_kill``, ...)."""

    t: float
    kind: str
    end: float
    target: str = ""


Event = Grant | Vacant | WriteInvoke | WriteOk | WriteFail | WriteTimeout | ArtifactState | Fault

_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (Grant, Vacant, WriteInvoke, WriteOk, WriteFail, WriteTimeout, ArtifactState, Fault)
}


@dataclass
class History:
    """Events in the order they were recorded, plus each lease's policy and duration."""

    policies: dict[str, Policy] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)

    def add(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Any]) -> Iterator[Any]:
        return (e for e in self.events if isinstance(e, kind))


def dumps(history: History) -> str:
    """JSON lines: a header line (policies, durations), then one line per event."""
    lines = [
        json.dumps({"type": "Header", "policies": history.policies, "durations": history.durations})
    ]
    lines += [json.dumps({"type": type(e).__name__, **asdict(e)}) for e in history.events]
    return "\n".join(lines) + "\n"


def loads(text: str | Iterable[str]) -> History:
    """Parse :func:`dumps` output; raises ``ValueError`` naming the line on a bad record."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    history = History()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record.pop("type")
            if kind == "Header":
                history.policies = dict(record["policies"])
                history.durations = {k: float(v) for k, v in record["durations"].items()}
            else:
                history.add(_TYPES[kind](**record))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"history line {number}: {exc}") from exc
    return history
