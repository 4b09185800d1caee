"""Day 2 on a real node: a rolling upgrade under load, then backup and restore of the fencing
state, both as docs/operations.md writes them, judged by the history checker of tests/chaos.

One node cluster for both (one start-up). The previous chart release (its files and its own
operator image from ``git archive`` of the commit tests/integration/test_upgrade.py names) is
installed; holders (real Pods, each played by a ``tests.chaos.holder`` process with its
Pod-bound token) write their leases' FencedArtifacts all along.

1. Upgrade: the documented CRD step, ``helm upgrade`` to this chart, then ``kubectl rollout
   restart`` of the controller and the webhook, while the holders write and leases are
   force-released now and then (old and new replicas coexist). The checker finds no violation;
   writes sent with the current grant and refused stay under a stated bound.
2. Restore: a snapshot by the backup CronJob (``kubectl create job --from=cronjob/...``), more
   grants and writes, etcd lost entirely with its disks (scaled to 0, every member's PVC deleted
   and its volume emptied), the older snapshot restored with ``fencedlease etcd restore-pods
   --from-cluster --create-missing-claims``: every new token is above every token accepted
   before, nothing stale is admitted, no grant stays frozen.

Controls (the checker can fail): each history with one injected event a broken system would
produce (the unbumped restore's next token, a superseded token admitted) is reported.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chaos.checker import Report, Violation, check
from tests.chaos.history import Grant, History, WriteInvoke, WriteOk

from e2e.node import RELEASE, RESULTS, ROOT, SYSTEM_NS, E2EError, NodeEnv, log
from e2e.scenarios import wait_for
from e2e.writers import Writers, refused_current, summary
from fencedlease.local import images
from fencedlease.local.binaries import binary_path

pytestmark = pytest.mark.timeout(1800)

# The previous chart release, as tests/integration/test_upgrade.py names it.
PREVIOUS_COMMIT = "41d97457dfd7c2d94f810883196240f731092969"
PREVIOUS_VERSION = "0.1.0"
NS = "day2"
LEASES: dict[str, Any] = {"day2-a": "AllowEqual", "day2-b": "StrictlyGreater"}
ETCD = f"{RELEASE}-etcd"
# The bound on writes sent with the current grant and refused (any code, or no answer) across
# the upgrade and the rolling restart, as a share of such writes.
REFUSED_BOUND = 0.05
# Seconds after the last previous-release webhook Pod was seen until its endpoint is surely
# gone from the Service (the API server may still call it meanwhile).
OLD_MARGIN = 5.0
CRD_STEP = (
    "helm show crds charts/fencedlease | "
    "kubectl apply --server-side --force-conflicts --field-manager=fencedlease-crds -f -"
)


def previous_chart(dest: Path) -> Path:
    tree = images.git_tree(ROOT, PREVIOUS_COMMIT, dest)
    chart = tree / "charts" / "fencedlease"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == PREVIOUS_VERSION
    return chart


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    env = NodeEnv(state_root / "day2")
    started = time.monotonic()
    try:
        with env.running():
            t0 = time.monotonic()
            old, old_tar = images.operator_archive_at(ROOT, PREVIOUS_COMMIT, log)
            RESULTS["day2_previous_image_seconds"] = round(time.monotonic() - t0, 1)
            images.import_image(env.containerd, old, old_tar)
            env.images["previous"] = old
            yield env
    finally:
        RESULTS["day2_module_seconds"] = round(time.monotonic() - started, 1)


@pytest.fixture(scope="module")
def writers(env: NodeEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Writers]:
    """The previous release installed, the holders set up (not yet writing)."""
    old_chart = previous_chart(tmp_path_factory.mktemp("previous"))
    repo, tag = env.images["previous"].rsplit(":", 1)
    values = [v for v in env.chart_values() if "etcd.backup." not in v]  # not in 0.1.0
    env.helm_install(
        f"--set=image.repository={repo}", f"--set=image.tag={tag}", chart=old_chart, values=values
    )
    w = Writers(env, NS, env.state_dir / "writers", LEASES)
    w.setup()
    try:
        yield w
    except BaseException:
        print(w.logs())
        raise
    finally:
        w.stop()


def crds_as_documented(env: NodeEnv) -> None:
    doc = (ROOT / "docs" / "install.md").read_text() + (ROOT / "docs" / "operations.md").read_text()
    assert CRD_STEP in doc
    shown = env.helm("show", "crds", str(ROOT / "charts" / "fencedlease")).stdout
    env.kubectl(*CRD_STEP.split(" | ", 1)[1].split()[1:], input=shown)
    env.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/fencedleases.fencedlease.io",
        "crd/fencedartifacts.fencedlease.io",
    )


class Handovers:
    """Force-releases a lease every ``every`` seconds (alternating) until stopped."""

    def __init__(self, w: Writers, every: float) -> None:
        self.w, self.every, self.count = w, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        leases = list(LEASES)
        while not self.stop.wait(self.every):
            try:
                self.w.force_release(leases[self.count % len(leases)])
                self.count += 1
            except E2EError as exc:
                log(f"force-release: {exc}")

    def __enter__(self) -> Handovers:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def coexisted(pods_seen: list[tuple[float, dict[str, str]]], old: str, new: str) -> bool:
    """Whether Ready Pods of both images were seen at once."""
    return any(old in s.values() and new in s.values() for _, s in pods_seen)


def old_webhook_until(pods_seen: list[tuple[float, dict[str, str]]], old: str) -> float:
    """When the last webhook Pod of the previous release was seen gone (0: never seen)."""
    until = 0.0
    for (_, pods), (t_next, _) in zip(pods_seen, [*pods_seen[1:], (time.time(), {})], strict=True):
        if any("-webhook-" in name and image == old for name, image in pods.items()):
            until = t_next
    return until


def judged_by_the_new_rule(report: Report, old_until: float) -> tuple[list[Violation], int]:
    """The violations, less ``superseded_admitted`` for writes sent while a previous-release
    webhook could still answer (plus a margin for its endpoint to go): 0.1.0 refused only
    tokens below one already written (the article's rule; docs/tokens.md, "Superseded
    generations"), and the stronger rule holds from the moment every webhook is new."""
    kept, older_rule = [], 0
    for v in report.violations:
        write = next((e for e in v.events if isinstance(e, WriteInvoke)), None)
        if v.kind == "superseded_admitted" and write and write.t <= old_until + OLD_MARGIN:
            older_rule += 1
        else:
            kept.append(v)
    return kept, older_rule


def test_rolling_upgrade_under_load(env: NodeEnv, writers: Writers) -> None:
    start = time.time()
    writers.start()
    writers.wait_writing("on the previous release", start, 180)
    t_up = time.monotonic()
    with Handovers(writers, 12.0) as handovers:
        crds_as_documented(env)
        env.helm(
            "upgrade",
            RELEASE,
            str(ROOT / "charts" / "fencedlease"),
            "-n",
            SYSTEM_NS,
            "--reset-then-reuse-values",
            *env.chart_values(),
            "--wait",
            "--timeout=8m",
        )
        upgraded = time.time()
        writers.wait_writing("after helm upgrade", upgraded, 120)
        env.kubectl(
            "rollout",
            "restart",
            "-n",
            SYSTEM_NS,
            f"deployment/{RELEASE}-controller",
            f"deployment/{RELEASE}-webhook",
        )
        for deploy in ("controller", "webhook"):
            env.kubectl(
                "rollout",
                "status",
                "-n",
                SYSTEM_NS,
                f"deployment/{RELEASE}-{deploy}",
                "--timeout=300s",
                timeout=320,
            )
        restarted = time.time()
        writers.wait_writing("after the rolling restart", restarted, 120)
    upgrade_seconds = time.monotonic() - t_up
    history = writers.stop()
    report = check(history)
    refused, should = refused_current(history)
    both = coexisted(writers.pods_seen, env.images["previous"], env.images["operator"])
    old_until = old_webhook_until(writers.pods_seen, env.images["previous"])
    violations, older_rule = judged_by_the_new_rule(report, old_until)
    figures = {
        **summary(report),
        "violations_under_the_new_rule": len(violations),
        "superseded_admitted_by_previous_webhooks": older_rule,
        "previous_webhooks_gone_after_seconds": round(old_until - start, 1),
        "upgrade_and_restart_seconds": round(upgrade_seconds, 1),
        "force_releases": handovers.count,
        "grants": len({(g.lease, g.token) for g in history.of(Grant)}),
        "refused_that_should_pass": refused,
        "writes_that_should_pass": should,
        "old_and_new_ready_at_once": both,
    }
    RESULTS["day2_upgrade"] = figures
    log(f"upgrade under load: {figures}")
    assert not violations, [v.detail for v in violations[:10]]
    assert both, f"old and new replicas never ran at once: {writers.pods_seen}"
    assert should > 50, figures
    assert refused <= REFUSED_BOUND * should, figures

    # The control: the same history with a superseded grant's write admitted after the newer
    # grant was seen (what a fence that ignored the upgrade's handovers would let through).
    RESULTS["day2_upgrade_control"] = control_superseded(history)


def control_superseded(history: History) -> dict[str, Any]:
    grants = sorted(history.of(Grant), key=lambda g: g.t)
    older = next(g for g in grants if any(h.lease == g.lease and h.token > g.token for h in grants))
    newer = next(h for h in grants if h.lease == older.lease and h.token > older.token)
    t = max(e.t for e in history.events) + 1
    injected = replace(history, events=list(history.events))
    injected.add(
        WriteInvoke(
            t,
            "control-1",
            older.lease,
            older.holder,
            older.token,
            older.lease_id,
            f"{older.lease}-out",
        )
    )
    injected.add(WriteOk(t + 0.1, "control-1"))
    report = check(injected)
    kinds = {v.kind for v in report.violations}
    assert "superseded_admitted" in kinds, (kinds, older, newer)
    return summary(report)


# ---------------------------------------------------------------------------- restore


def backup_now(env: NodeEnv, job: str) -> str:
    """The documented on-demand backup; the snapshot's file name from its ``retain`` log."""
    env.kubectl("-n", SYSTEM_NS, "create", "job", f"--from=cronjob/{ETCD}-backup", job)
    env.kubectl(
        "-n",
        SYSTEM_NS,
        "wait",
        "--for=condition=Complete",
        f"job/{job}",
        "--timeout=180s",
        timeout=200,
    )
    logs = env.kubectl("-n", SYSTEM_NS, "logs", f"job/{job}", "-c", "retain").stdout
    found = re.search(rf"saved ({ETCD}-\S+\.db)", logs)
    if not found:
        raise E2EError(f"no snapshot named in the backup's log: {logs}")
    return found.group(1)


def bound_pvs(env: NodeEnv) -> dict[str, dict[str, Any]]:
    """PVC name → the PersistentVolume it is bound to."""
    pvs = json.loads(env.kubectl("get", "pv", "-o", "json").stdout)["items"]
    return {
        pv["spec"]["claimRef"]["name"]: pv
        for pv in pvs
        if (pv["spec"].get("claimRef") or {}).get("namespace") == SYSTEM_NS
    }


def bound_volumes(env: NodeEnv) -> dict[str, Path]:
    """PVC name → the hostPath directory of the PersistentVolume it is bound to."""
    return {c: Path(pv["spec"]["hostPath"]["path"]) for c, pv in bound_pvs(env).items()}


def snapshot_revision(path: Path) -> int:
    out = subprocess.run(
        [str(binary_path("etcdutl")), "snapshot", "status", str(path), "--write-out=json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return int(json.loads(out.stdout)["revision"])


def lose_etcd(env: NodeEnv) -> list[str]:
    """Documented step 2 (stop etcd), then etcd lost entirely with its disks: every member's
    PVC deleted, its volume emptied and made ``Available`` again (on a cluster with a
    provisioner, the new PVC would get a new empty volume). The PVCs deleted."""
    env.kubectl("-n", SYSTEM_NS, "scale", "statefulset", ETCD, "--replicas=0")
    env.kubectl(
        "-n",
        SYSTEM_NS,
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/component=etcd",
        "--timeout=5m",
        timeout=320,
    )
    members = {c: pv for c, pv in bound_pvs(env).items() if c.startswith(f"data-{ETCD}-")}
    env.kubectl("-n", SYSTEM_NS, "delete", "pvc", *members, "--wait", "--timeout=120s", timeout=140)
    for pv in members.values():
        path = Path(pv["spec"]["hostPath"]["path"])
        for item in path.iterdir():
            if item.is_dir():
                shutil.rmtree(item)
            else:
                item.unlink()
        remove = '[{"op": "remove", "path": "/spec/claimRef"}]'
        env.kubectl("patch", "pv", pv["metadata"]["name"], "--type=json", "-p", remove)
    return sorted(members)


def restore_as_documented(env: NodeEnv, snapshot: str, lost: list[str]) -> str:
    """Documented steps 3 and 4, with the members' PVCs ``lost`` created by the manifest; the
    restore command's own lines (the bump it chose, the PVCs it creates)."""
    made = env.fencedlease(
        "etcd",
        "restore-pods",
        "-n",
        SYSTEM_NS,
        "--statefulset",
        ETCD,
        "--snapshot",
        snapshot,
        "--from-cluster",
        "--create-missing-claims",
        "--kubeconfig",
        str(env.kubeconfig),
        timeout=120,
    )
    if made.returncode != 0:
        raise E2EError(f"restore-pods failed ({made.returncode}): {made.stderr}")
    assert f"created here (new, empty): {', '.join(lost)}" in made.stderr, made.stderr
    manifest = env.state_dir / "restore.json"
    manifest.write_text(made.stdout)
    env.kubectl("apply", "-f", str(manifest))
    env.kubectl(
        "-n",
        SYSTEM_NS,
        "wait",
        "--for=jsonpath={.status.phase}=Succeeded",
        "pod",
        "-l",
        "fencedlease.io/etcd-restore",
        "--timeout=10m",
        timeout=620,
    )
    # The restore Pods only (by label): the manifest also holds the PVCs it created.
    env.kubectl("-n", SYSTEM_NS, "delete", "pod", "-l", "fencedlease.io/etcd-restore")
    env.kubectl("-n", SYSTEM_NS, "scale", "statefulset", ETCD, "--replicas=3")
    env.kubectl(
        "-n", SYSTEM_NS, "rollout", "status", f"statefulset/{ETCD}", "--timeout=300s", timeout=320
    )
    return made.stderr.strip()


def test_restore_of_an_older_snapshot_keeps_tokens_above_accepted_ones(
    env: NodeEnv, writers: Writers
) -> None:
    start, t_start = time.time(), time.monotonic()
    writers.start()
    # New grants: under StrictlyGreater the holders' last grant already wrote its one write.
    for lease in LEASES:
        writers.force_release(lease)
    writers.wait_writing("before the backup", start, 120)
    snapshot = backup_now(env, "backup-now")
    backup_dir = bound_volumes(env)[f"{ETCD}-backup"]
    revision = snapshot_revision(backup_dir / snapshot)
    log(f"snapshot {snapshot} at revision {revision}")

    # Work goes on after the snapshot: grants and writes it does not hold.
    after = time.time()
    with Handovers(writers, 4.0):
        writers.wait_writing("after the snapshot", after, 60)
        wait_for("two handovers after the snapshot", lambda: _handed(writers, revision), 60)
    accepted = writers.tokens()
    log(f"tokens shown before the loss: {accepted}")

    lost = time.monotonic()
    claims = lose_etcd(env)
    # etcd is gone: from here on no write is admitted and no grant made until it is restored
    # (a grant may come, and a StrictlyGreater lease write its one write, before every member
    # is Ready and the restore's last step returns).
    down = time.time()
    command_line = restore_as_documented(env, snapshot, claims)
    log(command_line)
    try:
        writers.wait_writing("after the restore", down, 180)
    except E2EError:
        print(restore_diagnostics(env))
        frozen = sorted(set(LEASES) - writers.granted_since(down))
        RESULTS["day2_restore_not_granted"] = frozen
        if frozen:  # Does a controller restart free them? (a grant, not a write)
            env.kubectl("rollout", "restart", "-n", SYSTEM_NS, f"deployment/{RELEASE}-controller")
            try:
                writers.wait_granted("after a controller restart", down, 120)
                RESULTS["day2_restore_frozen_until_controller_restart"] = True
            except E2EError:
                RESULTS["day2_restore_frozen_until_controller_restart"] = False
        raise
    down_seconds = time.monotonic() - lost
    granted = writers.granted_since(down)
    history = writers.stop()

    report = check(history)
    before = max(accepted.values())
    new_tokens = sorted({g.token for g in history.of(Grant) if g.t > down})
    stale = [g for g in history.of(Grant) if g.t > down and g.token <= before]
    figures = {
        **summary(report),
        "snapshot_revision": revision,
        "highest_token_before_loss": before,
        "lowest_token_after_restore": new_tokens[0] if new_tokens else None,
        "loss_to_writes_again_seconds": round(down_seconds, 1),
        "test_seconds": round(time.monotonic() - t_start, 1),
        "restore_command": command_line,
    }
    RESULTS["day2_restore"] = figures
    log(f"restore: {figures}")
    assert report.safe, [v.detail for v in report.violations[:10]]
    assert new_tokens and not stale, figures
    assert granted == set(LEASES), f"not granted after the restore: {set(LEASES) - granted}"
    assert revision < before, "the snapshot must be older than the accepted tokens"

    # The control: the unbumped restore's next token (the snapshot's revision + 1, below
    # tokens already accepted) granted after the restore is reported.
    lease = next(iter(LEASES))
    t = max(e.t for e in history.events) + 1
    injected = replace(history, events=list(history.events))
    injected.add(Grant(t, lease, "holder-0", revision + 1, "control-unbumped"))
    kinds = {v.kind for v in check(injected).violations}
    assert "token_not_increasing" in kinds, kinds
    RESULTS["day2_restore_control"] = {"kinds": sorted(kinds)}


def restore_diagnostics(env: NodeEnv) -> str:
    """The leases' statuses and the controllers' logs: why a grant did not resume."""
    parts = [env.kubectl("get", "fl", "-n", NS, "-o", "yaml", check=False).stdout]
    pods = env.kubectl(
        "get",
        "pods",
        "-n",
        SYSTEM_NS,
        "-o",
        "name",
        "-l",
        "app.kubernetes.io/component=controller",
        check=False,
    ).stdout.split()
    for pod in pods:
        got = env.kubectl("logs", "-n", SYSTEM_NS, pod, "--tail=300", check=False)
        parts.append(f"--- {pod} ---\n{got.stdout}")
    text = "\n".join(parts)
    (env.state_dir.parent / "day2-restore-diagnostics.txt").write_text(text)
    return text


def _handed(writers: Writers, revision: int) -> bool | None:
    tokens = writers.tokens()
    return (len(tokens) == len(LEASES) and all(t > revision for t in tokens.values())) or None
