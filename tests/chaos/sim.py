"""A deterministic, in-process campaign on the reference model (no processes, no sleeps).

Holders, a controller and the fence run against :mod:`fencedlease.authority.memory` on a fake
clock, with seeded faults: holder pauses longer than the lease (the GC pause), random delivery
delays (reordering), and windows where no webhook answers. The fence follows the product's
path: the webhook reads grant and mark (no write), the API server commits under the stored
object's token, and the controller records the commit into the lease's mark one step later.

With ``fenced=False`` the same holders write a plain resource that takes every write (the
unfenced control): the checker must report it unsafe, or it proves nothing.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from fencedlease.authority import fence as fencing
from fencedlease.authority.memory import MemoryAuthority, MemoryKV
from fencedlease.authority.types import (
    Acquired,
    FenceCode,
    FencingPolicy,
    HighWaterMark,
    LeaseKey,
    Renewed,
)
from tests.chaos.history import (
    ArtifactState,
    Fault,
    Grant,
    History,
    Policy,
    WriteFail,
    WriteInvoke,
    WriteOk,
)
from tests.fakes import FakeClock

NS = "chaos"


@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    holders: int = 8
    leases: tuple[tuple[str, Policy], ...] = (
        ("alpha", "AllowEqual"),
        ("beta", "StrictlyGreater"),
        ("gamma", "AllowEqual"),
    )
    duration: float = 3.0
    step: float = 0.05
    writes: int = 1000
    write_chance: float = 0.3
    pause_chance: float = 0.03
    webhook_down_chance: float = 0.002
    fenced: bool = True
    superseding: bool = True
    """``False``: the webhook of before (the article's rule only: a token is refused below one
    already written, not once a newer grant committed), which the checker must report."""


@dataclass
class _Stored:
    token: int
    op_id: str


@dataclass(order=True)
class _Delivery:
    at: float
    seq: int
    write: WriteInvoke = field(compare=False)


def run(config: SimConfig) -> History:
    rng = random.Random(config.seed)
    clock = FakeClock(0.0)
    authority = MemoryAuthority(MemoryKV(revision=100), clock=clock, skew_seconds=0.2)
    history = History(
        policies=dict(config.leases), durations={name: config.duration for name, _ in config.leases}
    )
    holders = [f"pod-{i}" for i in range(config.holders)]
    current: dict[str, tuple[str, int, str]] = {}  # lease -> (holder, token, lease id)
    known: dict[str, dict[str, tuple[int, str]]] = {h: {} for h in holders}  # holders' views
    paused_until: dict[str, float] = {}
    webhook_down_until = -1.0
    in_flight: list[_Delivery] = []
    writing: set[str] = set()
    stored: dict[str, _Stored] = {}
    commits: list[tuple[str, int]] = []  # committed, not yet recorded by the controller
    sent = 0

    def awake(holder: str) -> bool:
        return paused_until.get(holder, -1.0) <= clock.now

    while sent < config.writes or in_flight:
        clock.advance(config.step)
        now = clock.now
        # The controller: record last step's commits, renew awake holders, grant the rest.
        for lease, token in commits:
            authority.record_commit(NS, lease, token)
        commits.clear()
        for lease, _ in config.leases:
            grant = current.get(lease)
            if grant is not None and awake(grant[0]):
                renewed = authority.renew(NS, lease, grant[2], grant[1])
                if isinstance(renewed, Renewed):
                    history.add(Grant(now, lease, *grant))
                    continue
            candidates = [h for h in holders if awake(h)]
            if not candidates:
                continue
            holder = rng.choice(candidates)
            acquired = authority.acquire(NS, lease, holder, config.duration)
            if isinstance(acquired, Acquired):
                current[lease] = (holder, acquired.token, acquired.lease_id)
                known[holder][lease] = (acquired.token, acquired.lease_id)
                history.add(Grant(now, lease, holder, acquired.token, acquired.lease_id))
        # Faults.
        if now > webhook_down_until and rng.random() < config.webhook_down_chance:
            webhook_down_until = now + rng.uniform(0.2, 1.0)
            history.add(Fault(now, "webhook_down", webhook_down_until))
        # Holders send writes (one in flight each); some pause before it is delivered.
        for holder in holders:
            if sent >= config.writes or holder in writing or not awake(holder):
                continue
            if not known[holder] or rng.random() >= config.write_chance:
                continue
            lease = rng.choice(sorted(known[holder]))
            token, lease_id = known[holder][lease]
            write = WriteInvoke(now, f"op-{sent}", lease, holder, token, lease_id, f"{lease}-out")
            sent += 1
            delay = rng.uniform(0.0, 4 * config.step)
            if rng.random() < config.pause_chance:
                delay = config.duration * rng.uniform(1.2, 2.5)
                paused_until[holder] = now + delay
                history.add(Fault(now, "pause", now + delay, holder))
            history.add(write)
            writing.add(holder)
            heapq.heappush(in_flight, _Delivery(now + delay, sent, write))
        # Deliveries due now, in delivery order.
        while in_flight and in_flight[0].at <= now:
            write = heapq.heappop(in_flight).write
            writing.discard(write.holder)
            policy = FencingPolicy(history.policies[write.lease])
            if config.fenced and now <= webhook_down_until:
                history.add(WriteFail(now, write.op_id, "unavailable"))
                continue
            code = (
                _admit(authority, stored, write, policy, config.superseding)
                if config.fenced
                else FenceCode.APPLIED
            )
            if code is FenceCode.APPLIED:
                stored[write.artifact] = _Stored(write.token, write.op_id)
                commits.append((write.lease, write.token))
                pointer = f"{write.artifact}/{write.op_id}"
                history.add(WriteOk(now, write.op_id))
                history.add(ArtifactState(now, write.artifact, write.lease, write.token, pointer))
            elif code is FenceCode.DUPLICATE:
                history.add(WriteOk(now, write.op_id))
            else:
                history.add(WriteFail(now, write.op_id, code.value))
                held = known[write.holder].get(write.lease, (0, ""))
                if code is FenceCode.STALE_FENCE and held[1] == write.lease_id:
                    del known[write.holder][write.lease]  # definitive: stop work under it
    return history


def _admit(
    authority: MemoryAuthority,
    stored: dict[str, _Stored],
    write: WriteInvoke,
    policy: FencingPolicy,
    superseding: bool = True,
) -> FenceCode:
    """The webhook's decision: grant and mark read together, the stored object's token too."""
    read = authority.grant_and_mark(NS, write.lease, write.token)
    grant, mark = read.grant, read.mark
    current = stored.get(write.artifact)
    hwm = mark
    if current is not None and (mark is None or current.token >= mark.token):
        ops = (current.op_id,) + (
            mark.operation_ids if mark and mark.token == current.token else ()
        )
        hwm = HighWaterMark(current.token, ops)
    result, _ = fencing.evaluate(
        LeaseKey(NS, write.lease),
        grant,
        hwm,
        write.token,
        policy,
        operation_id=write.op_id,
        holder=write.holder,
        generation=read.generation if superseding else None,
    )
    return result.code
