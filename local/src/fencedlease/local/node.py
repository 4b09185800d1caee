"""A real node next to the local control plane: ``fencedlease local up --node``.

On top of :class:`~fencedlease.local.cluster.LocalCluster` (etcd + kube-apiserver, here listening
on the node's IP) this starts, all as child processes with their files under the state
directory: containerd (:mod:`fencedlease.local.runtime`), kube-controller-manager,
kube-scheduler, CoreDNS (a host process answering on the node's IP), kube-proxy (iptables mode,
``masqueradeAll``) and one kubelet, and waits until the Node is Ready.

Networking, all on devices this creates (never any other address):

- ``flnode0``: a bridge carrying the node IP ``10.245.0.1/32`` (loopback cannot be a node IP and
  this kernel has no ``dummy`` links); the API server, the kubelet and CoreDNS listen there;
- ``flcni0``: the CNI bridge of the Pods (``10.244.0.0/24``, host-local IPAM, no masquerade);
- Services: ``10.96.0.0/16``; ``kubernetes`` -> the node IP; cluster DNS -> the node IP.

Teardown (:func:`teardown`, run by ``local up`` on exit and again by ``local down``) removes
everything the node made: Pods and their sandboxes, containerd's shims, mounts under the state
directory, network namespaces, both bridges, kube-proxy's iptables chains, the ``kubepods``
cgroups, the paths the kubelet creates outside its root directory, and restores the kernel
settings the kubelet changes (see docs/install.md, "A real node").

This module is the node's orchestration (what runs, in which order, with which configuration;
what teardown removes); each step on the host (links, iptables, sysctls, mounts, cgroups,
processes) is a function of :mod:`fencedlease.local.host`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fencedlease import pki
from fencedlease.local import images, runtime
from fencedlease.local.binaries import binary_path, default_tools, ensure_all
from fencedlease.local.cluster import (
    ClusterError,
    LocalCluster,
    ManagedProcess,
    free_port,
    wait_until,
    write_kubeconfig,
)
from fencedlease.local.host import (
    cgroup_dirs,
    dns_query,
    ip,
    iptables_restore_ours,
    iptables_snapshot,
    kubepods_processes,
    link_exists,
    mounts_under,
    netns_uses_bridge,
    processes_under,
    read_sysctl,
    remove_empty_tree,
    rmdir_cgroup,
    write_sysctl,
)

Say = Callable[[str], None]

NODE_NAME = "fencedlease-node"
NODE_BRIDGE = "flnode0"
NODE_IP = "10.245.0.1"
CNI_BRIDGE = "flcni0"
CNI_NETWORK = "fencedlease-node"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
CLUSTER_CIDR = "10.244.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
SYNC_FREQUENCY_SECONDS = 10
"""The kubelet's periodic Pod sync (default 60): the bound on a dropped downward-API refresh."""
KUBELET_VMODULE = (
    "pod_workers=4,volume_manager=3,desired_state_of_world_populator=4,"
    "reconciler_common=4,operation_generator=4,atomic_writer=4"
)

# What the kubelet sets on the host when protectKernelDefaults is false (it would refuse to
# start with protectKernelDefaults true unless they were already set): saved on `up`, restored
# on `down`. kernel.panic_on_oops=1 on a shared machine is the one that matters.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Paths the kubelet creates outside its configured directories (device-plugins socket
# directory, /var/log/containers links, its plugin directory probe): removed on `down` unless
# they existed before `up`.
KUBELET_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/var/lib/cni",
)
# Directories containerd's shims and the CRI create (fifo/, s/, runc/<namespace>/, netns
# mount points): emptied of our files by then; removed only if empty and new.
SHARED_DIRS = ("/run/containerd", "/var/run/netns")
OUTSIDE_PATHS = KUBELET_PATHS + SHARED_DIRS
RECORD = "node.json"


def _say_nothing(_msg: str) -> None:
    return None


