"""``fencedlease etcd ...``: the backup CronJob's retention step and the restore command.

Exit codes (docs/operations.md, "Backup and restore"): 0 done; 2 bad arguments; 3 the snapshot
is missing, truncated or corrupted; 4 the target data directory is not empty; 5 ``etcdutl``
failed or was not found; 6 the Kubernetes API could not be read (``--from-cluster``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from fencedlease.etcdbackup import plan

EXIT_SNAPSHOT, EXIT_DATA_DIR, EXIT_ETCDUTL, EXIT_KUBE = 3, 4, 5, 6
_CHUNK = 1 << 20


class _Fail(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_parser(sub: Any) -> argparse.ArgumentParser:
    etcd: argparse.ArgumentParser = sub.add_parser(
        "etcd", help="back up and restore the etcd holding the fencing state"
    )
    esub = etcd.add_subparsers(dest="etcd_command", required=True)
    backups = esub.add_parser("backups", help="scheduled snapshots")
    bsub = backups.add_subparsers(dest="backups_command", required=True)
    rotate = bsub.add_parser(
        "rotate",
        help="check a new snapshot, give it a dated name, delete all but the newest --keep",
    )
    rotate.add_argument("--dir", type=Path, required=True, help="the backup directory")
    rotate.add_argument("--incoming", default=".incoming.db", help="default: %(default)s")
    rotate.add_argument("--prefix", required=True, help="snapshot names: PREFIX-<UTC time>.db")
    rotate.add_argument("--keep", type=int, required=True, help="snapshots kept (at least 1)")

    restore = esub.add_parser(
        "restore",
        help="restore one member from a snapshot with a revision bump above every issued token",
    )
    restore.add_argument("snapshot", type=Path)
    restore.add_argument("--data-dir", type=Path, required=True, help="new (absent or empty)")
    restore.add_argument("--name", default="default", help="member name (default: %(default)s)")
    restore.add_argument(
        "--initial-advertise-peer-urls",
        dest="peer_url",
        default="http://localhost:2380",
        help="this member's peer URL (default: %(default)s)",
    )
    restore.add_argument(
        "--initial-cluster",
        default="",
        help="every member, NAME=PEER_URL,... (default: this member alone)",
    )
    restore.add_argument("--initial-cluster-token", default="etcd-cluster")
    restore.add_argument(
        "--bump-revision",
        type=int,
        default=plan.DEFAULT_BUMP,
        help="revisions skipped; raised when below the token floor (default: %(default)s)",
    )
    restore.add_argument(
        "--min-token",
        type=int,
        default=0,
        help="highest token any fence may have accepted (SQL, S3 fences the cluster cannot see)",
    )
    restore.add_argument(
        "--from-cluster",
        action="store_true",
        help="also read the highest token of FencedLeases and FencedArtifacts",
    )
    restore.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="for --from-cluster (default: in-cluster, then $KUBECONFIG or ~/.kube/config)",
    )
    restore.add_argument(
        "--etcdutl",
        default=os.environ.get("FENCEDLEASE_ETCDUTL", "etcdutl"),
        help="etcdutl binary (default: $FENCEDLEASE_ETCDUTL or etcdutl on PATH)",
    )
    return etcd


def run(args: argparse.Namespace) -> int:
    try:
        if args.etcd_command == "backups":
            return rotate(args.dir, args.incoming, args.prefix, args.keep)
        return restore(args)
    except _Fail as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def check_snapshot(path: Path) -> int:
    """Raise unless ``path`` is a whole etcd snapshot; return its size."""
    check = plan.SnapshotCheck()
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                check.update(chunk)
        check.verify()
    except OSError as exc:
        raise _Fail(EXIT_SNAPSHOT, f"cannot read snapshot {path}: {exc.strerror}") from None
    except plan.SnapshotError as exc:
        raise _Fail(EXIT_SNAPSHOT, f"{path}: {exc}") from None
    return check.size


def rotate(directory: Path, incoming: str, prefix: str, keep: int) -> int:
    new = directory / incoming
    if keep < 1:
        raise ValueError("--keep must be at least 1")
    if not new.is_file():
        raise _Fail(EXIT_SNAPSHOT, f"no new snapshot at {new} (did `etcdctl snapshot save` run?)")
    try:
        size = check_snapshot(new)
    except _Fail:
        new.replace(new.with_name(new.name + ".corrupt"))  # kept for a look, never restored
        raise
    name = plan.unique_name(prefix, dt.datetime.now(dt.UTC), os.listdir(directory))
    os.replace(new, directory / name)
    _fsync_dir(directory)
    print(f"saved {name} ({size} bytes)")
    for old in plan.to_delete(os.listdir(directory), prefix, keep):
        (directory / old).unlink(missing_ok=True)
        print(f"deleted {old} (keeping the newest {keep})")
    _fsync_dir(directory)
    return 0


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _etcdutl(binary: str) -> str:
    found = shutil.which(binary)
    if found is None:
        raise _Fail(EXIT_ETCDUTL, f"etcdutl not found ({binary!r}): pass --etcdutl PATH")
    return found


def snapshot_revision(etcdutl: str, snapshot: Path) -> int:
    result = subprocess.run(
        [etcdutl, "snapshot", "status", str(snapshot), "--write-out=json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise _Fail(EXIT_ETCDUTL, f"etcdutl snapshot status failed: {result.stderr.strip()}")
    try:
        revision = json.loads(result.stdout)["revision"]
    except (ValueError, KeyError, TypeError):
        raise _Fail(EXIT_ETCDUTL, "etcdutl snapshot status printed no revision") from None
    if not isinstance(revision, int):
        raise _Fail(EXIT_ETCDUTL, "etcdutl snapshot status printed no revision")
    return revision


def restore(args: argparse.Namespace) -> int:
    check_snapshot(args.snapshot)
    data_dir: Path = args.data_dir
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise _Fail(
            EXIT_DATA_DIR,
            f"{data_dir} is not empty: restore into a new directory (move the old one aside)",
        )
    if args.min_token < 0:
        raise ValueError("--min-token cannot be negative")
    etcdutl = _etcdutl(args.etcdutl)
    revision = snapshot_revision(etcdutl, args.snapshot)
    floor = args.min_token
    if args.from_cluster:
        floor = max(floor, cluster_floor(args.kubeconfig))
    bump = plan.choose_bump(args.bump_revision, floor, revision)
    member = plan.Member(args.name, args.peer_url, str(data_dir))
    members = _members(args.initial_cluster, member)
    argv = plan.restore_argv(
        etcdutl, str(args.snapshot), member, members, args.initial_cluster_token, bump
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        raise _Fail(EXIT_ETCDUTL, f"etcdutl snapshot restore failed: {result.stderr.strip()}")
    print(
        f"restored {args.snapshot} (revision {revision}) into {data_dir} as member "
        f"{member.name}, revision bumped by {bump}: the next token is above "
        f"{revision + bump} (highest token known before: {floor or 'none given'})"
    )
    return 0


def _members(initial_cluster: str, member: plan.Member) -> list[plan.Member]:
    if not initial_cluster:
        return [member]
    members = []
    for item in initial_cluster.split(","):
        name, sep, url = item.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"--initial-cluster: {item!r} is not NAME=PEER_URL")
        members.append(plan.Member(name, url, ""))
    if (member.name, member.peer_url) not in {(m.name, m.peer_url) for m in members}:
        raise ValueError(
            f"--initial-cluster does not list {member.name}={member.peer_url} (this member)"
        )
    return members


def cluster_floor(kubeconfig: Path | None) -> int:
    """The highest token FencedLeases and FencedArtifacts show (kubeconfig or in-cluster)."""
    try:
        return asyncio.run(_cluster_floor(kubeconfig))
    except Exception as exc:  # one line for any API or config failure
        raise _Fail(EXIT_KUBE, f"cannot read tokens from the Kubernetes API: {exc}") from None


async def _cluster_floor(kubeconfig: Path | None) -> int:
    from kubernetes_asyncio import client, config

    if kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig))
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    async with client.ApiClient() as api:
        custom = client.CustomObjectsApi(api)
        best = 0
        for plural in ("fencedleases", "fencedartifacts"):
            listed = await custom.list_cluster_custom_object("fencedlease.io", "v1alpha1", plural)
            best = max(best, plan.max_token(listed.get("items", [])))
        return best
