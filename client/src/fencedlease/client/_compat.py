"""What the client needs from Pythons newer than the oldest it supports (3.9, docs/client.md).

Only here: every other module is written for 3.9 (no ``match``, no dataclass ``slots``/
``kw_only``, unions as ``X | Y`` only in annotations, which are never evaluated: each module
has ``from __future__ import annotations``).  ``make test-pythons`` runs the client's tests on
the oldest and the newest Python.
"""

from __future__ import annotations

import asyncio
import sys
from enum import Enum
from importlib.metadata import EntryPoint, entry_points
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised by make test-pythons

    class StrEnum(str, Enum):
        """An enum of strings whose ``str()`` and ``format()`` are the value (3.11's)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set, at most ``timeout`` seconds; whether it is set.  With
    ``asyncio.wait`` (not ``wait_for``, which in 3.11 and older can lose a cancellation that
    arrives as the wait ends; not ``asyncio.timeout``, new in 3.11)."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return event.is_set()


def uncancel(task: asyncio.Task[Any]) -> int:
    """``task.uncancel()`` (3.11): the cancellations still pending on ``task``.  Before 3.11
    tasks do not count them: 0, as if the one cancellation was ours alone."""
    undo = getattr(task, "uncancel", None)
    return int(undo()) if undo is not None else 0


def entry_points_of(group: str) -> list[EntryPoint]:
    """The installed entry points of ``group`` (``entry_points(group=)`` is 3.10's)."""
    if sys.version_info >= (3, 10):
        return list(entry_points(group=group))
    return list(entry_points().get(group, ()))  # pragma: no cover - 3.9


__all__ = ["StrEnum", "entry_points_of", "uncancel", "wait_event"]
