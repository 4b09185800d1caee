"""Benchmarks: store operations and the scheduler, as ratios against baselines of the same run.

Run with ``make bench``. Starts its own etcd on loopback (built on first use). Absolute numbers
depend on the machine; the ratios say what our layer costs on top of the raw operation:

- acquire+release cycle and fence check vs. one raw etcd transaction (aetcd) on the same etcd;
- the scheduler driving N leases (one pass each) vs. a plain ``asyncio.gather`` of the same work.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aetcd

from fencedlease.authority.types import Acquired, FencingPolicy
from fencedlease.controller.scheduler import Scheduler
from fencedlease.local.cluster import EtcdServer
from fencedlease.store.etcd import EtcdStore, parse_endpoint


async def timed(n: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await op(i)
        samples.append(time.perf_counter() - t0)
    return samples


def summary(name: str, samples: list[float], baseline: list[float] | None) -> str:
    med = statistics.median(samples)
    p99 = sorted(samples)[int(len(samples) * 0.99) - 1]
    ratio = f"{med / statistics.median(baseline):6.2f}x baseline" if baseline else "  (baseline)"
    return f"{name:<42} median {med * 1e3:7.3f} ms  p99 {p99 * 1e3:7.3f} ms  {ratio}"


async def bench_store(endpoint: str, n: int) -> None:
    host, port, _ = parse_endpoint(endpoint)
    raw = aetcd.Client(host, port)
    await raw.connect()

    async def raw_txn(i: int) -> object:
        key = b"/bench/raw"
        return await raw.transaction(
            compare=[raw.transactions.version(key) > -1],
            success=[raw.transactions.put(key, str(i).encode()), raw.transactions.get(key)],
            failure=[],
        )

    baseline = await timed(n, raw_txn)
    print(summary("raw etcd txn (put+get)", baseline, None))

    async with EtcdStore([endpoint], prefix="/bench") as store:

        async def cycle(i: int) -> object:
            got = await store.acquire("bench", "cycle", "pod-a", 30)
            assert isinstance(got, Acquired), got
            return await store.release("bench", "cycle", got.lease_id, got.token)

        print(summary("acquire + release (one generation)", await timed(n, cycle), baseline))

        got = await store.acquire("bench", "fence", "pod-a", 3600)
        assert isinstance(got, Acquired)

        async def fence(i: int) -> object:
            return await store.fence(
                "bench", "fence", got.token, FencingPolicy.ALLOW_EQUAL, operation_id=f"op-{i}"
            )

        print(summary("fence check + hwm advance (applied)", await timed(n, fence), baseline))

        async def renew(i: int) -> object:
            return await store.renew("bench", "fence", got.lease_id, got.token)

        print(summary("renew", await timed(n, renew), baseline))
    await raw.close()


async def bench_scheduler(leases: int) -> None:
    async def work(key: int) -> float | None:
        await asyncio.sleep(0)
        return None

    t0 = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(leases)))
    base = time.perf_counter() - t0

    done = asyncio.Event()
    count = 0

    async def counted(key: int) -> float | None:
        nonlocal count
        await work(key)
        count += 1
        if count == leases:
            done.set()
        return None

    sched: Scheduler[int] = Scheduler(counted, concurrency=64)
    task = asyncio.create_task(sched.run())
    t0 = time.perf_counter()
    for i in range(leases):
        sched.poke(i)
    await done.wait()
    took = time.perf_counter() - t0
    task.cancel()
    print(
        f"scheduler: {leases} leases, one pass each      {took * 1e3:8.1f} ms  "
        f"({leases / took:,.0f} passes/s)  {took / base:6.2f}x gather baseline"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=300, help="operations per store benchmark")
    parser.add_argument("--leases", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "data", Path(tmp) / "etcd.log")
        etcd.start()
        try:
            await bench_store(etcd.endpoint, args.n)
        finally:
            etcd.stop()
    await bench_scheduler(args.leases)


if __name__ == "__main__":
    asyncio.run(main())
