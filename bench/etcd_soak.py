"""Soak: etcd's key count and database size stay flat across many handovers (issue 15 item 5).

Starts its own etcd (the pinned binary, as ``bench/run.py`` does) and runs ``--handovers``
handovers through :class:`~fencedlease.store.etcd.EtcdStore`: on ``--leases`` leases, each
handover acquires a lease for a new holder, renews it once (the first renew records the
token, and prunes the records that fall off the lease's list), fences a write with its token
(the high-water mark moves) and releases it.  Every ``--delete-every`` handovers one lease is
deleted (its records and mark go to the retention window, an etcd lease with a TTL) and
re-created by its next acquire.  Every sample compacts etcd to ``--keep-revisions`` behind
its head and defragments it (what ``--auto-compaction-mode`` and ``etcdctl defrag`` do for the
bundled etcd, here on a deterministic schedule), then reads the key count under the prefix
(a ``count_only`` range) and the database size (Status ``dbSize``/``dbSizeInUse``).

It fails (exit 1) when a sample holds more keys than retention allows at that moment (every
lease's key, mark and K records, plus K+1 keys per lease deleted within the last two windows),
or when the second half grows: the mean key count or in-use size of the last quarter must stay
within ``--bound`` (default 10 %) of the third quarter's.

Usage::

    .venv/bin/python bench/etcd_soak.py --handovers 50000  # see docs/performance.md
    make bench LONG=1   # runs it after the benchmark, with its defaults

Writes ``bench/out/etcd_soak.md`` and ``bench/out/etcd_soak.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from aetcd import rpc

from fencedlease.authority import fence as fencing
from fencedlease.authority.retention import Retention
from fencedlease.authority.types import (
    Acquired,
    FencingPolicy,
    LeaseKey,
    Released,
    Renewed,
    StoreUnavailable,
)
from fencedlease.local.cluster import EtcdServer
from fencedlease.store.etcd import EtcdStore

NS = "soak"
EXPIRY_SLACK_SECONDS = 5.0
OUT = Path(__file__).parent / "out"


@dataclass(frozen=True, slots=True)
class Sample:
    handovers: int
    keys: int
    db_size: int
    db_in_use: int
    revision: int
    seconds: float
    bound: int
    """What retention allows at this moment: every lease's key, mark and K records, plus K+1
    keys per lease deleted within the last two windows (a slack for etcd's expiry checks)."""


@dataclass(frozen=True, slots=True)
class SoakConfig:
    handovers: int = 50_000
    leases: int = 100
    workers: int = 8
    samples: int = 40
    delete_every: int = 50
    keep_revisions: int = 1_000
    generations: int = 16
    deleted_window_seconds: float = 10.0
    prefix: str = "/soak"


async def count_keys(store: EtcdStore, prefix: str) -> tuple[int, int]:
    """Keys under ``prefix`` (a ``count_only`` range) and the header revision."""
    start = prefix.encode() + b"/"
    end = start[:-1] + bytes([start[-1] + 1])
    request = rpc.RangeRequest(key=start, range_end=end, count_only=True)
    client = store.client
    response = await client.kvstub.Range(request, timeout=30, metadata=client.metadata)
    return int(response.count), int(response.header.revision)


async def compact_and_defrag(store: EtcdStore, keep_revisions: int) -> None:
    """What auto-compaction and ``etcdctl defrag`` do, on the soak's schedule."""
    client = store.client
    _, head = await count_keys(store, "/")
    if head > keep_revisions:
        await client.kvstub.Compact(
            rpc.CompactionRequest(revision=head - keep_revisions, physical=True),
            timeout=60,
            metadata=client.metadata,
        )
    await client.maintenancestub.Defragment(
        rpc.DefragmentRequest(), timeout=120, metadata=client.metadata
    )


async def db_status(store: EtcdStore) -> tuple[int, int]:
    client = store.client
    status = await client.maintenancestub.Status(
        rpc.StatusRequest(), timeout=30, metadata=client.metadata
    )
    return int(status.dbSize), int(status.dbSizeInUse)


async def handover(store: EtcdStore, lease: str, holder: str) -> None:
    """Acquire, renew once, fence one write, release: one handover of ``lease``."""
    grant: object = None
    for _ in range(100):
        try:
            grant = await store.acquire(NS, lease, holder, 30.0, holder_uid=f"uid-{holder}")
        except StoreUnavailable as error:  # contention: another handover of the lease won
            grant = error
            continue
        if isinstance(grant, Acquired):
            break
    else:
        raise RuntimeError(f"{lease}: no grant after 100 attempts: {grant}")
    renewed = await store.renew(NS, lease, grant.lease_id, grant.token)
    if not isinstance(renewed, Renewed):
        raise RuntimeError(f"{lease}: renew failed: {renewed}")
    read = await store.grant_and_mark(NS, lease, grant.token)  # the webhook's fence check
    fenced, _ = fencing.evaluate(
        LeaseKey(NS, lease),
        read.grant,
        read.mark,
        grant.token,
        FencingPolicy.ALLOW_EQUAL,
        holder=holder,
        holder_uid=f"uid-{holder}",
        generation=read.generation,
    )
    if not fenced.allowed:
        raise RuntimeError(f"{lease}: fence refused the holder's token: {fenced}")
    await store.record_commit(NS, lease, grant.token)  # the controller, once it committed
    released = await store.release(NS, lease, grant.lease_id, grant.token)
    if not isinstance(released, Released):
        raise RuntimeError(f"{lease}: release failed: {released}")


async def run_soak(endpoint: str, config: SoakConfig, *, report: bool = False) -> list[Sample]:
    """Run the soak against the etcd at ``endpoint``; the samples, first at 0 handovers."""
    if config.workers > config.leases:
        raise ValueError("every worker needs a lease of its own: workers <= leases")
    retention = Retention(config.generations, config.deleted_window_seconds)
    store = EtcdStore([endpoint], prefix=config.prefix, timeout=30, retention=retention)
    samples: list[Sample] = []
    started = time.monotonic()
    done = 0
    deleted_at: list[float] = []
    live_keys = config.leases * (config.generations + 2)

    def bound() -> int:
        since = time.monotonic() - 2 * config.deleted_window_seconds - EXPIRY_SLACK_SECONDS
        recent = sum(1 for t in deleted_at if t >= since)
        return live_keys + recent * (config.generations + 1)

    async def sample() -> None:
        await compact_and_defrag(store, config.keep_revisions)
        allowed = bound()  # before counting: deletes only add to it
        keys, revision = await count_keys(store, config.prefix)
        size, in_use = await db_status(store)
        elapsed = time.monotonic() - started
        samples.append(Sample(done, keys, size, in_use, revision, elapsed, allowed))
        if report:
            s = samples[-1]
            print(
                f"{s.handovers:>9,} handovers  {s.keys:>7,} keys  db {s.db_size / 1e6:7.2f} MB"
                f"  in use {s.db_in_use / 1e6:7.2f} MB  rev {s.revision:>9,}  {s.seconds:6.0f} s",
                flush=True,
            )

    async with store:
        await sample()
        step = max(1, config.handovers // config.samples)
        owned = [
            [f"lease-{j}" for j in range(config.leases) if j % config.workers == w]
            for w in range(config.workers)
        ]
        turns = [0] * config.workers

        async def worker(w: int, count: int) -> None:
            # Worker w hands over only its own leases (j % workers == w): no two workers race.
            for _ in range(count):
                turn = turns[w]
                turns[w] += 1
                lease = owned[w][turn % len(owned[w])]
                await handover(store, lease, f"pod-{w}-{turn}")
                if config.delete_every and turn % config.delete_every == config.delete_every - 1:
                    await store.delete(NS, lease)  # re-created by its next acquire
                    deleted_at.append(time.monotonic())

        while done < config.handovers:
            batch = min(step, config.handovers - done)
            share = [
                batch // config.workers + (w < batch % config.workers)
                for w in range(config.workers)
            ]
            await asyncio.gather(*(worker(w, share[w]) for w in range(config.workers)))
            done += batch
            await sample()
    return samples


def growth(samples: list[Sample], field: str) -> float:
    """Growth within the second half: the mean of its last half (the last quarter of the run)
    over the mean of its first half (the third quarter), minus one.  Means, not maxima: the
    keys of deleted leases come and go in a sawtooth (one bucket's etcd lease at a time)."""
    n = len(samples)
    third = [getattr(s, field) for s in samples[n // 2 : 3 * n // 4]]
    fourth = [getattr(s, field) for s in samples[3 * n // 4 :]]
    if not third or not fourth:
        raise ValueError("too few samples to compare the quarters (use --samples 4 or more)")
    first = sum(third) / len(third)
    return (sum(fourth) / len(fourth)) / first - 1.0 if first else float("inf")


def over_bound(samples: list[Sample]) -> list[Sample]:
    """Samples with more keys than retention allows at that moment."""
    return [s for s in samples if s.keys > s.bound]


def markdown(samples: list[Sample], config: SoakConfig, command: str) -> str:
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Command: `{command}` ({date}); {config.leases} leases, {config.workers} workers, a "
        f"lease deleted every {config.delete_every} handovers, K = {config.generations} "
        f"token records per lease, deleted-lease window {config.deleted_window_seconds:g} s, "
        f"compaction to {config.keep_revisions:,} revisions behind the head + defrag at "
        "every sample.",
        "",
        "| handovers | keys under the prefix | allowed now | db size (MB) | db in use (MB) "
        "| revision | s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in samples:
        lines.append(
            f"| {s.handovers:,} | {s.keys:,} | {s.bound:,} | {s.db_size / 1e6:.2f} "
            f"| {s.db_in_use / 1e6:.2f} | {s.revision:,} | {s.seconds:.0f} |"
        )
    lines += [
        "",
        "Growth within the second half (mean of the last quarter over the third): keys "
        f"{growth(samples, 'keys'):+.1%}, db size {growth(samples, 'db_size'):+.1%}, in use "
        f"{growth(samples, 'db_in_use'):+.1%}. Samples above the allowed key count: "
        f"{len(over_bound(samples))} of {len(samples)}.",
    ]
    return "\n".join(lines) + "\n"


def chart(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [s.handovers for s in samples]
    fig, keys_ax = plt.subplots(figsize=(8, 4))
    keys_ax.plot(x, [s.keys for s in samples], "o-", label="keys under the prefix")
    keys_ax.set_xlabel("handovers")
    keys_ax.set_ylabel("keys")
    keys_ax.set_ylim(bottom=0)
    size_ax = keys_ax.twinx()
    size_ax.plot(x, [s.db_size / 1e6 for s in samples], "s--", color="tab:red", label="db MB")
    size_ax.set_ylabel("db size after compaction + defrag (MB)")
    size_ax.set_ylim(bottom=0)
    fig.legend(loc="lower right")
    keys_ax.set_title("etcd stays bounded (bench/etcd_soak.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handovers", type=int, default=defaults.handovers)
    parser.add_argument("--leases", type=int, default=defaults.leases)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--samples", type=int, default=defaults.samples)
    parser.add_argument("--delete-every", type=int, default=defaults.delete_every)
    parser.add_argument("--keep-revisions", type=int, default=defaults.keep_revisions)
    parser.add_argument("--generations", type=int, default=defaults.generations)
    parser.add_argument("--deleted-window", type=float, default=defaults.deleted_window_seconds)
    parser.add_argument("--bound", type=float, default=0.10, help="allowed growth (0.10: 10%%)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    config = SoakConfig(
        handovers=args.handovers,
        leases=args.leases,
        workers=args.workers,
        samples=args.samples,
        delete_every=args.delete_every,
        keep_revisions=args.keep_revisions,
        generations=args.generations,
        deleted_window_seconds=args.deleted_window,
    )
    command = "python bench/etcd_soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="etcd-soak-") as tmp:
        server = EtcdServer(Path(tmp) / "data", Path(tmp) / "etcd.log")
        server.start()
        try:
            samples = asyncio.run(run_soak(server.endpoint, config, report=True))
        finally:
            server.stop()
    text = markdown(samples, config, command.strip())
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "etcd_soak.md").write_text(text)
    chart(samples, args.out / "etcd_soak.png")
    failed = [
        f"{field} grew {growth(samples, field):+.1%} in the second half (bound {args.bound:.0%})"
        for field in ("keys", "db_in_use")
        if growth(samples, field) > args.bound
    ] + [
        f"{s.keys:,} keys after {s.handovers:,} handovers, retention allows {s.bound:,}"
        for s in over_bound(samples)
    ]
    for line in failed:
        print(f"FAIL: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
