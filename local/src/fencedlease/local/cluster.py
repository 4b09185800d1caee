"""A real local control plane: etcd and kube-apiserver as child processes on loopback ports.

This is the envtest pattern of Go operators: no kubelet, no nodes, no controller-manager, but
the real API server (schema validation, CEL rules, admission webhooks over TLS, RBAC) backed by
a real etcd. The same etcd serves the operator's lease store under its own key prefix.

Every child process gets ``PR_SET_PDEATHSIG`` so it dies with its parent: no stray process
survives a crashed test run or Ctrl-C. A state directory keeps certificates, ports and etcd data,
so restarting on the same directory keeps leases and tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from fencedlease import pki
from fencedlease.local.binaries import binary_path


class ClusterError(RuntimeError):
    """The local control plane failed to start; the message names the process and its log."""


def _with_parent(argv: list[str]) -> list[str]:
    """``argv`` run so that it gets SIGTERM when the process that started it dies
    (``PR_SET_PDEATHSIG``), through util-linux's ``setpriv`` where it exists.

    Not a ``preexec_fn``: that runs Python in the forked child of a process with threads (the
    tests' and the CLI's gRPC threads), which makes subprocess use ``fork()`` instead of
    ``vfork()``, runs gRPC's fork handlers (``Other threads are currently calling into gRPC,
    skipping fork() handlers``) and can leave the child hung or broken before its ``exec``:
    a child that never starts (``epoll_wait error: Bad file descriptor`` and nothing else in
    its log) made an integration test flaky.

    ``setpriv`` does not re-check its parent after the ``prctl``: a parent that died before it
    would leave the child running for good (seen under load: the unit test that kills the
    parent at once failed). So a shell between ``setpriv`` and ``argv`` checks that its
    parent is still the process that started it (the death signal is set by then, so a later
    death is signalled) and otherwise exits without starting ``argv``."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return argv
    check = f'[ "$PPID" = {os.getpid()} ] || exit 0; exec "$@"'
    return [setpriv, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", check, "sh", *argv]


def default_state_dir() -> Path:
    """Where ``local up`` keeps its files (``$FENCEDLEASE_STATE_DIR``, else under
    ``$XDG_STATE_HOME``): the node's, the images loader's and ``local down``'s default."""
    env = os.environ.get("FENCEDLEASE_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fencedlease" / "local"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def default_crds_dir() -> Path:
    """The CRD manifests: package data of ``fencedlease`` (``crds/`` links to the repository's)."""
    env = os.environ.get("FENCEDLEASE_CRDS_DIR")
    if env:
        return Path(env)
    # Resolved: in a source checkout this is a symlink to crds/, which kubectl reads as a file.
    path = (Path(__file__).resolve().parents[1] / "crds").resolve()
    if not any(path.glob("*.yaml")):
        raise ClusterError(
            f"no CRD manifests in {path}: this fencedlease installation is incomplete "
            "(reinstall it, or set FENCEDLEASE_CRDS_DIR to a directory of CRD manifests)"
        )
    return path


@dataclass
class ManagedProcess:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            _with_parent(self.argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_until(
    check: Callable[[], bool], process: ManagedProcess, what: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise ClusterError(
                f"{process.name} exited while waiting for {what}; log {process.log_path}:\n"
                + process.log_tail()
            )
        if check():
            return
        time.sleep(0.2)
    raise ClusterError(
        f"{process.name} not {what} after {timeout:.0f}s; log {process.log_path}:\n"
        + process.log_tail()
    )


@dataclass
class EtcdServer:
    """A single-member etcd on loopback."""

    data_dir: Path
    log_path: Path
    client_port: int = 0
    peer_port: int = 0
    process: ManagedProcess | None = None
    compaction_mode: str = "periodic"
    """``--auto-compaction-mode`` (docs/operations.md, "etcd maintenance"): ``periodic`` keeps
    ``compaction_retention`` of history (a duration), ``revision`` the last that many revisions."""
    compaction_retention: str = "1h"
    quota_backend_bytes: int = 4 * 1024**3
    """``--quota-backend-bytes``: above it etcd raises the NOSPACE alarm and refuses writes."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 60.0) -> None:
        self.client_port = self.client_port or free_port()
        self.peer_port = self.peer_port or free_port()
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.process = ManagedProcess(
            "etcd",
            [
                str(binary_path("etcd")),
                "--name=default",
                f"--data-dir={self.data_dir}",
                f"--listen-client-urls={self.endpoint}",
                f"--advertise-client-urls={self.endpoint}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--log-level=warn",
                f"--auto-compaction-mode={self.compaction_mode}",
                f"--auto-compaction-retention={self.compaction_retention}",
                f"--quota-backend-bytes={self.quota_backend_bytes}",
                "--snapshot-count=100000",
            ],
            self.log_path,
        )
        self.process.start()
        wait_until(self.healthy, self.process, "healthy", timeout)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


# With a node (``local up --node``): the Service range and the in-cluster API address.
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"


@dataclass
class KubeAPIServer:
    state_dir: Path
    etcd_endpoint: str
    port: int = 0
    process: ManagedProcess | None = None
    ca: pki.KeyPair | None = None
    admin: pki.KeyPair | None = None
    # With a node: listen on the node's IP (Pods reach it through the `kubernetes` Service).
    node_ip: str | None = None

    @property
    def host(self) -> str:
        return self.node_ip or "127.0.0.1"

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def _mode_args(self) -> list[str]:
        if self.node_ip is None:
            return [
                "--authorization-mode=RBAC",
                # No controller-manager runs, so no ServiceAccount objects appear by themselves.
                "--disable-admission-plugins=ServiceAccount",
                "--endpoint-reconciler-type=none",
            ]
        admin = self.admin
        assert admin is not None
        return [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            # Webhook Services are reached at their endpoints (Pod IPs on the node's bridge).
            "--enable-aggregator-routing=true",
            # Never resolve the node's name through this machine's DNS resolver.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={admin.cert}",
            f"--kubelet-client-key={admin.key}",
        ]

    def start(self, timeout: float = 120.0) -> None:
        pki_dir = self.state_dir / "pki"
        self.ca = pki.ensure_ca(pki_dir, "ca", "fencedlease-local-ca")
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc")
        if self.node_ip is not None:
            hosts += (self.node_ip, KUBERNETES_SERVICE_IP, "kubernetes.default.svc.cluster.local")
        serving = pki.ensure_cert(
            self.ca,
            pki_dir,
            "apiserver" if self.node_ip is None else "apiserver-node",
            "kube-apiserver",
            hosts=hosts,
        )
        self.admin = pki.ensure_cert(
            self.ca, pki_dir, "admin", "admin", organizations=("system:masters",), client=True
        )
        sa_key, sa_pub = pki.ensure_rsa_keypair(pki_dir, "sa")
        self.port = self.port or free_port()
        self.process = ManagedProcess(
            "kube-apiserver",
            [
                str(binary_path("kube-apiserver")),
                f"--etcd-servers={self.etcd_endpoint}",
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                f"--secure-port={self.port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca.cert}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *self._mode_args(),
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
            self.state_dir / "logs" / "kube-apiserver.log",
        )
        self.process.start()
        wait_until(self.ready, self.process, "ready (/readyz)", timeout)

    def ssl_context(self) -> ssl.SSLContext:
        assert self.ca is not None and self.admin is not None
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return ctx

    def ready(self) -> bool:
        try:
            req = urllib.request.Request(f"{self.url}/readyz")
            with urllib.request.urlopen(req, timeout=2, context=self.ssl_context()) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def run_kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The kubectl built from the same Kubernetes version, against ``kubeconfig`` (unchecked)."""
    cmd = [str(binary_path("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(
        cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
    )


def write_kubeconfig(
    path: Path, server: str, ca: pki.KeyPair, client: pki.KeyPair, user: str = "admin"
) -> Path:
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "fencedlease-local",
                "cluster": {"server": server, "certificate-authority-data": b64(ca.cert)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(client.cert),
                    "client-key-data": b64(client.key),
                },
            }
        ],
        "contexts": [
            {"name": "fencedlease-local", "context": {"cluster": "fencedlease-local", "user": user}}
        ],
        "current-context": "fencedlease-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


@dataclass
class LocalCluster:
    """etcd + kube-apiserver + kubeconfig + CRDs, in ``state_dir``.

    Use as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    state_dir: Path
    crds_dir: Path | None = field(default_factory=default_crds_dir)
    etcd: EtcdServer | None = None
    apiserver: KubeAPIServer | None = None
    node_ip: str | None = None  # set by fencedlease.local.node: the API server listens there

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def etcd_endpoint(self) -> str:
        assert self.etcd is not None
        return self.etcd.endpoint

    @property
    def api_url(self) -> str:
        assert self.apiserver is not None
        return self.apiserver.url

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.crt"

    def _ports(self) -> dict[str, int]:
        path = self.state_dir / "ports.json"
        wanted: dict[str, int] = {}
        if path.exists():
            with contextlib.suppress(ValueError):
                wanted = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        ports = {
            name: (wanted[name] if name in wanted and _port_free(wanted[name]) else free_port())
            for name in ("etcd_client", "etcd_peer", "apiserver")
        }
        path.write_text(json.dumps(ports))
        return ports

    def start(self, progress: Callable[[str], None] | None = None) -> LocalCluster:
        say = progress or (lambda _msg: None)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # Build (first use) before we start anything, so a build failure leaves nothing behind.
        for binary in ("etcd", "kube-apiserver", "kubectl"):
            binary_path(binary)
        ports = self._ports()
        try:
            self.etcd = EtcdServer(
                self.state_dir / "etcd",
                self.state_dir / "logs" / "etcd.log",
                ports["etcd_client"],
                ports["etcd_peer"],
            )
            say(f"starting etcd on {self.etcd.endpoint}")
            self.etcd.start()
            self.apiserver = KubeAPIServer(
                self.state_dir, self.etcd.endpoint, ports["apiserver"], node_ip=self.node_ip
            )
            say(f"starting kube-apiserver on {self.apiserver.url}")
            self.apiserver.start()
            assert self.apiserver.ca is not None and self.apiserver.admin is not None
            write_kubeconfig(
                self.kubeconfig, self.apiserver.url, self.apiserver.ca, self.apiserver.admin
            )
            if self.crds_dir is not None:
                say(f"applying CRDs from {self.crds_dir}")
                self.apply_crds(self.crds_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def apply_crds(self, crds_dir: Path) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds_dir))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crds_dir))
        # Established is not yet servable: the storage may still answer 429 "(re)initializing".
        deadline = time.monotonic() + 60
        while self.kubectl("get", "fencing", "-A", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ClusterError("the CRDs are established but not served after 60s")
            time.sleep(0.2)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the kubectl built from the same Kubernetes version against this cluster."""
        result = run_kubectl(self.kubeconfig, *args, input=input, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def stop(self) -> None:
        if self.apiserver is not None:
            self.apiserver.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def operator_process(
    kubeconfig: Path,
    etcd_endpoint: str,
    log_path: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> ManagedProcess:
    """A ``fencedlease run`` child process against ``kubeconfig`` (not yet started)."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["KUBECONFIG"] = str(kubeconfig)
    child_env["FENCEDLEASE_ETCD_ENDPOINTS"] = etcd_endpoint
    argv = [sys.executable, "-m", "fencedlease", "run", *extra_args]
    return ManagedProcess("fencedlease-operator", argv, log_path, env=child_env)
