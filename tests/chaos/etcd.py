"""The campaign's grant authority: a 3-member etcd on loopback, and the faults done to it.

Members keep their ports for the whole campaign (chosen below the kernel's ephemeral range, so
nothing else lands on them while a member is down), which lets a member be killed and started
again, and the whole cluster be restored from a snapshot, under the same endpoints the operator
was given. Leader and status come from etcd's JSON gateway (``/v3/maintenance/status``).
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import ManagedProcess


def reserved_port(rng: random.Random) -> int:
    """A free port in 20000-32000, below the kernel's ephemeral range (32768+) where ``bind(0)``
    callers land, so it stays ours while a process restarts on it."""
    for _ in range(500):
        port = rng.randint(20_000, 32_000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def _post(
    endpoint: str, path: str, body: dict[str, object], timeout: float = 1.0
) -> dict[str, object]:
    req = urllib.request.Request(f"{endpoint}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer: dict[str, object] = json.loads(resp.read())
        return answer


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def status(self) -> dict[str, object] | None:
        """``{"member_id", "leader", "revision"}`` as this member sees it, or None."""
        try:
            answer = _post(self.endpoint, "/v3/maintenance/status", {})
        except (OSError, ValueError):
            return None
        header = answer.get("header")
        if not isinstance(header, dict):
            return None
        return {
            "member_id": str(header.get("member_id", "")),
            "leader": str(answer.get("leader", "")),
            "revision": int(str(header.get("revision", "0"))),
        }


@dataclass
class EtcdCluster:
    """``size`` members under ``root``; ``start()`` waits for a leader."""

    root: Path
    size: int = 3
    seed: int = 0
    members: list[Member] = field(default_factory=list)
    generation: int = 0  # bumped by each restore: a fresh data directory per member

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        ports = set[int]()
        while len(ports) < 2 * self.size:
            ports.add(reserved_port(rng))
        pairs = sorted(ports)
        self.members = [
            Member(
                f"m{i}",
                pairs[2 * i],
                pairs[2 * i + 1],
                self.root / f"m{i}-0",
                self.root / f"m{i}.log",
            )
            for i in range(self.size)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer}" for m in self.members)

    def _argv(self, member: Member, state: str) -> list[str]:
        return [
            str(binary_path("etcd")),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={member.endpoint}",
            f"--advertise-client-urls={member.endpoint}",
            f"--listen-peer-urls={member.peer}",
            f"--initial-advertise-peer-urls={member.peer}",
            f"--initial-cluster={self.initial_cluster}",
            f"--initial-cluster-state={state}",
            "--initial-cluster-token=fencedlease-chaos",
            "--heartbeat-interval=100",
            "--election-timeout=1000",
            "--log-level=warn",
            "--snapshot-count=100000",
        ]

    def start_member(self, member: Member, state: str = "new") -> None:
        member.process = ManagedProcess(
            f"etcd-{member.name}", self._argv(member, state), member.log_path
        )
        member.process.start()

    def start(self, timeout: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for member in self.members:
            self.start_member(member)
        self.wait_leader(timeout)

    def leader(self) -> Member | None:
        """The member every live member agrees leads, or None."""
        by_id: dict[str, Member] = {}
        leaders = set()
        for member in self.members:
            if not member.alive():
                continue
            status = member.status()
            if status is None:
                continue
            by_id[str(status["member_id"])] = member
            leaders.add(str(status["leader"]))
        if len(leaders) != 1:
            return None
        return by_id.get(leaders.pop())

    def wait_leader(self, timeout: float = 30.0) -> Member:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise RuntimeError(f"etcd: no leader after {timeout:.0f}s\n{self.log_tails()}")

    def revision(self) -> int:
        for member in self.members:
            status = member.status() if member.alive() else None
            if status is not None:
                return int(str(status["revision"]))
        raise RuntimeError("etcd: no member answers")

    def kill(self, member: Member) -> None:
        """kill -9 (a crash: no clean shutdown)."""
        if member.process is not None and member.process.proc is not None:
            member.process.proc.send_signal(signal.SIGKILL)
            member.process.proc.wait()
            member.process.stop()

    def restart(self, member: Member) -> None:
        self.start_member(member, state="existing")

    def kill_all(self) -> None:
        for member in self.members:
            self.kill(member)

    def restart_all(self, timeout: float = 60.0) -> None:
        for member in self.members:
            if not member.alive():
                self.restart(member)
        self.wait_leader(timeout)

    def snapshot(self, path: Path) -> None:
        """``etcdctl snapshot save`` through the JSON gateway (a stream of base64 blobs)."""
        leader = self.wait_leader()
        req = urllib.request.Request(
            f"{leader.endpoint}/v3/maintenance/snapshot", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(req, timeout=60) as resp, path.open("wb") as out:
            for line in resp:
                if not line.strip():
                    continue
                chunk = json.loads(line)
                blob = (chunk.get("result") or {}).get("blob")
                if blob:
                    out.write(base64.b64decode(blob))

    def restore(self, snapshot: Path, bump: int | None, timeout: float = 60.0) -> None:
        """Stop every member and restore all of them from ``snapshot`` (the disaster-recovery
        procedure), with ``--bump-revision`` when ``bump`` is given."""
        self.kill_all()
        self.generation += 1
        for member in self.members:
            old = member.data_dir
            member.data_dir = self.root / f"{member.name}-{self.generation}"
            extra = [f"--bump-revision={bump}", "--mark-compacted"] if bump else []
            subprocess.run(
                [
                    str(binary_path("etcdutl")),
                    "snapshot",
                    "restore",
                    str(snapshot),
                    f"--data-dir={member.data_dir}",
                    f"--name={member.name}",
                    f"--initial-cluster={self.initial_cluster}",
                    f"--initial-advertise-peer-urls={member.peer}",
                    "--initial-cluster-token=fencedlease-chaos",
                    *extra,
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            shutil.rmtree(old, ignore_errors=True)
        for member in self.members:
            self.start_member(member, state="existing")
        self.wait_leader(timeout)

    def stop(self) -> None:
        for member in self.members:
            if member.process is not None:
                member.process.stop()

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(
            f"--- {m.name} ({m.log_path})\n{m.process.log_tail(lines) if m.process else ''}"
            for m in self.members
        )
