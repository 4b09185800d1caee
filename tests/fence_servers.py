"""Throwaway servers for the fence tests and benchmarks: Redis (Debian's ``redis-server``,
installed by ``scripts/ensure-redis.sh``) and MinIO (built from its Go module by
``make minio``, cached with the other binaries).  Each is a local process on loopback, with its
log kept for the failure message; stopped with SIGTERM, then SIGKILL."""

from __future__ import annotations

import shutil
import socket
import tempfile
import urllib.request
from pathlib import Path

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import ManagedProcess, free_port, wait_until


def http_ok(url: str) -> bool:
    """``url`` answers 200 (a readiness probe: any failure is "not yet")."""
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def redis_binary() -> str:
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(found).exists():
        raise RuntimeError("redis-server is not installed: run scripts/ensure-redis.sh")
    return found


class RedisServer:
    """``redis-server`` on a unix socket (no persistence); ``url`` for redis-py."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fencedlease-redis-"))
        self.socket = self.root / "redis.sock"
        self.process = ManagedProcess(
            "redis-server",
            [
                redis_binary(),
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.root),
            ],
            self.root / "redis.log",
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def _ready(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1)
                sock.connect(str(self.socket))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> RedisServer:
        self.process.start()
        wait_until(self._ready, self.process, "answering PING", 30)
        return self

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class MinioServer:
    """A single-drive MinIO on loopback; ``endpoint``, ``access_key``, ``secret_key``."""

    access_key = "fencedlease"
    secret_key = "fencedlease-secret"

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fencedlease-minio-"))
        self.port = free_port()
        console = free_port()
        self.process = ManagedProcess(
            "minio",
            [
                str(binary_path("minio")),
                "server", str(self.root / "data"),
                "--address", f"127.0.0.1:{self.port}",
                "--console-address", f"127.0.0.1:{console}",
                "--quiet",
            ],
            self.root / "minio.log",
            env={
                "MINIO_ROOT_USER": self.access_key,
                "MINIO_ROOT_PASSWORD": self.secret_key,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
                "HOME": str(self.root),
                "PATH": "/usr/bin:/bin",
            },
        )  # fmt: skip

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        return http_ok(f"{self.endpoint}/minio/health/ready")

    def start(self) -> MinioServer:
        self.process.start()
        wait_until(self._ready, self.process, "ready", 60)
        return self

    def log_tail(self) -> str:
        return self.process.log_tail()

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.root, ignore_errors=True)
