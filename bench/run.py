"""Benchmarks, side by side in one run: ratios against one raw etcd transaction.

Run with ``make bench`` (or ``.venv/bin/python bench/run.py -n 500``). The harness starts its
own etcd on loopback (the pinned binary, cached by ``make binaries``) and times, interleaved
round by round in a shuffled order (A/B, so machine load hits every row alike):

- **raw etcd txn**: one ``Txn`` (compare + put) on the gRPC stub, no library code: the
  baseline every ratio divides by; also the same through ``aetcd.Client.transaction``;
- **etcd v3lock Lock+Unlock**: etcd's own lock service (``v3lockpb.Lock``), called by a
  handwritten gRPC client (aetcd has no stub for it; the two messages are hand-encoded below),
  on one lease granted up front (a session); for context also with a lease per acquisition;
- **aetcd Lock acquire+release**: the client library's lock recipe (a lease per acquire);
- **fencedlease acquire+release**, **renew** and the **fence check** (``grant_and_mark``,
  the admission webhook's only store call) through ``EtcdStore``.

With ``--api`` (the default; ``--no-api`` skips it) it also starts a kube-apiserver the way the
integration tests do and times, in the same way, a client-go-style Lease GET + PUT, a plain CR
PATCH, the identical fenced FencedArtifact PATCH through the real webhook and the same PATCH
through a webhook that checks nothing (``bench/null_webhook.py``: the floor under the fence),
then a throughput phase with ``--writers`` concurrent writers and the CPU per write of every
process (``bench/api_rows.py``); then the same for fenced objects: a ConfigMap write
(``bench/object_rows.py``) and a Deployment status write by the holder's Pod
(``bench/status_rows.py``), each against its plain twin and the null-webhook floor.

It prints the tables (p50, p99, n, ratios against the baseline of the same run), writes them as
markdown and a PNG chart (``--out``, default ``bench/out/``), and checks the targets of
docs/performance.md.
``--long`` adds the scheduler pass over ``--leases`` leases against ``asyncio.gather``; the
operator at scale is ``bench/operator_scale.py`` (it starts a kube-apiserver).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aetcd
import api_rows as api  # bench/api_rows.py (the script's directory is on sys.path)
import grpc
import object_rows  # bench/object_rows.py
import status_rows  # bench/status_rows.py
from aetcd import rpc
from benchlib import Percentiles, interleaved  # bench/benchlib.py

from fencedlease.authority.types import Acquired, Renewed
from fencedlease.local.cluster import EtcdServer
from fencedlease.store.connection import parse_endpoint
from fencedlease.store.etcd import EtcdStore

Op = Callable[[int], Awaitable[object]]
BASELINE = "raw etcd txn (gRPC stub: compare + put)"
OUT = Path(__file__).resolve().parent / "out"


# ------------------------------------------------------------ etcd's v3lock, by hand


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _field_int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _bytes_field(data: bytes, wanted: int) -> bytes:
    """The first length-delimited field ``wanted`` of a serialized message."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            _, pos = _read_varint(data, pos)
        elif kind == 2:
            size, pos = _read_varint(data, pos)
            if number == wanted:
                return data[pos : pos + size]
            pos += size
        else:
            raise ValueError(f"unexpected wire type {kind}")
    raise KeyError(wanted)


class V3Lock:
    """etcd's ``v3lockpb.Lock`` service: ``Lock(name, lease) -> key`` and ``Unlock(key)``.

    Messages (etcd ``server/etcdserver/api/v3lock/v3lockpb/v3lock.proto``):
    ``LockRequest{bytes name = 1; int64 lease = 2}``, ``LockResponse{header = 1; bytes key = 2}``,
    ``UnlockRequest{bytes key = 1}``.
    """

    def __init__(self, channel: grpc.aio.Channel) -> None:
        identity: Callable[[bytes], bytes] = bytes
        self._lock = channel.unary_unary(
            "/v3lockpb.Lock/Lock", request_serializer=identity, response_deserializer=identity
        )
        self._unlock = channel.unary_unary(
            "/v3lockpb.Lock/Unlock", request_serializer=identity, response_deserializer=identity
        )

    async def lock(self, name: bytes, lease: int) -> bytes:
        reply = await self._lock(_field_bytes(1, name) + _field_int(2, lease), timeout=10)
        return _bytes_field(reply, 2)

    async def unlock(self, key: bytes) -> None:
        await self._unlock(_field_bytes(1, key), timeout=10)


