"""The article's scenario for a controller: examples/fenced-controller as two processes.

Both replicas run the example file against the real API server and the real fence webhook
(:mod:`.objects_harness`); the test plays the fencedlease operator's part (grants from the
real etcd store, written to each replica's downward-API directory). Replica A is frozen with
``SIGSTOP`` (a GC pause, ``ctr tasks pause``) while a write is queued; the lease moves to B,
which writes; A thaws and its queued write is refused with ``stale_fence``, the object keeps
B's content and A exits. A's queued **status** and **scale** writes of the Heartbeat (no token:
decided by who writes) are refused too: each replica calls the API as its Pod (a Pod-bound
service-account token of a Pod object, :mod:`.workers`), as on a node. The control run
(``FENCED=false``) shows all three overwrites, so the test can fail.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from fencedlease.local.cluster import LocalCluster

from .objects_harness import Objects, data_of, declared, policy, wait_for
from .test_fenced_object_paths import policy_ready
from .workers import worker_pods, write_kubeconfig

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fenced-controller"
LEASE = "fenced-controller"
STATE = "fenced-controller-state"
EXIT_REFUSED = 3
HEARTBEATS = "heartbeats.example.fencedlease.io"
ROLES = {
    "configmaps": ("get,list,watch,create,update,patch", "configmaps"),
    "events": ("create", "events"),
    "heartbeats": ("get,create,update,patch", HEARTBEATS),
    "heartbeat-status": ("get,update,patch", f"{HEARTBEATS}/status"),
    "heartbeat-scale": ("get,update,patch", f"{HEARTBEATS}/scale"),
}


async def heartbeats_declared(objects: Objects) -> None:
    """The example's Heartbeat CRD (its manifests) and a policy of the harness's namespaces
    declaring it (the example's own policy selects every namespace)."""
    fence = objects.fence
    docs = list(yaml.safe_load_all((EXAMPLE / "manifests.yaml").read_text()))
    (crd,) = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    await fence.kubectl("apply", "-f", "-", input=yaml.safe_dump(crd))
    await fence.kubectl("wait", "--for=condition=Established", f"crd/{HEARTBEATS}")
    name = f"heartbeats-{fence.selector_value}"
    rules = [{"apiGroup": "example.fencedlease.io", "resources": ["heartbeats"]}]
    await fence.kubectl("apply", "-f", "-", input=policy(name, rules, fence.selector_value))
    await policy_ready(fence, name)


async def heartbeat(objects: Objects, ns: str) -> tuple[str | None, int | None]:
    """The Heartbeat's ``status.leader`` and ``spec.replicas`` (written through scale)."""
    out = await objects.fence.kubectl("get", HEARTBEATS, "-n", ns, STATE, "-o", "json", check=False)
    found = json.loads(out.stdout or "{}")
    return (found.get("status") or {}).get("leader"), (found.get("spec") or {}).get("replicas")


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

        try:
            return int(await wait_for(found, f"{self.name}: {pattern}", bound))
        except AssertionError as error:
            raise AssertionError(f"{error}; its log:\n{self.log()}") from None

    def log(self) -> str:
        return "\n".join(self.lines[-40:])


async def start(
    cluster: LocalCluster, ns: str, name: str, grants: Path, fenced: bool, kubeconfig: Path
) -> Replica:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
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


@dataclass
class Outcome:
    leader: str
    """What the state ConfigMap shows at the end."""
    code: int | None
    """A's exit code (``None``: still running)."""
    heartbeat: tuple[str | None, int | None]
    """The Heartbeat's status leader and replicas at the end; B's before A thawed."""
    before: tuple[str | None, int | None]


async def scenario(objects: Objects, tmp_path: Path, *, fenced: bool) -> Outcome:
    """Run the article's scenario (see the module docstring)."""
    fence = objects.fence
    await declared(objects)
    await heartbeats_declared(objects)
    ns = await fence.namespace()
    await fence.lease(ns, LEASE)
    pods = await asyncio.to_thread(worker_pods, fence.cluster, ns, ROLES, "replica-a", "replica-b")
    configs = {
        pod: write_kubeconfig(tmp_path / f"{pod}.kubeconfig", fence.cluster, token, ns)
        for pod, (_, token) in pods.items()
    }
    replicas: list[Replica] = []
    try:
        first = await fence.grant(ns, LEASE, "replica-a")
        write_grant(tmp_path / "a", first.token, first.lease_id)
        a = await start(
            fence.cluster, ns, "replica-a", tmp_path / "a", fenced, configs["replica-a"]
        )
        replicas.append(a)
        wrote = await a.saw(r"wrote fenced-controller-state: leader=replica-a")
        queued = await a.saw(r"queued fenced-controller-state", after=wrote)
        a.process.send_signal(signal.SIGSTOP)  # frozen with a write queued (2 s before it)
        # The lease moves on: A's grant is lost (its files say so), B is granted.
        second = await fence.grant(ns, LEASE, "replica-b")
        write_grant(tmp_path / "a", first.token, first.lease_id, state="lost")
        write_grant(tmp_path / "b", second.token, second.lease_id)
        b = await start(
            fence.cluster, ns, "replica-b", tmp_path / "b", fenced, configs["replica-b"]
        )
        replicas.append(b)
        await b.saw(r"wrote scale of fenced-controller-state: leader=replica-b")
        if fenced:
            await fence.marked(ns, LEASE, second.token)
        await stop(b)  # B's content must survive A's thaw, not be rewritten after it
        assert await data_of(fence, ns, STATE, "leader") == "replica-b"
        before = await heartbeat(objects, ns)
        assert before[0] == "replica-b", before
        a.process.send_signal(signal.SIGCONT)
        code: int | None
        if fenced:
            for what in ("", "status of ", "scale of "):
                refused = rf"{what}fenced-controller-state write refused \(403\).*stale_fence"
                await a.saw(refused, after=queued)
            async with asyncio.timeout(15):
                code = await a.process.wait()
        else:
            await a.saw(r"wrote scale of fenced-controller-state: leader=replica-a", after=queued)
            code = a.process.returncode
        leader = await data_of(fence, ns, STATE, "leader")
        return Outcome(leader, code, await heartbeat(objects, ns), before)
    finally:
        for replica in replicas:
            await stop(replica)


async def test_the_thawed_leaders_queued_write_is_refused_and_it_stops(
    objects: Objects, tmp_path: Path
) -> None:
    found = await scenario(objects, tmp_path, fenced=True)
    assert found.leader == "replica-b"
    assert found.code == EXIT_REFUSED
    assert found.heartbeat == found.before  # B's status and replicas: A's were refused


async def test_control_without_fencing_the_thawed_leader_overwrites(
    objects: Objects, tmp_path: Path
) -> None:
    found = await scenario(objects, tmp_path, fenced=False)
    assert found.leader == "replica-a"  # the stale leader's write landed: what fencing prevents
    assert found.code is None
    assert found.heartbeat[0] == "replica-a"  # its status write too
    assert found.heartbeat[1] is not None and found.heartbeat[1] != found.before[1]  # scale
