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

from fencedlease.etcdbackup import plan, pods

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
    _add_restore_pods_parser(esub)
    return etcd


def _add_restore_pods_parser(esub: Any) -> None:
    p: argparse.ArgumentParser = esub.add_parser(
        "restore-pods",
        help="print the Pods that restore the chart's bundled etcd from a backup (kubectl apply)",
    )
    p.add_argument("--namespace", "-n", required=True, help="the release's namespace")
    p.add_argument("--statefulset", required=True, help="the etcd StatefulSet (<release>-etcd)")
    p.add_argument("--snapshot", required=True, help="file name in the backup volume")
    p.add_argument(
        "--backup-claim", default=None, help="backup PVC (default: <statefulset>-backup)"
    )
    p.add_argument(
        "--backup-volume-json",
        default=None,
        help="the backup Volume source as JSON (etcd.backup.volume), instead of --backup-claim",
    )
    p.add_argument(
        "--members",
        type=int,
        default=None,
        help="restore into a cluster of this size (default: the StatefulSet's)",
    )
    p.add_argument("--member", type=int, default=None, help="only this member's Pod")
    p.add_argument(
        "--create-missing-claims",
        action="store_true",
        help="also create the members' PVCs that are gone (lost with etcd): new, empty volumes",
    )
    p.add_argument("--helper-image", default=None, help="default: the controller's image")
    p.add_argument("--bump-revision", type=int, default=plan.DEFAULT_BUMP)
    p.add_argument("--min-token", type=int, default=0)
    p.add_argument("--from-cluster", action="store_true")
    p.add_argument("--kubeconfig", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    try:
        if args.etcd_command == "backups":
            return rotate(args.dir, args.incoming, args.prefix, args.keep)
        if args.etcd_command == "restore-pods":
            return restore_pods(args)
        return restore(args)
    except _Fail as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except ValueError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
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


def restore_pods(args: argparse.Namespace) -> int:
    if args.min_token < 0:
        raise ValueError("--min-token cannot be negative")
    volume: dict[str, Any] = {
        "persistentVolumeClaim": {
            "claimName": args.backup_claim or f"{args.statefulset}-backup",
            "readOnly": True,
        }
    }
    if args.backup_volume_json:
        volume = json.loads(args.backup_volume_json)
        if not isinstance(volume, dict):
            raise ValueError("--backup-volume-json must be a JSON object (a Volume source)")
    try:
        sts, image, floor, claims = asyncio.run(_read_release(args))
    except _Fail:
        raise
    except Exception as exc:  # one line for any API or config failure
        what = f"StatefulSet {args.namespace}/{args.statefulset}"
        raise _Fail(
            EXIT_KUBE, f"cannot read the release from the Kubernetes API: {kube_error(exc, what)}"
        ) from None
    etcd = pods.read_statefulset(sts, args.helper_image or image)
    bump = plan.choose_bump(args.bump_revision, max(floor, args.min_token))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dt%H%M%S")
    missing, deleting = (
        pods.lost_claims(etcd, claims, args.members, args.member)
        if isinstance(claims, dict)
        else ([], [])
    )
    docs = pods.restore_manifests(
        etcd,
        args.snapshot,
        volume,
        bump,
        stamp,
        members=args.members,
        only=args.member,
        create_claims=missing if args.create_missing_claims else (),
    )
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
    print(
        f"# {len(docs)} objects: restore {args.snapshot} with --bump-revision {bump} "
        f"(highest token known: {max(floor, args.min_token) or 'none given'}); "
        f"label {pods.LABEL}={stamp}",
        file=sys.stderr,
    )
    for line in _claim_notes(missing, deleting, args.create_missing_claims, claims):
        print(f"# {line}", file=sys.stderr)
    if any(d["kind"] == "PersistentVolumeClaim" for d in docs):
        print(
            f"# after the restore, delete the Pods only: kubectl -n {args.namespace} delete pod "
            f"-l {pods.LABEL} (not delete -f: the PVCs in this manifest hold the restored data)",
            file=sys.stderr,
        )
    return 0


def _claim_notes(
    missing: list[str], deleting: list[str], created: bool, claims: dict[str, bool] | str
) -> list[str]:
    """What to do about the members' PVCs that are gone (the restore Pods would wait forever)."""
    if isinstance(claims, str):
        return [f"could not check the members' PVCs ({claims}): each must exist before applying"]
    notes = []
    if missing and created:
        notes.append(f"PVCs lost with etcd, created here (new, empty): {', '.join(missing)}")
    elif missing:
        notes.append(
            f"WARNING: these PVCs do not exist and the restore Pods would wait for them forever: "
            f"{', '.join(missing)}. Run again with --create-missing-claims to create them in "
            "this manifest (shaped like the StatefulSet's volumeClaimTemplate)."
        )
    if deleting:
        notes.append(
            f"WARNING: these PVCs are being deleted: {', '.join(deleting)}. Wait until they are "
            "gone (kubectl get pvc), then run again with --create-missing-claims."
        )
    return notes


async def _read_release(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], str, int, dict[str, bool] | str]:
    """The etcd StatefulSet, the controller's image (the helper image), with --from-cluster
    the highest token the cluster shows, and the namespace's PVCs (name → being deleted; or
    why they could not be listed)."""
    from kubernetes_asyncio import client

    await _load_config(args.kubeconfig)
    async with client.ApiClient() as api:
        apps = client.AppsV1Api(api)
        raw = await apps.read_namespaced_stateful_set(args.statefulset, args.namespace)
        sts: dict[str, Any] = api.sanitize_for_serialization(raw)
        instance = sts["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/instance", "")
        image = args.helper_image or ""
        if not image:
            found = await apps.list_namespaced_deployment(
                args.namespace,
                label_selector=f"app.kubernetes.io/instance={instance},"
                "app.kubernetes.io/component=controller",
            )
            if not found.items:
                raise _Fail(EXIT_KUBE, "no controller Deployment of the release: --helper-image")
            image = found.items[0].spec.template.spec.containers[0].image
        floor = await _tokens(api) if args.from_cluster else 0
        return sts, image, floor, await _claims(api, args.namespace)


