"""The chart's backup CronJob, its two commands as rendered, against a real etcd with client
certificates (no node: the Job's Pod is replayed here, its mount paths mapped to files).

`etcdctl snapshot save` (the init container) then `fencedlease etcd backups rotate` (the main
container), three runs with `etcd.backup.keep=2`: two dated snapshots are left, each a whole
snapshot that `etcdutl snapshot status` reads at the revision etcd had.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fencedlease.cli import main
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import ManagedProcess

from .chart import one, render
from .store_checks import tls_etcd

pytestmark = pytest.mark.timeout(300)


def _tls_etcd(tmp_path: Path) -> tuple[ManagedProcess, str, Path]:
    """An etcd requiring client certificates, and a directory laid out like the chart's
    client Secret mount (ca.crt, tls.crt, tls.key)."""
    process, endpoint, ca, client = tls_etcd(tmp_path, "fencedlease-operator")
    secret = tmp_path / "etcd-client-tls"
    secret.mkdir()
    for src, dst in ((ca.cert, "ca.crt"), (client.cert, "tls.crt"), (client.key, "tls.key")):
        shutil.copy(src, secret / dst)
    return process, endpoint, secret


def _mapped(
    args: list[str], mounts: dict[str, str], paths: dict[str, Path], endpoint: str
) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith("--endpoints="):
            arg = f"--endpoints={endpoint}"
        for name, mount in mounts.items():
            if name not in paths:
                continue  # /tmp: neither command names it
            arg = arg.replace(f"{mount}/", f"{paths[name]}/").replace(
                f"={mount}", f"={paths[name]}"
            )
        out.append(arg)
    return out


def _etcdctl(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary_path("etcdctl")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_backup_cronjob_commands_snapshot_a_tls_etcd_and_keep_the_newest(
    tmp_path: Path,
) -> None:
    docs = render("fencedlease", "fl-system", "--set", "etcd.backup.keep=2")
    pod: dict[str, Any] = one(docs, "CronJob", "-etcd-backup")["spec"]["jobTemplate"]["spec"][
        "template"
    ]["spec"]
    (snapshot,) = pod["initContainers"]
    (retain,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in snapshot["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in retain["volumeMounts"]}["backup"] == mounts["backup"]
    process, endpoint, secret = _tls_etcd(tmp_path)
    backups = tmp_path / "backups"
    backups.mkdir()
    paths = {"backup": backups, "etcd-client-tls": secret}
    save = _mapped(snapshot["args"], mounts, paths, endpoint)
    rotate = _mapped(retain["args"], mounts, paths, endpoint)
    tls = [a for a in save if a.startswith(("--endpoints", "--cacert", "--cert", "--key"))]
    try:
        deadline = time.monotonic() + 30
        while _etcdctl([*tls, "endpoint", "health"]).returncode != 0:  # readiness, bounded
            assert process.alive() and time.monotonic() < deadline, process.log_tail()
            time.sleep(0.2)
        # Without the client certificate etcd refuses: the CronJob's certificate does the work.
        no_cert = [a for a in tls if not a.startswith(("--cert=", "--key="))]
        assert _etcdctl([*no_cert, "--command-timeout=3s", "put", "k", "v"]).returncode != 0
        revisions = []
        for run in range(3):
            for i in range(5):
                assert _etcdctl([*tls, "put", f"k{run}-{i}", "v"]).returncode == 0
            saved = _etcdctl(save)
            assert saved.returncode == 0, saved.stderr
            assert main(rotate) == 0
            status = json.loads(_etcdctl([*tls, "endpoint", "status", "-w", "json"]).stdout)
            revisions.append(status[0]["Status"]["header"]["revision"])
            time.sleep(1.1)  # dated names have a second's resolution (-N suffixes are unit-tested)
    finally:
        process.stop()
    kept = sorted(backups.iterdir())
    assert [p.name.startswith("fencedlease-etcd-") and p.suffix == ".db" for p in kept] == [
        True,
        True,
    ]
    for path, revision in zip(kept, revisions[1:], strict=True):
        result = subprocess.run(
            [str(binary_path("etcdutl")), "snapshot", "status", str(path), "-w", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["revision"] == revision