# ---------------------------------------------------------------------- measuring


@dataclass
class Row(Percentiles):
    name: str
    op: Op
    samples: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # this process's CPU time per op
    note: str = ""


def table(rows: list[Row]) -> list[tuple[str, str, str, str, str, str, str]]:
    base = next(r for r in rows if r.name == BASELINE)
    out = []
    for row in rows:
        out.append(
            (
                row.name,
                f"{row.p50 * 1e3:.3f}",
                f"{row.p(0.99) * 1e3:.3f}",
                str(len(row.samples)),
                f"{row.p50 / base.p50:.2f}x",
                f"{row.p(0.99) / base.p(0.99):.2f}x",
                f"{statistics.mean(row.cpu) * 1e3:.3f}",
            )
        )
    return out


HEADER = ("what", "p50 ms", "p99 ms", "n", "p50 / raw txn", "p99 / raw txn", "client CPU ms")


def targets(rows: list[Row]) -> list[tuple[str, bool, str]]:
    by = {r.name: r for r in rows}
    raw, v3 = by[BASELINE], by["etcd v3lock Lock+Unlock"]
    ours, renew = by["fencedlease acquire+release"], by["fencedlease renew"]
    replay = by["fencedlease's 2 txns replayed on the stub"]
    return [
        (
            "acquire+release <= etcd v3lock Lock+Unlock (p50)",
            ours.p50 <= v3.p50,
            f"{ours.p50 * 1e3:.3f} ms vs {v3.p50 * 1e3:.3f} ms ({ours.p50 / v3.p50:.2f}x; "
            f"its two requests replayed with no store code: {replay.p50 / v3.p50:.2f}x)",
        ),
        (
            "renew <= 1.2x one raw etcd txn (p50)",
            renew.p50 <= 1.2 * raw.p50,
            f"{renew.p50 / raw.p50:.2f}x",
        ),
    ]


def markdown(rows: list[Row], command: str, meta: str) -> str:
    lines = [
        f"Command: `{command}`  ",
        meta,
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table(rows)]
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {t} | {'yes' if ok else '**no**'} | {m} |" for t, ok, m in targets(rows)]
    notes = [f"- {r.name}: {r.note}" for r in rows if r.note]
    notes.append(
        "- client CPU ms: mean CPU time of the benchmark process per operation (Python, gRPC's "
        "threads; etcd's own CPU is not in it)"
    )
    return "\n".join([*lines, "", *notes, ""])