@dataclass
class NodeCluster:
    """The local control plane plus one real node. ``start`` / ``stop`` or a context manager."""

    state_dir: Path
    crds_dir: Path | None = None
    cluster: LocalCluster | None = None
    containerd: runtime.Containerd | None = None
    processes: list[ManagedProcess] = field(default_factory=list)
    say: Say = _say_nothing

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def etcd_endpoint(self) -> str:
        assert self.cluster is not None
        return self.cluster.etcd_endpoint

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    # ---------------------------------------------------------------- start

    def prepare(self, say: Say = _say_nothing) -> None:
        """Everything that may take long or fail before anything starts: builds, packages."""
        ensure_all(default_tools(node=True))
        runtime.ensure_packages(say)
        images.pause_archive(say)
        images.busybox_archive(say)

    def start(self, say: Say = _say_nothing) -> NodeCluster:
        self.say = say
        if os.geteuid() != 0:
            raise ClusterError("a node needs root (containerd, cgroups, network devices)")
        self.state_dir = self.state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.prepare(say)
        if link_exists(NODE_BRIDGE) and not (self.state_dir / RECORD).exists():
            raise ClusterError(
                f"the network device {NODE_BRIDGE} exists: another fencedlease node runs on "
                "this machine (stop it with 'fencedlease local down --state-dir ...')"
            )
        teardown(self.state_dir, say)  # leftovers of a run that was killed
        self._record()
        try:
            self._network()
            kwargs: dict[str, Any] = {"node_ip": NODE_IP}
            if self.crds_dir is not None:
                kwargs["crds_dir"] = self.crds_dir
            self.cluster = LocalCluster(self.state_dir, **kwargs)
            self.cluster.start(say)
            self._containerd(say)
            self._control_plane_controllers(say)
            self._coredns(say)
            self._kube_proxy(say)
            self._kubelet(say)
        except BaseException:
            self.stop(say)
            raise
        return self

    def _record(self) -> None:
        """Save what teardown must restore: kernel settings and which outside paths existed."""
        path = self.state_dir / RECORD
        if path.exists():
            return
        record = {
            "sysctls": {name: read_sysctl(name) for name in KUBELET_SYSCTLS},
            "preexisting": [p for p in OUTSIDE_PATHS if Path(p).exists()],
            "kubepods_preexisting": bool(cgroup_dirs("kubepods")),
            "iptables": iptables_snapshot(),
        }
        path.write_text(json.dumps(record, indent=1))

    def _network(self) -> None:
        if not link_exists(NODE_BRIDGE):
            ip("link", "add", NODE_BRIDGE, "type", "bridge")
        ip("addr", "replace", f"{NODE_IP}/32", "dev", NODE_BRIDGE)
        ip("link", "set", NODE_BRIDGE, "up")
        cni = self.state_dir / "cni" / "net.d"
        cni.mkdir(parents=True, exist_ok=True)
        conf = {
            "cniVersion": "1.0.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": CNI_BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.state_dir / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (cni / "10-fencedlease.conflist").write_text(json.dumps(conf, indent=1))

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.logs / f"{name}.log")
        process.start()
        self.processes.append(process)
        return process

    def _containerd(self, say: Say) -> None:
        self.containerd = runtime.Containerd(
            self.state_dir / "containerd", images.PAUSE_IMAGE, self.state_dir / "cni" / "net.d"
        )
        say("starting containerd")
        self.containerd.start(self.logs / "containerd.log")
        images.base_images(self.containerd, say)

    def _kubeconfig_for(self, name: str, common_name: str, org: str | None = None) -> Path:
        assert self.cluster is not None and self.cluster.apiserver is not None
        api = self.cluster.apiserver
        assert api.ca is not None
        pair = pki.ensure_cert(
            api.ca,
            self.state_dir / "pki",
            name,
            common_name,
            organizations=(org,) if org else (),
            client=True,
        )
        return write_kubeconfig(self.state_dir / f"{name}.kubeconfig", api.url, api.ca, pair)

    def _control_plane_controllers(self, say: Say) -> None:
        pki_dir = self.state_dir / "pki"
        admin = str(self.kubeconfig)
        # As on a kubeadm cluster: its own identity, and each controller with its service
        # account's (namespace-controller, generic-garbage-collector...), the identities the
        # fence webhook recognises as cluster deleters (docs/fenced-objects.md).
        kcm_config = self._kubeconfig_for("controller-manager", "system:kube-controller-manager")
        say("starting kube-controller-manager and kube-scheduler")
        kcm = self._process(
            "kube-controller-manager",
            [
                str(binary_path("kube-controller-manager")),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={pki_dir / 'sa.key'}",
                f"--root-ca-file={pki_dir / 'ca.crt'}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                # No IPAM (off by default): the node's Pod range is fixed in its CNI config.
                "--controllers=*",
                "--v=1",
            ],
        )
        self._process(
            "kube-scheduler",
            [
                str(binary_path("kube-scheduler")),
                f"--kubeconfig={admin}",
                f"--authentication-kubeconfig={admin}",
                f"--authorization-kubeconfig={admin}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        assert self.cluster is not None
        cluster = self.cluster

        def default_service_account() -> bool:
            got = cluster.kubectl("get", "serviceaccount", "default", "-n", "default", check=False)
            return got.returncode == 0

        wait_until(default_service_account, kcm, "creating ServiceAccounts", 60)

    def _coredns(self, say: Say) -> None:
        corefile = self.state_dir / "coredns" / "Corefile"
        corefile.parent.mkdir(parents=True, exist_ok=True)
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig} fencedlease-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""
        )
        say(f"starting CoreDNS on {NODE_IP}:53")
        process = self._process(
            "coredns", [str(binary_path("coredns")), "-conf", str(corefile), "-dns.port", "53"]
        )

        def resolves() -> bool:
            try:
                return bool(dns_query(NODE_IP, f"kubernetes.default.svc.{CLUSTER_DOMAIN}"))
            except OSError:
                return False

        wait_until(resolves, process, "resolving kubernetes.default", 60)

    def _kube_proxy(self, say: Say) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": CLUSTER_CIDR,
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Pod -> Service -> Pod on the same bridge needs SNAT without br_netfilter.
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
            # 0: leave the host's conntrack settings alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "nodePortAddresses": [f"{NODE_IP}/32"],
        }
        path = self.state_dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        say("starting kube-proxy")
        self._process(
            "kube-proxy",
            [str(binary_path("kube-proxy")), f"--config={path}", "--v=1"],
        )

    def _kubelet(self, say: Say) -> None:
        assert self.cluster is not None and self.cluster.apiserver is not None
        assert self.containerd is not None
        api = self.cluster.apiserver
        assert api.ca is not None
        kubeconfig = self._kubeconfig_for("kubelet", f"system:node:{NODE_NAME}", "system:nodes")
        serving = pki.ensure_cert(
            api.ca, self.state_dir / "pki", "kubelet-serving", NODE_NAME, hosts=(NODE_IP,)
        )
        resolv = self.state_dir / "kubelet-resolv.conf"
        resolv.write_text("")  # Pods get the cluster DNS only, never this machine's resolver
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "protectKernelDefaults": False,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(api.ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
            "address": NODE_IP,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "clusterDNS": [NODE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "containerRuntimeEndpoint": self.containerd.endpoint,
            "podLogsDir": str(self.state_dir / "pod-logs"),
            "volumePluginDir": str(self.state_dir / "kubelet-plugins"),
            "podCIDR": POD_CIDR,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            # A small shared machine: never evict or garbage-collect the locally built images.
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            # A downward-API refresh the kubelet drops (a remount still running when the next
            # annotation change comes) is redone at the Pod's periodic sync, every syncFrequency
            # to 1.5 x syncFrequency: 60-90 s by default, 10-15 s here (docs/downward-api.md).
            "syncFrequency": f"{SYNC_FREQUENCY_SECONDS}s",
        }
        path = self.state_dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        say("starting the kubelet")
        process = self._process(
            "kubelet",
            [
                str(binary_path("kubelet")),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.state_dir / 'kubelet'}",
                f"--cert-dir={self.state_dir / 'kubelet-pki'}",
                f"--node-ip={NODE_IP}",
                f"--hostname-override={NODE_NAME}",
                "--v=1",
                # The pod worker's syncs and the volume manager's remounts, to explain a
                # downward-API file that lags (e2e/test_10_chart.py keeps them when it does).
                f"--vmodule={KUBELET_VMODULE}",
            ],
        )
        wait_until(self.node_ready, process, f"Node {NODE_NAME} Ready", 120)

    def node_ready(self) -> bool:
        assert self.cluster is not None
        got = self.cluster.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if got.returncode != 0:
            return False
        conditions = json.loads(got.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # ---------------------------------------------------------------- stop

    def _by_name(self, name: str) -> ManagedProcess | None:
        return next((p for p in self.processes if p.name == name), None)

    def _drain(self, say: Say, timeout: float = 90.0) -> None:
        """Delete every Pod and wait until the kubelet has stopped all of their containers."""
        kubelet = self._by_name("kubelet")
        if (
            self.cluster is None
            or self.containerd is None
            or kubelet is None
            or not kubelet.alive()
            or not self.containerd.ready()
        ):
            return
        say("deleting all Pods (the kubelet stops their containers and sandboxes)")
        self.cluster.kubectl(
            "delete", "pods", "--all", "-A", "--grace-period=1", "--wait=false", check=False
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tasks = self.containerd.ctr("tasks", "ls", "-q", check=False).stdout.split()
            pods = self.cluster.kubectl("get", "pods", "-A", "-o", "name", check=False).stdout
            if not tasks and not pods.strip():
                return
            time.sleep(0.5)
        say("Pods did not all stop in time; killing the remaining containers")

    def stop(self, say: Say | None = None) -> None:
        say = say or self.say
        for name in ("kube-controller-manager", "kube-scheduler"):
            process = self._by_name(name)
            if process is not None:
                process.stop()
        try:
            self._drain(say)
        except (ClusterError, subprocess.SubprocessError, OSError) as exc:
            say(f"draining the node failed ({exc}); cleaning up directly")
        for process in reversed(self.processes):
            process.stop()
        if self.containerd is not None:
            if self.containerd.process is not None and self.containerd.process.alive():
                self.containerd.kill_all_tasks()
            self.containerd.stop()
        if self.cluster is not None:
            self.cluster.stop()
        teardown(self.state_dir, say)

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def teardown(state_dir: Path, say: Say = _say_nothing) -> list[str]:
    """Remove what a node made, whether or not its processes are still there.

    Returns what could not be removed (empty when the machine is as it was).
    """
    record_path = state_dir / RECORD
    if not record_path.exists():
        return []
    record = json.loads(record_path.read_text())
    problems: list[str] = []
    # Processes: our children are gone with their parent; containerd's shims are not.
    own_kubepods = not record.get("kubepods_preexisting")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = processes_under(state_dir) + (kubepods_processes() if own_kubepods else [])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path("/proc", str(p)).exists()]
            time.sleep(0.1)
    # iptables: kube-proxy removes its own chains; the kubelet's KUBE-FIREWALL and canaries stay.
    proxy = binary_path("kube-proxy")
    if proxy.exists():
        subprocess.run([str(proxy), "--cleanup"], capture_output=True, check=False, timeout=60)
    problems += iptables_restore_ours(record.get("iptables", {}))
    # Mounts under the state directory (the kubelet's root, volumes, container rootfs).
    for mount_point in sorted(mounts_under(state_dir), key=len, reverse=True):
        if subprocess.run(["umount", mount_point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
    # Network namespaces whose sandboxes are gone (containerd names them cni-<uuid>).
    netns_dir = Path("/var/run/netns")
    for netns in sorted(netns_dir.glob("cni-*")) if netns_dir.exists() else []:
        if netns_uses_bridge(netns.name, POD_GATEWAY):
            subprocess.run(["umount", str(netns)], capture_output=True, check=False)
            netns.unlink(missing_ok=True)
    for link in (CNI_BRIDGE, NODE_BRIDGE):
        if link_exists(link):
            ip("link", "del", link, check=False)
    # cgroups the kubelet made, in every hierarchy.
    if not record.get("kubepods_preexisting"):
        for path in cgroup_dirs("kubepods"):
            rmdir_cgroup(path)
            if path.exists():
                problems.append(f"cgroup {path} (processes still in it?)")
    # Paths created outside the state directory.
    preexisting = set(record.get("preexisting", []))
    for outside in KUBELET_PATHS:
        if outside not in preexisting and Path(outside).exists():
            shutil.rmtree(outside, ignore_errors=True)
    for shared in SHARED_DIRS:
        if shared not in preexisting and Path(shared).exists():
            remove_empty_tree(Path(shared))
    results = Path("/var/lib/cni/results")
    for cached in results.glob(f"{CNI_NETWORK}-*") if results.exists() else []:
        cached.unlink(missing_ok=True)
    for name, value in record.get("sysctls", {}).items():
        if value is not None and read_sysctl(name) != value:
            write_sysctl(name, value)
            if read_sysctl(name) != value:
                problems.append(f"sysctl {name} could not be restored to {value}")
    problems += [f"process {pid}" for pid in processes_under(state_dir)]
    problems += [f"mount {m}" for m in mounts_under(state_dir)]
    problems += [f"link {n}" for n in (CNI_BRIDGE, NODE_BRIDGE) if link_exists(n)]
    if problems:
        say("could not remove: " + "; ".join(problems))
    else:
        record_path.unlink()
    return problems
