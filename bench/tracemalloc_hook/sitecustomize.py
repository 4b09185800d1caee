"""Loaded by the operator that ``bench/operator_scale.py --tracemalloc`` starts (this directory
is put on its ``PYTHONPATH``; ``PYTHONTRACEMALLOC`` starts the tracing): on SIGUSR2 the process
writes a tracemalloc snapshot to ``$FENCEDLEASE_BENCH_SNAPSHOTS/<n>.snapshot``. Bench tooling
only: nothing in the operator refers to it."""

from __future__ import annotations

import os
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

_where = os.environ.get("FENCEDLEASE_BENCH_SNAPSHOTS")
_taken = [0]


def _dump(signum: int, frame: FrameType | None) -> None:
    if not tracemalloc.is_tracing() or _where is None:
        return
    _taken[0] += 1
    path = Path(_where) / f"{_taken[0]}.snapshot"
    tracemalloc.take_snapshot().dump(str(path.with_suffix(".tmp")))
    path.with_suffix(".tmp").rename(path)


if _where:
    signal.signal(signal.SIGUSR2, _dump)