def _bars(ax: Any, rows: list[Row], base: Row, label: str, title: str) -> None:
    names = [r.name for r in rows]
    p50 = [r.p50 / base.p50 for r in rows]
    p99 = [r.p(0.99) / base.p50 for r in rows]
    ys = range(len(rows))
    ax.barh(ys, p50, color="#4c72b0", label="p50")
    ax.scatter(p99, ys, color="#c44e52", marker="|", s=200, label="p99", zorder=3)
    for y, value in zip(ys, p50, strict=True):
        ax.text(value, y, f" {value:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yticks(list(ys), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"latency / p50 of {label} ({base.p50 * 1e3:.3f} ms)")
    ax.set_title(title, fontsize=8)
    ax.legend(loc="lower right", fontsize=8)


def chart(rows: list[Row], path: Path, meta: str, extra: ApiResult | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r for r in rows if r.name == BASELINE)
    heights = [len(rows)] + ([len(extra.rows)] if extra else [])
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(9, 0.55 * sum(heights) + 1.5 * len(heights)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    _bars(axes[0][0], rows, base, "one raw etcd txn", meta)
    if extra is not None:
        plain = next(r for r in extra.rows if r.name == api.PLAIN_ROW)
        _, p_n, _ = api.summed(extra.plain)
        _, f_n, _ = api.summed(extra.fenced)
        p_s = sum(w.seconds for w in extra.plain)
        f_s = sum(w.seconds for w in extra.fenced)
        title = (
            f"{extra.writers} writers: fenced {f_n / f_s:.0f} vs plain {p_n / p_s:.0f} writes/s "
            f"({(f_n / f_s) / (p_n / p_s):.2f}x)"
        )
        _bars(axes[1][0], extra.rows, plain, "the plain CR PATCH", title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


API_HEADER = ("what", "p50 ms", "p99 ms", "n", "p50 / plain", "p99 / plain", "+p50 ms", "+p99 ms")


def api_table(rows: list[Row]) -> list[tuple[str, ...]]:
    base = next(r for r in rows if r.name == api.PLAIN_ROW)
    return [
        (
            row.name,
            f"{row.p50 * 1e3:.3f}",
            f"{row.p(0.99) * 1e3:.3f}",
            str(len(row.samples)),
            f"{row.p50 / base.p50:.2f}x",
            f"{row.p(0.99) / base.p(0.99):.2f}x",
            f"{(row.p50 - base.p50) * 1e3:+.3f}",
            f"{(row.p(0.99) - base.p(0.99)) * 1e3:+.3f}",
        )
        for row in rows
    ]


THROUGHPUT_HEADER = ("writes", "writes/s", "n", "CPU ms / write", "by process (ms / write)")


def throughput_table(
    plain: list[api.Window],
    fenced: list[api.Window],
    writers: int,
    null: list[api.Window] | None = None,
) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    kinds = [("plain CR PATCH", plain), ("fenced PATCH", fenced)]
    if null:
        kinds.append(("null-webhook PATCH", null))
    for label, windows in kinds:
        rate, cpu, per = per_write(windows)
        out.append(
            (
                f"{label}, {writers} concurrent writers",
                f"{rate:.1f}",
                str(api.summed(windows)[1]),
                f"{cpu:.2f}",
                ", ".join(f"{k} {v:.2f}" for k, v in per.items()),
            )
        )
    return out


def per_write(windows: list[api.Window]) -> tuple[float, float, dict[str, float]]:
    """writes/s, CPU ms per write, and CPU ms per write by process, over ``windows``."""
    seconds, writes, cpu = api.summed(windows)
    per = {k: v / writes * 1e3 for k, v in cpu.items()}
    return writes / seconds, sum(per.values()), per


def api_targets(
    rows: list[Row], plain: list[api.Window], fenced: list[api.Window]
) -> list[tuple[str, bool, str]]:
    by = {r.name: r for r in rows}
    base, ours = by[api.PLAIN_ROW], by[api.FENCED_ROW]
    d50 = (ours.p50 - base.p50) * 1e3
    d99 = (ours.p(0.99) - base.p(0.99)) * 1e3
    p_rate, p_per, _ = per_write(plain)
    f_rate, f_per, _ = per_write(fenced)
    ratio = f_rate / p_rate
    return [
        ("fenced PATCH <= plain + 2 ms (p50)", d50 <= 2.0, f"{d50:+.3f} ms"),
        ("fenced PATCH <= plain + 5 ms (p99)", d99 <= 5.0, f"{d99:+.3f} ms"),
        (
            "fenced writes/s >= 0.7x plain, 50 writers",
            ratio >= 0.7,
            f"{f_rate:.1f} vs {p_rate:.1f} writes/s ({ratio:.2f}x); CPU per write "
            f"{f_per:.2f} vs {p_per:.2f} ms, so {p_per / f_per:.2f}x when CPU-bound",
        ),
    ]


def floor_lines(
    rows: list[Row], plain: list[api.Window], fenced: list[api.Window], null: list[api.Window]
) -> list[str]:
    """What the null webhook costs above the plain write (the floor under any Python webhook
    on this machine) and what the fence adds above that floor."""
    by = {r.name: r for r in rows}
    if api.NULL_ROW not in by or not null:
        return []
    base, ours, floor = by[api.PLAIN_ROW], by[api.FENCED_ROW], by[api.NULL_ROW]
    p_rate, p_cpu, p_per = per_write(plain)
    f_rate, f_cpu, _ = per_write(fenced)
    n_rate, n_cpu, n_per = per_write(null)
    apiserver = n_per["kube-apiserver"] - p_per["kube-apiserver"]
    return [
        f"The floor, the null webhook (it parses the review and allows it, checking nothing): "
        f"{(floor.p50 - base.p50) * 1e3:+.3f} ms p50 and "
        f"{(floor.p(0.99) - base.p(0.99)) * 1e3:+.3f} ms p99 over the plain write; "
        f"{n_rate:.1f} writes/s, "
        f"{n_rate / p_rate:.2f}x plain; CPU per write {n_cpu:.2f} ms against {p_cpu:.2f} "
        f"(kube-apiserver {apiserver:+.2f}, the null webhook {n_per['null webhook']:.2f}), "
        f"so {p_cpu / n_cpu:.2f}x when CPU-bound.",
        f"The fence above that floor (fenced minus null): "
        f"{(ours.p50 - floor.p50) * 1e3:+.3f} ms p50, "
        f"{(ours.p(0.99) - floor.p(0.99)) * 1e3:+.3f} ms p99, "
        f"{f_cpu - n_cpu:+.2f} ms of CPU per write, {f_rate / n_rate:.2f}x the null webhook's "
        "writes/s.",
    ]


@dataclass
class ApiResult:
    rows: list[Row]
    plain: list[api.Window]
    fenced: list[api.Window]
    null: list[api.Window]
    writers: int
    admission_ms: float | None
    meta: str
    webhook: tuple[api.WebhookTimes, api.WebhookTimes] | None = None
    """The webhook call seen from both sides in the latency rounds and in the throughput
    windows (where a tail is: before, in or after the webhook's handler)."""
    latency_writes: int = 0
    """Fenced writes of the latency rounds, warm-up included (what ``webhook[0]`` saw)."""
    objects: list[str] = field(default_factory=list)
    """The fenced-object rows (``bench/object_rows.py``), as markdown lines."""

    def webhook_lines(self) -> list[str]:
        if self.webhook is None:
            return []
        latency, load = self.webhook
        writes = sum(w.writes for w in self.fenced)
        return [
            f"Latency rounds: {latency.summary()}; "
            f"{_per(latency.call.count, self.latency_writes)} webhook calls per fenced write "
            f"({self.latency_writes:,} writes, warm-up included).",
            f"Throughput windows (measured parts, not their ramps): {load.summary()}; "
            f"{_per(load.call.count, writes)} webhook calls per fenced write ({writes:,} writes).",
        ]

    def markdown(self) -> list[str]:
        lines = [
            "",
            "### API server: a fenced write against the identical plain write",
            "",
            self.meta,
            "",
            "| " + " | ".join(API_HEADER) + " |",
            "|" + "---|" * len(API_HEADER),
        ]
        lines += ["| " + " | ".join(c) + " |" for c in api_table(self.rows)]
        lines += [
            "",
            "| " + " | ".join(THROUGHPUT_HEADER) + " |",
            "|" + "---|" * len(THROUGHPUT_HEADER),
        ]
        lines += [
            "| " + " | ".join(c) + " |"
            for c in throughput_table(self.plain, self.fenced, self.writers, self.null)
        ]
        if self.admission_ms is not None:
            lines += [
                "",
                f"The webhook's own time per update review (its admission latency histogram, "
                f"every call of the run): {self.admission_ms:.3f} ms mean.",
            ]
        lines += ["", *self.webhook_lines()]
        lines += ["", *floor_lines(self.rows, self.plain, self.fenced, self.null)]
        lines += ["", "| target (issue 15, item 3) | met | measured |", "|---|---|---|"]
        lines += [
            f"| {t} | {'yes' if ok else '**no**'} | {m} |"
            for t, ok, m in api_targets(self.rows, self.plain, self.fenced)
        ]
        lines += ["", *(f"- {r.name}: {r.note}" for r in self.rows if r.note)]
        return lines + self.objects


def print_table(header: tuple[str, ...], cells: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    for row in [header, *cells]:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def load_average() -> str:
    """The 1-minute load average now: on a shared machine it says how far absolute figures
    (latencies, writes/s) can be trusted; CPU per operation depends on it much less."""
    return f"{os.getloadavg()[0]:.2f}"


async def run_api(args: argparse.Namespace, tmp: Path) -> ApiResult:
    load_before = load_average()
    bench = await api.start(tmp / "api", args.writers, lambda m: print(m, flush=True))
    try:
        rows = [Row(name, op, note=note) for name, op, note in api.latency_ops(bench)]
        print(f"API rows: {args.api_n} rounds", flush=True)
        times = [await api.webhook_times(bench)]
        await interleaved(rows, args.api_n, args.warmup, args.seed)
        times.append(await api.webhook_times(bench))
        print(f"throughput: {args.windows} x 3 windows of {args.window}s", flush=True)
        windows = await api.throughput(bench, args.windows, args.window, args.seed, args.profile)
        times.append(await api.webhook_times(bench))
        print("fenced-object rows (ConfigMaps)", flush=True)
        found = await object_rows.measure(
            bench, args.api_n, args.warmup, args.windows, args.window, args.seed
        )
        objects = object_rows.markdown(found, args.writers, args.api_n, args.windows)
        print("fenced-object status rows (Deployments, by the holder's Pod)", flush=True)
        status = await status_rows.measure(
            bench, args.api_n, args.warmup, args.windows, args.window, args.seed
        )
        objects += status_rows.markdown(status, args.writers, args.api_n, args.windows)
    finally:
        await bench.stop()
    meta = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {args.api_n} rounds interleaved in random "
        f"order (+{args.warmup} warm-up); throughput: {args.windows} plain, {args.windows} "
        f"fenced and {args.windows} null-webhook windows of {args.window:g} s, {args.writers} "
        "writers, random order per round; one etcd, one kube-apiserver, the webhook and the "
        "null webhook each as its own process; load average "
        f"{load_before} before, {load_average()} after"
    )
    # Throughput: the measured windows only (their ramps also call the webhook).
    plain, fenced, null = windows["plain"], windows["fenced"], windows["null"]
    measured = [w.webhook for w in fenced if w.webhook is not None]
    empty = times[2].since(times[2])  # zero counts on the same buckets: where the sum starts
    load = functools.reduce(api.WebhookTimes.plus, measured, empty)
    webhook = (times[1].since(times[0]), load)
    handler = times[2].handler  # cumulative: every update review of the run
    admission = handler.mean_ms if handler.count else None
    return ApiResult(
        rows,
        plain,
        fenced,
        null,
        args.writers,
        admission,
        meta,
        webhook,
        args.api_n + args.warmup,
        objects,
    )


def _per(calls: float, writes: int) -> str:
    return f"{calls / writes:.2f}" if writes else "-"


# ------------------------------------------------------------------------ the rows


async def store_rows(endpoint: str, stack: list[Callable[[], Awaitable[None]]]) -> list[Row]:
    host, port, _ = parse_endpoint(endpoint)
    client = aetcd.Client(host, port, timeout=10)
    await client.connect()
    stack.append(client.close)
    kv = client.kvstub
    raw_key = b"/bench/raw"

    async def raw_txn(i: int) -> object:
        request = rpc.TxnRequest(
            compare=[
                rpc.Compare(
                    result=rpc.Compare.CompareResult.GREATER,
                    target=rpc.Compare.CompareTarget.VERSION,
                    key=raw_key,
                    version=-1,
                )
            ],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=raw_key, value=b"%d" % i))],
        )
        return await kv.Txn(request, timeout=10)

    t = client.transactions

    async def aetcd_txn(i: int) -> object:
        return await client.transaction(
            compare=[t.version(b"/bench/aetcd") > -1],
            success=[t.put(b"/bench/aetcd", b"%d" % i)],
            failure=[],
        )

    lease = await client.lease(3600)
    v3 = V3Lock(client.channel)

    async def v3lock(i: int) -> object:
        key = await v3.lock(b"/bench/v3lock", lease.id)
        await v3.unlock(key)
        return key

    async def v3lock_own_lease(i: int) -> object:
        own = await client.lease(30)
        key = await v3.lock(b"/bench/v3lock-own", own.id)
        await v3.unlock(key)
        await client.revoke_lease(own.id)
        return key

    alock = client.lock(b"/bench/aetcd-lock", ttl=60)

    async def aetcd_lock(i: int) -> object:
        assert await alock.acquire(timeout=10)
        await alock.release()
        return None

    store = EtcdStore([endpoint], prefix="/bench/fl", timeout=10)
    await store.connect()
    stack.append(store.close)

    async def cycle(i: int) -> object:
        got = await store.acquire("bench", "cycle", "pod-a", 30, holder_uid="uid-a")
        assert isinstance(got, Acquired), got
        return await store.release("bench", "cycle", got.lease_id, got.token)

    # The store's two transactions, replayed on the stub with prebuilt values: what the request
    # shapes cost etcd and gRPC, without the store's Python (the floor under the row above).
    from fencedlease.authority.types import LeaseRecord, TokenGrant
    from fencedlease.store import ops

    held_json = LeaseRecord("0123456789ab", "pod-a", 30.0, None, holder_uid="uid-a").to_json()
    ended_json = LeaseRecord("0123456789ab", "pod-a", 30.0, 7, holder_uid="uid-a").to_json()
    grant_json = TokenGrant("bench", "cycle", "0123456789ab", "pod-a", "uid-a").to_json()
    replay_key, replay_at = b"/bench/replay/leases/bench/cycle", [0]

    async def replay(i: int) -> object:
        guard = ops.absent(replay_key) if not replay_at[0] else ops.mod_is(replay_key, replay_at[0])
        request = ops.txn_request([guard], [ops.put(replay_key, held_json)], [ops.get(replay_key)])
        granted = await kv.Txn(request, timeout=10)
        token = int(granted.header.revision)
        record = b"/bench/replay/tokens/%d" % token
        request = ops.txn_request(
            [ops.mod_is(replay_key, token), ops.absent(record)],
            [ops.put(replay_key, ended_json), ops.put(record, grant_json)],
            [ops.get(replay_key), ops.get(record)],
        )
        ended = await kv.Txn(request, timeout=10)
        assert granted.succeeded and ended.succeeded
        replay_at[0] = int(ended.header.revision)
        return ended

    held = await store.acquire("bench", "held", "pod-a", 3600, holder_uid="uid-a")
    assert isinstance(held, Acquired), held

    async def renew(i: int) -> object:
        renewed = await store.renew("bench", "held", held.lease_id, held.token)
        assert isinstance(renewed, Renewed), renewed
        return renewed

    fenced = await store.acquire("bench", "fenced", "pod-a", 3600, holder_uid="uid-a")
    assert isinstance(fenced, Acquired), fenced
    first = await store.record_commit("bench", "fenced", fenced.token)  # a committed write
    assert first.verified, first

    async def fence_check(i: int) -> object:
        read = await store.grant_and_mark("bench", "fenced", fenced.token)
        assert read.grant is not None and read.mark is not None
        return read.grant

    return [
        Row(
            BASELINE, raw_txn, note="the baseline: `KV.Txn`, one compare, one put, no library code"
        ),
        Row("raw etcd txn via aetcd.transaction", aetcd_txn),
        Row(
            "etcd v3lock Lock+Unlock",
            v3lock,
            note="etcd's `v3lockpb.Lock` service, handwritten gRPC client, one lease up front",
        ),
        Row(
            "etcd v3lock, a lease per acquisition",
            v3lock_own_lease,
            note="LeaseGrant + Lock + Unlock + LeaseRevoke, what one `etcdctl lock` run does; "
            "context only: the target is the row above",
        ),
        Row(
            "aetcd Lock acquire+release",
            aetcd_lock,
            note="aetcd's recipe grants a lease per acquire",
        ),
        Row("fencedlease acquire+release", cycle, note="`EtcdStore.acquire` + `release`: 2 txns"),
        Row(
            "fencedlease's 2 txns replayed on the stub",
            replay,
            note="the same two requests (compare + put; 2 compares + 2 puts), prebuilt values, "
            "no store code: what the request shapes cost; the rest of the row above is the "
            "store's Python",
        ),
        Row("fencedlease renew", renew, note="`EtcdStore.renew`: 1 txn"),
        Row(
            "fencedlease fence check",
            fence_check,
            note="`EtcdStore.grant_and_mark`, the admission webhook's store call: 1 read-only txn",
        ),
    ]


