"""Where a fenced write's slow samples spend their time: before, in or after the webhook.

Starts the API-server rows' setup (``bench/api_rows.py``: etcd, kube-apiserver, the webhook as
its own process) with a probe in the webhook process (``bench/webhook_probe``), writes one
plain and one fenced PATCH per round in a random order, one at a time, and splits each of the
slowest fenced writes, on the system-wide monotonic clock, into the time before the webhook's
handler started, in it and after it, next to the connections accepted, GC collections and
event-loop stalls the probe saw. docs/performance.md ("The fenced write: nearly free") has a run.

    .venv/bin/python bench/webhook_tail.py -n 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import api_rows as api
from benchlib import pct  # bench/benchlib.py

PROBE = Path(__file__).resolve().parent / "webhook_probe"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _read_dump(path: Path) -> dict[str, list[Any]] | None:
    if not path.exists():
        return None
    seen: dict[str, list[Any]] = json.loads(path.read_text())
    return seen


async def probe_dump(bench: api.ApiBench, path: Path) -> dict[str, list[Any]]:
    await asyncio.to_thread(path.unlink, missing_ok=True)
    os.kill(bench.processes["webhook"], signal.SIGUSR2)
    for _ in range(100):
        seen = await asyncio.to_thread(_read_dump, path)
        if seen is not None:
            return seen
        await asyncio.sleep(0.05)
    raise RuntimeError("the webhook's probe wrote nothing (is bench/webhook_probe loaded?)")


async def run(rounds: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        probe = {"PYTHONPATH": str(PROBE), "FENCEDLEASE_BENCH_PROBE": str(out)}
        bench = await api.start(Path(tmp), 1, lambda m: print(m, flush=True), webhook_env=probe)
        try:
            for i in range(50):  # warm-up
                await bench.patch("fenced", "latency", i)
                await bench.patch("plain", "latency", i)
            begin = time.monotonic()
            times = [await api.webhook_times(bench)]
            samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            rng = random.Random(seed)
            for i in range(rounds):
                order = [True, False]
                rng.shuffle(order)
                for fenced in order:
                    t0 = time.monotonic()
                    await bench.patch("fenced" if fenced else "plain", "latency", 1000 + i)
                    samples[fenced].append((t0, time.monotonic()))
            times.append(await api.webhook_times(bench))
            seen = await probe_dump(bench, out)
        finally:
            await bench.stop()
    report(samples, seen, begin, times[1].since(times[0]))


def report(
    samples: dict[bool, list[tuple[float, float]]],
    seen: dict[str, list[Any]],
    begin: float,
    times: api.WebhookTimes,
) -> None:
    reviews = [r for r in seen["req"] if r[0] >= begin]
    reads = [r for r in seen["read"] if r[0] >= begin]
    lags = [x for x in seen["lag"] if x[0] >= begin]
    print(f"load average {os.getloadavg()[0]:.2f}; {len(reviews)} reviews")
    for fenced in (False, True):
        took = [b - a for a, b in samples[fenced]]
        print(
            f"{'fenced' if fenced else 'plain '} PATCH: p50 {ms(pct(took, 0.5))}, p90 "
            f"{ms(pct(took, 0.9))}, p99 {ms(pct(took, 0.99))}, max {ms(max(took))} ms"
        )
    handler = [b - a for a, b in reviews]
    read = [b - a for a, b in reads]
    print(
        f"webhook handler: p50 {ms(pct(handler, 0.5))}, p99 {ms(pct(handler, 0.99))}, max "
        f"{ms(max(handler))} ms; etcd read: p50 {ms(pct(read, 0.5))}, p99 "
        f"{ms(pct(read, 0.99))}, max {ms(max(read))} ms"
    )
    print(
        f"connections accepted {sum(1 for c in seen['conn'] if c >= begin)}, GC collections "
        f"{sum(1 for g in seen['gc'] if g[0] >= begin)}, loop stalls over 4 ms "
        f"{len(lags)} (max {ms(max((d for _, d in lags), default=0.0))} ms)"
    )
    print(times.summary())
    slowest = sorted(samples[True], key=lambda s: s[0] - s[1])[: max(5, len(samples[True]) // 50)]
    print("slowest fenced (ms): total | before the handler | in it | after it | stalls")
    for t0, t1 in slowest:
        mine = [r for r in reviews if t0 <= r[0] <= t1]
        stalls = [ms(d) for t, d in lags if t0 - 0.01 <= t <= t1]
        if not mine:
            print(f"  {ms(t1 - t0)} | no review seen")
            continue
        a, b = mine[0]
        print(f"  {ms(t1 - t0)} | {ms(a - t0)} | {ms(b - a)} | {ms(t1 - b)} | {stalls}")
    plain = sorted((b - a for a, b in samples[False]), reverse=True)[:5]
    print("slowest plain (ms):", ", ".join(ms(t) for t in plain))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=400, help="rounds (one plain, one fenced)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(run(args.n, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
