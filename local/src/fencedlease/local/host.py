"""The host plumbing of the local node (:mod:`fencedlease.local.node`): network links and
iptables, kernel settings, mounts, cgroups, the processes a node leaves, a DNS probe. Each
function does one thing on this machine; what to make and what to remove is the node's.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import socket
import struct
import subprocess
from pathlib import Path

from fencedlease.local.cluster import ClusterError

CGROUP_ROOT = Path("/sys/fs/cgroup")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        Path("/proc/sys", name).write_text(value + "\n")


def mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].replace("\\040", " ")
        if mount_point == prefix or mount_point.startswith(prefix + "/"):
            found.append(mount_point)
    return found


def cgroup_dirs(name: str) -> list[Path]:
    out = []
    for hierarchy in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.exists() else []:
        path = hierarchy / name
        if path.is_dir():
            out.append(path)
    return out


def rmdir_cgroup(path: Path) -> None:
    """Remove a cgroup tree bottom-up (cgroup directories are removed with rmdir only)."""
    remove_empty_tree(path)


# The programs a node runs (never a `fencedlease` process: `local down` names the state dir too).
NODE_PROGRAMS = frozenset(
    {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-proxy",
        "kubelet",
        "coredns",
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
    }
)


def processes_under(state_dir: Path) -> list[int]:
    """Node programs whose command line names ``state_dir`` (our children, containerd's shims)
    and every process left in a ``kubepods`` cgroup (containers whose shim is gone)."""
    needle = str(state_dir.resolve()).encode()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]).decode(errors="replace") in NODE_PROGRAMS and any(
            needle in arg for arg in argv
        ):
            pids.add(int(entry))
    return sorted(pids)


def kubepods_processes() -> list[int]:
    pids: set[int] = set()
    for path in cgroup_dirs("kubepods"):
        for procs in path.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return sorted(pids)


def dns_query(server: str, name: str, timeout: float = 1.0) -> list[str]:
    """A minimal DNS A query (UDP); returns the addresses (empty on NXDOMAIN or no answer)."""
    qid = random.randrange(1 << 16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        data, _ = sock.recvfrom(4096)
    _, flags, _, ancount, _, _ = struct.unpack(">HHHHHH", data[:12])
    if flags & 0x000F:
        return []
    pos = 12 + len(question) + 4
    addresses = []
    for _ in range(ancount):
        if data[pos] & 0xC0 == 0xC0:
            pos += 2
        else:
            while data[pos] != 0:
                pos += data[pos] + 1
            pos += 1
        rtype, _, _, rdlength = struct.unpack(">HHIH", data[pos : pos + 10])
        pos += 10
        if rtype == 1 and rdlength == 4:
            addresses.append(socket.inet_ntoa(data[pos : pos + 4]))
        pos += rdlength
    return addresses


IPTABLES = ("iptables", "ip6tables")
_OURS = ("KUBE-", "CNI-")


def _iptables_save(command: str) -> dict[str, list[str]]:
    """``{table: [chain declarations and rules]}`` from ``<command>-save``."""
    out = subprocess.run(
        [f"{command}-save"], capture_output=True, text=True, check=False, timeout=30
    ).stdout
    tables: dict[str, list[str]] = {}
    table = ""
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = []
        elif line.startswith((":", "-A ")) and table:
            tables[table].append(line.split(" [", 1)[0] if line.startswith(":") else line)
    return tables


def iptables_snapshot() -> dict[str, dict[str, list[str]]]:
    return {command: _iptables_save(command) for command in IPTABLES if shutil.which(command)}


def iptables_ours(before: dict[str, dict[str, list[str]]]) -> list[str]:
    """Rules and chains named KUBE-*/CNI-* that were not there before ``up``."""
    found = []
    for command, tables in iptables_snapshot().items():
        for table, lines in tables.items():
            known = set(before.get(command, {}).get(table, []))
            found += [
                f"{command} -t {table} {line}"
                for line in lines
                if line not in known and any(mark in line for mark in _OURS)
            ]
    return found


def iptables_restore_ours(before: dict[str, dict[str, list[str]]]) -> list[str]:
    """Delete the KUBE-*/CNI-* rules and chains made since ``before``; return what is left."""
    for command, tables in iptables_snapshot().items():
        for table, lines in tables.items():
            known = set(before.get(command, {}).get(table, []))
            new = [ln for ln in lines if ln not in known and any(m in ln for m in _OURS)]
            for rule in (ln for ln in new if ln.startswith("-A ")):
                args = shlex.split(rule)[1:]
                subprocess.run([command, "-t", table, "-D", *args], capture_output=True)
            chains = [ln[1:].split()[0] for ln in new if ln.startswith(":")]
            for chain in chains:
                subprocess.run([command, "-t", table, "-F", chain], capture_output=True)
            for chain in chains:
                subprocess.run([command, "-t", table, "-X", chain], capture_output=True)
    return [f"iptables: {line}" for line in iptables_ours(before)]


def netns_uses_bridge(name: str, gateway: str) -> bool:
    """Whether network namespace ``name`` holds an address of ``gateway``'s /24 (the node's
    Pod range)."""
    out = subprocess.run(
        ["ip", "-n", name, "-o", "-4", "addr"], capture_output=True, text=True, check=False
    )
    return out.returncode == 0 and " " + gateway.rsplit(".", 1)[0] + "." in out.stdout


def remove_empty_tree(root: Path) -> None:
    for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()
