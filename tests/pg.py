"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary directory, listening on a
unix socket only, run as an unprivileged user when we are root (``nobody``: PostgreSQL refuses
to run as root).  Debian's binaries, installed by ``scripts/ensure-postgres.sh`` (``make test``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any


def bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not candidates:
        raise RuntimeError("PostgreSQL is not installed: run scripts/ensure-postgres.sh")
    return Path(candidates[-1]).parent


class PostgresServer:
    """``start()`` / ``stop()``; ``conninfo`` for psycopg (superuser ``fencedlease``, trust)."""

    user = "fencedlease"

    def __init__(self, port: int = 54329) -> None:
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="fencedlease-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.log = self.root / "postgres.log"
        self.port = port
        self.run_as: str | None = "nobody" if os.geteuid() == 0 else None

    def _chown(self) -> None:
        if self.run_as is None:
            return
        pw = pwd.getpwnam(self.run_as)
        for path in (self.root, self.socket_dir):
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str) -> None:
        kwargs: dict[str, Any] = {"user": self.run_as} if self.run_as else {}
        subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            check=True,
            capture_output=True,
            text=True,
            cwd=self.root,
            timeout=120,
            **kwargs,
        )

    def start(self) -> PostgresServer:
        self.socket_dir.mkdir()
        self._chown()
        self._run(
            "initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8",
            "--no-sync",
        )  # fmt: skip
        options = (
            f"-c listen_addresses='' -k {self.socket_dir} -p {self.port} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        deadline = time.monotonic() + 30
        while not (self.socket_dir / f".s.PGSQL.{self.port}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        return self

    @property
    def conninfo(self) -> str:
        return f"host={self.socket_dir} port={self.port} user={self.user} dbname=postgres"

    def fresh_database(self, prefix: str) -> str:
        """Create an empty database with a random name; its conninfo."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.conninfo, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.conninfo.replace("dbname=postgres", f"dbname={name}")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
