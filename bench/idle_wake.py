"""What a round trip costs when the processes on both ends were idle a moment before.

``make bench``'s latency rounds run one write at a time, in a random order of rows, so every
process a fenced write passes through (kube-apiserver, the webhook, its gRPC thread, etcd) has
usually been idle for a few milliseconds when the write reaches it. On a VM whose idle vCPUs
halt at once (this machine: the ``haltpoll`` cpuidle driver with ``guest_halt_poll_ns=0``),
waking each of them costs more than the work. This measures that, the same calls back to back
and after an idle gap:

- a one-byte ping-pong over a socketpair with a forked child (no Python work on either side);
- one etcd ``Range`` over gRPC (linearizable, and serializable, which skips etcd's ReadIndex);
- ``EtcdStore.grant_and_mark``, the fence check's whole store call, on uvloop (the webhook's
  loop).

    .venv/bin/python bench/idle_wake.py            # about 30 s; needs the pinned etcd

The figures are in docs/performance.md ("The floor: a webhook that checks nothing").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import uvloop
from aetcd.rpc import rpc_pb2 as rpc
from aetcd.rpc import rpc_pb2_grpc as stubs

from fencedlease.authority.types import Acquired
from fencedlease.local.cluster import EtcdServer
from fencedlease.store.connection import parse_endpoint
from fencedlease.store.etcd import EtcdStore

GAPS = (0.0, 0.003, 0.020)


def summary(name: str, gap: float, samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    return (
        f"{name:38s} idle {gap * 1e3:4.0f} ms before: p50 {p50 * 1e3:6.3f} ms, "
        f"mean {statistics.mean(ordered) * 1e3:6.3f} ms (n {len(ordered)})"
    )


def ping_pong(n: int) -> list[str]:
    """A forked child echoes one byte; the parent times the round trip after each gap."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: echo until the parent closes its end
        parent.close()
        while data := child.recv(64):
            child.send(data)
        os._exit(0)
    child.close()
    lines = []
    try:
        for gap in GAPS:
            samples = []
            for i in range(n + n // 10):
                if gap:
                    time.sleep(gap)
                t0 = time.perf_counter()
                parent.send(b"x")
                parent.recv(64)
                if i >= n // 10:  # warm-up left out
                    samples.append(time.perf_counter() - t0)
            lines.append(summary("socketpair ping-pong (no work)", gap, samples))
    finally:
        parent.close()
        os.waitpid(pid, 0)
    return lines


async def timed(name: str, call: Callable[[], Awaitable[object]], n: int) -> list[str]:
    lines = []
    for gap in GAPS:
        samples = []
        for i in range(n + n // 10):
            if gap:
                await asyncio.sleep(gap)
            t0 = time.perf_counter()
            await call()
            if i >= n // 10:
                samples.append(time.perf_counter() - t0)
        lines.append(summary(name, gap, samples))
    return lines


async def etcd_rows(endpoint: str, n: int) -> list[str]:
    host, port, _ = parse_endpoint(endpoint)
    channel = grpc.aio.insecure_channel(f"{host}:{port}")
    kv = stubs.KVStub(channel)
    store = EtcdStore([endpoint], prefix="/idle-wake", timeout=10)
    try:
        await kv.Put(rpc.PutRequest(key=b"/idle-wake/k", value=b"v"))
        await store.connect()
        got = await store.acquire("bench", "idle", "pod", 3600, holder_uid="uid")
        assert isinstance(got, Acquired), got
        lines = await timed(
            "etcd Range, linearizable (gRPC stub)",
            lambda: kv.Range(rpc.RangeRequest(key=b"/idle-wake/k")),
            n,
        )
        lines += await timed(
            "etcd Range, serializable (gRPC stub)",
            lambda: kv.Range(rpc.RangeRequest(key=b"/idle-wake/k", serializable=True)),
            n,
        )
        lines += await timed(
            "EtcdStore.grant_and_mark (fence check)",
            lambda: store.grant_and_mark("bench", "idle", got.token),
            n,
        )
        return lines
    finally:
        await store.close()
        await channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300, help="round trips per row and gap")
    args = parser.parse_args()
    driver = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    print(f"cpuidle driver: {driver.read_text().strip() if driver.exists() else 'unknown'}")
    for line in ping_pong(args.n):
        print(line, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "data", Path(tmp) / "etcd.log")
        etcd.start()
        try:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                for line in runner.run(etcd_rows(etcd.endpoint, args.n)):
                    print(line, flush=True)
        finally:
            etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