async def _claims(api: Any, namespace: str) -> dict[str, bool] | str:
    from kubernetes_asyncio import client

    try:
        listed = await client.CoreV1Api(api).list_namespaced_persistent_volume_claim(namespace)
    except client.ApiException as exc:  # e.g. no RBAC to list PVCs: say so, do not fail
        return f"{exc.status} {exc.reason}"
    return {c.metadata.name: c.metadata.deletion_timestamp is not None for c in listed.items}


def cluster_floor(kubeconfig: Path | None) -> int:
    """The highest token FencedLeases and FencedArtifacts show (kubeconfig or in-cluster)."""
    try:
        return asyncio.run(_cluster_floor(kubeconfig))
    except Exception as exc:  # one line for any API or config failure
        raise _Fail(
            EXIT_KUBE, f"cannot read tokens from the Kubernetes API: {kube_error(exc)}"
        ) from None


def kube_error(exc: BaseException, what: str = "") -> str:
    """One line for a Kubernetes client or configuration failure: an ``ApiException``'s status,
    reason and the ``Status`` message (not its headers and body), ``what`` for a 404, any
    other error's message folded; credentials redacted (the client's redactor)."""
    from fencedlease.client.kubeconfig import redacted_line

    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "body"):
        try:
            message = str(json.loads(exc.body or "{}").get("message") or "")
        except (ValueError, AttributeError):
            message = ""
        if status == 404 and what:
            message = f"{what} not found" + (f" ({message})" if message else "")
        text = f"HTTP {status} {getattr(exc, 'reason', '') or ''}: {message}".strip(" :")
    else:
        text = str(exc) or type(exc).__name__
        if type(exc).__name__ not in text:
            text = f"{type(exc).__name__}: {text}"
    return redacted_line(text, 500)


async def _load_config(kubeconfig: Path | None) -> None:
    from kubernetes_asyncio import config

    if kubeconfig is not None:
        await config.load_kube_config(config_file=str(kubeconfig))
        return
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))


async def _cluster_floor(kubeconfig: Path | None) -> int:
    from kubernetes_asyncio import client

    await _load_config(kubeconfig)
    async with client.ApiClient() as api:
        return await _tokens(api)


async def _tokens(api: Any) -> int:
    from kubernetes_asyncio import client

    custom = client.CustomObjectsApi(api)
    best = 0
    for plural in ("fencedleases", "fencedartifacts"):
        listed = await custom.list_cluster_custom_object("fencedlease.io", "v1alpha1", plural)
        best = max(best, plan.max_token(listed.get("items", [])))
    return best
