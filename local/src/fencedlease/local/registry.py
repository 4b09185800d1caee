"""A loopback OCI registry, as a real cluster pulls from one (``make e2e``; docs/release.md).

go-containerregistry's ``crane registry serve`` (built from its Go module and cached by
:mod:`fencedlease.local.binaries`, ``crane``) listens on a port of its choosing on 127.0.0.1,
plain HTTP, blobs in memory. :meth:`Registry.push_image` pushes an OCI archive (what
``make release`` and :mod:`fencedlease.local.images` make) with ``crane push`` and returns the
digest the registry serves; :meth:`Registry.push_chart` pushes a chart ``.tgz`` with
``helm push`` (``oci://<address>/charts/<name>``).

containerd reaches it through a ``hosts.toml`` in the node's registry config directory
(:func:`containerd_hosts`; ``config_path`` in local/runtime.py): plain HTTP, pull and resolve.
Nothing here is written outside the directories given.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import ClusterError, ManagedProcess, wait_until

HOST = "127.0.0.1"
_SERVING = re.compile(r"serving on port (\d+)")


class RegistryError(ClusterError):
    """The registry did not start, or a push to it failed; the message has its log."""


@dataclass
class Registry:
    """``crane registry serve`` on 127.0.0.1, its log at ``log_path``."""

    log_path: Path
    process: ManagedProcess | None = None
    port: int = 0

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the registry's host in image references and ``oci://`` URLs."""
        if not self.port:
            raise RegistryError("the registry is not started")
        return f"{HOST}:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        """Start on a free loopback port (crane picks it: no race with another listener) and
        wait until ``GET /v2/`` answers."""
        self.log_path.unlink(missing_ok=True)
        crane = binary_path("crane")
        self.process = ManagedProcess(
            "registry", [str(crane), "registry", "serve", "--address", f"{HOST}:0"], self.log_path
        )
        self.process.start()
        wait_until(self._listening, self.process, "listening", timeout)
        wait_until(self.ready, self.process, "answering GET /v2/", timeout)

    def _listening(self) -> bool:
        match = _SERVING.search(self.log_path.read_text(errors="replace"))
        if match:
            self.port = int(match.group(1))
        return bool(match)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=5) as reply:
                return int(reply.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def logs(self, lines: int = 60) -> str:
        """The registry's log (its requests and errors), for a failure's message."""
        tail = self.process.log_tail(lines) if self.process else ""
        return f"--- registry log {self.log_path} ---\n{tail}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=10)

    def _run(self, *cmd: str, timeout: float = 600) -> str:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RegistryError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n"
                + self.logs()
            )
        return done.stdout

    def push_image(self, archive: Path, repository: str, tag: str) -> str:
        """Push the one image of the OCI archive ``archive`` as ``<address>/<repository>:<tag>``;
        returns its digest (``sha256:...``) as the registry serves it."""
        with tempfile.TemporaryDirectory(prefix="fencedlease-oci-") as tmp:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            # A directory is read as an OCI image layout (a file would be a docker tarball).
            reference = f"{self.address}/{repository}:{tag}"
            pushed = self._run(str(binary_path("crane")), "push", tmp, reference).strip()
        named = re.escape(f"{self.address}/{repository}")
        match = re.fullmatch(rf"{named}@(sha256:[0-9a-f]{{64}})", pushed)
        if match is None:
            raise RegistryError(f"crane push printed {pushed!r}, not {repository}@sha256:...")
        served = self._run(str(binary_path("crane")), "digest", "--insecure", reference).strip()
        if served != match.group(1):
            raise RegistryError(f"{reference}: pushed {match.group(1)}, served {served}")
        return served

    def push_chart(self, helm: Path, tgz: Path, project: str = "charts") -> str:
        """``helm push`` the chart archive ``tgz``; returns ``oci://<address>/<project>``, the
        prefix of ``helm install oci://.../<chart name>``."""
        url = f"oci://{self.address}/{project}"
        self._run(str(helm), "push", str(tgz), url, "--plain-http")
        return url


@contextmanager
def serving(log_path: Path, timeout: float = 60.0) -> Iterator[Registry]:
    """A started :class:`Registry`, stopped on the way out."""
    registry = Registry(log_path)
    try:
        registry.start(timeout)
        yield registry
    finally:
        registry.stop()


def containerd_hosts(config_dir: Path, address: str) -> Path:
    """Let containerd (CRI, ``config_path = config_dir``) pull from the plain-HTTP registry at
    ``address``: ``<config_dir>/<address>/hosts.toml``. containerd reads it on each pull, so it
    can be written after containerd started."""
    hosts = config_dir / address / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(
        f'server = "http://{address}"\n\n'
        f'[host."http://{address}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )
    return hosts
