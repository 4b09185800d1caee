"""The node's container runtime: containerd + runc + CNI plugins from Debian packages.

containerd runs as a child process with its root, state, socket and config under the node's
state directory (nothing in ``/etc/containerd`` or ``/var/lib/containerd`` is touched), with
``restrict_oom_score_adj = true``: without CAP_SYS_RESOURCE a negative oom_score_adj fails every
sandbox ("can't get final child's PID from pipe").

Versions (Debian bookworm): containerd 1.6, runc 1.1, containernetworking-plugins 1.1. The
kubelet v1.37 warns that containerd 1.6 does not implement ``RuntimeConfig`` and falls back to
its configured cgroup driver; Kubernetes 1.38 will need containerd >= 2.0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fencedlease.local.cluster import ClusterError, ManagedProcess, wait_until

# Debian package -> a file it installs that we need.
PACKAGES: dict[str, str] = {
    "containerd": "/usr/bin/containerd",
    "runc": "/usr/sbin/runc",
    "containernetworking-plugins": "/usr/lib/cni/bridge",
    "iptables": "/usr/sbin/iptables",
    "busybox-static": "/bin/busybox",
}
CNI_BIN_DIR = Path("/usr/lib/cni")


class RuntimeMissing(ClusterError):
    """A runtime package is missing and cannot be installed here; the message says how."""


def install_command(packages: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *packages]


def apt_install(packages: dict[str, str], what: str, say: Callable[[str], None] | None) -> None:
    """Install the Debian ``packages`` ({name: a file it installs}) whose file is missing, with
    apt-get (as root; ``apt-get update`` first when the lists do not know them), or explain."""
    missing = [pkg for pkg, path in packages.items() if not Path(path).exists()]
    if not missing:
        return
    command = install_command(missing)
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeMissing(
            f"{what} needs {', '.join(missing)}; install them as root: "
            f"apt-get update && {' '.join(command)}"
        )
    if say is not None:
        say(f"installing {', '.join(missing)} (apt-get; first use only)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, check=False)
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    still = [pkg for pkg, path in packages.items() if not Path(path).exists()]
    if result.returncode != 0 or still:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
        raise RuntimeMissing(
            f"'{' '.join(command)}' failed (exit {result.returncode}):\n{tail}\n"
            f"Run 'apt-get update && {' '.join(command)}' as root and retry."
        )


def ensure_packages(say: Callable[[str], None] | None = None) -> None:
    """The node's runtime packages (see :data:`PACKAGES`)."""
    apt_install(PACKAGES, "the node", say)


@dataclass
class Containerd:
    """containerd with everything under ``base`` (``<state-dir>/containerd``)."""

    base: Path
    sandbox_image: str
    cni_conf_dir: Path
    process: ManagedProcess | None = None

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.base / "state"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def registry_config_dir(self) -> Path:
        """containerd's registry hosts (``<host:port>/hosts.toml``, read on each pull): the
        loopback registry of ``make e2e`` (local/registry.py) is plain HTTP."""
        return self.base / "certs.d"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def config(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.root}"
state = "{self.state}"
# Only the CRI, the overlayfs snapshotter and runc: no btrfs/zfs/devmapper/aufs probing.
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.base / "containerd-ttrpc.sock"}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{self.base / "opt"}"

[{cri}]
  sandbox_image = "{self.sandbox_image}"
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj would fail every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{self.runc_root}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.cni_conf_dir}"
    max_conf_num = 1
  [{cri}.registry]
    config_path = "{self.registry_config_dir}"
"""

    def start(self, log_path: Path, timeout: float = 60.0) -> None:
        for path in (self.root, self.state, self.runc_root):
            path.mkdir(parents=True, exist_ok=True)
        conf = self.base / "config.toml"
        conf.write_text(self.config())
        self.socket.unlink(missing_ok=True)
        self.process = ManagedProcess(
            "containerd", ["/usr/bin/containerd", "--config", str(conf)], log_path
        )
        self.process.start()
        wait_until(self.ready, self.process, "serving its socket", timeout)

    def ready(self) -> bool:
        if not self.socket.exists():
            return False
        return self.ctr("version", check=False).returncode == 0

    def ctr(
        self, *args: str, namespace: str = "k8s.io", check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["/usr/bin/ctr", "--address", str(self.socket), "--namespace", namespace, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"ctr {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def kill_all_tasks(self) -> list[str]:
        """SIGKILL and delete every task and container in ``k8s.io`` (fallback cleanup)."""
        left = []
        for line in self.ctr("tasks", "ls", "-q", check=False).stdout.split():
            left.append(line)
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", line, check=False, timeout=30)
            self.ctr("tasks", "delete", "-f", line, check=False, timeout=30)
        for line in self.ctr("containers", "ls", "-q", check=False).stdout.split():
            self.ctr("containers", "delete", line, check=False, timeout=30)
        return left

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=20)
