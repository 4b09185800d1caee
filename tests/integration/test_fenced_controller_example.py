"""The article's scenario for a controller: examples/fenced-controller as two processes.

Both replicas run the example file against the real API server and the real fence webhook
(:mod:`.objects_harness`); the test plays the fencedlease operator's part (grants from the
real etcd store, written to each replica's downward-API directory). Replica A is frozen with
``SIGSTOP`` (a GC pause, ``ctr tasks pause``) while a write is queued; the lease moves to B,
which writes; A thaws and its queued write is refused with ``stale_fence``, the object keeps
B's content and A exits. The control run (``FENCED=false``) shows the overwrite, so the test
can fail.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fencedlease.local.cluster import LocalCluster

from .objects_harness import Objects, data_of, declared, wait_for

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fenced-controller"
LEASE = "fenced-controller"
STATE = "fenced-controller-state"
EXIT_REFUSED = 3


def write_grant(directory: Path, token: int, lease_id: str, state: str = "held") -> None:
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(str(token))
    (directory / "lease-id").write_text(lease_id)
    (directory / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (directory / "state").write_text(state)


@dataclass
class Replica:
    name: str
    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip())

    async def saw(self, pattern: str, after: int = 0, bound: float = 30.0) -> int:
        """Wait for a log line matching ``pattern`` (index > ``after``); returns its index."""
        expr = re.compile(pattern)

        async def found() -> int | None:
            for index in range(after, len(self.lines)):
                if expr.search(self.lines[index]):
                    return index + 1
            if self.process.returncode is not None:
                raise AssertionError(f"{self.name} exited: {self.log()}")
            return None

        return int(await wait_for(found, f"{self.name}: {pattern}\n{self.log()}", bound))

    def log(self) -> str:
        return "\n".join(self.lines[-40:])


async def start(cluster: LocalCluster, ns: str, name: str, grants: Path, fenced: bool) -> Replica:
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "FENCEDLEASE_DIR": str(grants),
        "FENCEDLEASE_LEASE": LEASE,
        "POD_NAMESPACE": ns,
        "POD_NAME": name,
        "WRITE_INTERVAL": "2",
        "FENCED": "true" if fenced else "false",
        "PYTHONUNBUFFERED": "1",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE / "fenced_controller.py"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    replica = Replica(name, process)
    replica.reader = asyncio.create_task(replica.read())
    return replica


async def stop(replica: Replica) -> None:
    if replica.process.returncode is None:
        replica.process.send_signal(signal.SIGCONT)
        replica.process.kill()
    await replica.process.wait()
    if replica.reader is not None:
        await asyncio.gather(replica.reader, return_exceptions=True)


async def scenario(objects: Objects, tmp_path: Path, *, fenced: bool) -> tuple[str, int | None]:
    """Run the article's scenario; returns the leader the object shows at the end and A's
    exit code (``None``: still running)."""
    fence = objects.fence
    await declared(objects)
    ns = await fence.namespace()
    await fence.lease(ns, LEASE)
    replicas: list[Replica] = []
    try:
        first = await fence.grant(ns, LEASE, "replica-a")
        write_grant(tmp_path / "a", first.token, first.lease_id)
        a = await start(fence.cluster, ns, "replica-a", tmp_path / "a", fenced)
        replicas.append(a)
        wrote = await a.saw(r"wrote fenced-controller-state: leader=replica-a")
        queued = await a.saw(r"queued fenced-controller-state", after=wrote)
        a.process.send_signal(signal.SIGSTOP)  # frozen with a write queued (2 s before it)
        # The lease moves on: A's grant is lost (its files say so), B is granted.
        second = await fence.grant(ns, LEASE, "replica-b")
        write_grant(tmp_path / "a", first.token, first.lease_id, state="lost")
        write_grant(tmp_path / "b", second.token, second.lease_id)
        b = await start(fence.cluster, ns, "replica-b", tmp_path / "b", fenced)
        replicas.append(b)
        await b.saw(r"wrote fenced-controller-state: leader=replica-b")
        if fenced:
            await fence.marked(ns, LEASE, second.token)
        await stop(b)  # B's content must survive A's thaw, not be rewritten after it
        assert await data_of(fence, ns, STATE, "leader") == "replica-b"
        a.process.send_signal(signal.SIGCONT)
        if fenced:
            await a.saw(r"write refused \(403\).*stale_fence", after=queued)
            async with asyncio.timeout(15):
                code = await a.process.wait()
            return await data_of(fence, ns, STATE, "leader"), code
        await a.saw(r"wrote fenced-controller-state: leader=replica-a", after=queued)
        return await data_of(fence, ns, STATE, "leader"), a.process.returncode
    finally:
        for replica in replicas:
            await stop(replica)


async def test_the_thawed_leaders_queued_write_is_refused_and_it_stops(
    objects: Objects, tmp_path: Path
) -> None:
    leader, code = await scenario(objects, tmp_path, fenced=True)
    assert leader == "replica-b"
    assert code == EXIT_REFUSED


async def test_control_without_fencing_the_thawed_leader_overwrites(
    objects: Objects, tmp_path: Path
) -> None:
    leader, code = await scenario(objects, tmp_path, fenced=False)
    assert leader == "replica-a"  # the stale leader's write landed: what fencing prevents
    assert code is None
