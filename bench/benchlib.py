"""What the benchmark scripts share: percentiles of samples, timed rows run interleaved round by
round, and waiting for an operator process's ``/readyz``.  Imported as ``benchlib`` (a script's
directory is on ``sys.path``)."""

from __future__ import annotations

import random
import statistics
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from fencedlease.local.cluster import ManagedProcess

Op = Callable[[int], Awaitable[object]]


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values``: the sample at rank ``int(q * n)`` (at most the last)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Percentiles:
    """``p`` and ``p50`` of a row's ``samples`` (each row declares its own field)."""

    samples: list[float]

    def p(self, q: float) -> float:
        return pct(self.samples, q)

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)


class Timed(Protocol):
    op: Op
    samples: list[float]
    cpu: list[float]


async def interleaved(rows: Sequence[Timed], n: int, warmup: int, seed: int) -> None:
    """``n`` rounds after ``warmup``; each round runs every row once, in a fresh random order,
    and records its time and this process's CPU time."""
    rng = random.Random(seed)
    order = list(rows)
    for i in range(warmup + n):
        rng.shuffle(order)
        for row in order:
            c0, t0 = time.process_time(), time.perf_counter()
            await row.op(i)
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
            if i >= warmup:
                row.samples.append(took)
                row.cpu.append(cpu)


def wait_ready(op: ManagedProcess, health_port: int, timeout: float = 60) -> None:
    """Until the operator's ``/readyz`` answers; exits with its log if it died or took longer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline or not op.alive():
                raise SystemExit("operator did not start:\n" + op.log_tail()) from None
            time.sleep(0.2)