async def bench_scheduler(leases: int) -> str:
    from fencedlease.controller.scheduler import Scheduler

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
    return (
        f"scheduler: {leases} leases, one pass each: {took * 1e3:.1f} ms "
        f"({leases / took:,.0f} passes/s), {took / base:.2f}x asyncio.gather"
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=500, help="measured rounds (each runs every row)")
    parser.add_argument("--warmup", type=int, default=30, help="rounds run but not measured")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--out", type=Path, default=OUT, help="directory for bench.md, bench.png")
    parser.add_argument("--long", action="store_true", help="also the scheduler over --leases")
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument(
        "--api",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the API-server rows (a kube-apiserver and the webhook; about a minute)",
    )
    parser.add_argument("--api-n", type=int, default=300, help="rounds of the API-server rows")
    parser.add_argument("--writers", type=int, default=50, help="concurrent writers")
    parser.add_argument("--windows", type=int, default=6, help="plain/fenced window pairs")
    parser.add_argument("--window", type=float, default=2.5, help="seconds per window")
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the webhook with py-spy during the first fenced window (collapsed stacks)",
    )
    args = parser.parse_args()
    command = "make bench" if len(sys.argv) == 1 else "bench/run.py " + " ".join(sys.argv[1:])
    stack: list[Callable[[], Awaitable[None]]] = []
    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        etcd = EtcdServer(Path(tmp) / "data", Path(tmp) / "etcd.log")
        etcd.start()
        try:
            rows = await store_rows(etcd.endpoint, stack)
            await interleaved(rows, args.n, args.warmup, args.seed)
        finally:
            for close in reversed(stack):
                await close()
            etcd.stop()
        load_after = load_average()
        api_result = await run_api(args, Path(tmp)) if args.api else None
    meta = (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {args.n} rounds interleaved in random order "
        f"(+{args.warmup} warm-up), one etcd on loopback; load average {load_before} before, "
        f"{load_after} after"
    )
    print(meta)
    print_table(HEADER, table(rows))
    met = targets(rows)
    if api_result is not None:
        print()
        print(api_result.meta)
        print_table(API_HEADER, api_table(api_result.rows))
        print()
        print_table(
            THROUGHPUT_HEADER,
            throughput_table(
                api_result.plain, api_result.fenced, api_result.writers, api_result.null
            ),
        )
        if api_result.admission_ms is not None:
            print(f"webhook's own time per update review: {api_result.admission_ms:.3f} ms mean")
        for line in api_result.webhook_lines():
            print(line)
        for line in floor_lines(
            api_result.rows, api_result.plain, api_result.fenced, api_result.null
        ):
            print(line)
        met += api_targets(api_result.rows, api_result.plain, api_result.fenced)
        print("\n".join(api_result.objects))
    print()
    for name, ok, measured in met:
        print(f"{'MET   ' if ok else 'MISSED'} {name}: {measured}")
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, command, meta)
    if api_result is not None:
        text += "\n".join(api_result.markdown()) + "\n"
    (args.out / "bench.md").write_text(text)
    chart(rows, args.out / "bench.png", meta, api_result)
    print(f"\nwrote {args.out / 'bench.md'} and {args.out / 'bench.png'}")
    if args.long:
        print(await bench_scheduler(args.leases))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
