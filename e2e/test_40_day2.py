"""Day 2 on a real node: a rolling upgrade under load, then backup and restore of the fencing
state, both as docs/operations.md writes them, judged by the history checker of tests/chaos.

One node cluster for both (one start-up). The previous chart release (its files and its own
operator image from ``git archive`` of the commit tests/integration/test_upgrade.py names) is
installed; holders (real Pods, each played by a ``tests.chaos.holder`` process with its
Pod-bound token) write their leases' FencedArtifacts all along.

1. Upgrade: ``helm upgrade --take-ownership`` to this chart (it upgrades the CRDs), then
   ``kubectl rollout restart`` of the controller and the webhook, while the holders write and
   leases are force-released now and then (old and new replicas coexist). The checker finds no
   violation; writes sent with the current grant and refused stay under a stated bound.
2. Restore: a snapshot by the backup CronJob (``kubectl create job --from=cronjob/...``), more
   grants and writes, etcd lost entirely with its disks (scaled to 0, every member's PVC deleted
   and its volume emptied), the older snapshot restored with ``fencedlease etcd restore-pods
   --from-cluster --create-missing-claims``: every new token is above every token accepted
   before, nothing stale is admitted, no grant stays frozen.

Controls, made in the same runs (the checker can fail on what these scenarios produce): after
each force-release, once the observer has seen the newer grant, the superseded holder writes on
as a zombie (``Writers.write_as_superseded``): its FencedArtifact with the old token, which the
webhook refuses ``stale_fence``, and right after it a ConfigMap no webhook guards, which the
API server takes. The run's grants with those unguarded writes (``Writers.control_history``) is
what an unfenced system would have let through: the checker must report
``superseded_admitted`` there, while the fenced history stays clean. In the upgrade, 0.1.0's
webhooks (no supersede-at-once rule) may admit a zombie: counted as admitted by a
previous-release webhook, and zombies written after the rolling restart must be refused. In the
restore, every grant ended before the loss (some of them granted after the snapshot, unknown
to the restored store) writes again after the restore, and each must be refused
``stale_fence``. The restore's other failure, an unbumped restore issuing old numbers again,
is not something a zombie can produce: its real control is in
tests/integration/test_etcd_backup_restore.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chaos.checker import Report, Violation, check
from tests.chaos.history import Grant, WriteInvoke

from e2e.node import RELEASE, RESULTS, ROOT, SYSTEM_NS, E2EError, NodeEnv, log
from e2e.scenarios import wait_for
from e2e.writers import Writers, outcomes, refused_current, summary
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
# The first upgrade from a chart that installed the CRDs from crds/ (docs/install.md).
TAKE_OVER = "--take-ownership"


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


class Handovers:
    """Force-releases a lease every ``every`` seconds (alternating) until stopped; after each,
    the superseded holder writes on as a zombie once the newer grant is seen (the control)."""

    def __init__(self, w: Writers, every: float) -> None:
        self.w, self.every, self.count = w, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        leases = list(LEASES)
        while not self.stop.wait(self.every):
            try:
                ended = self.w.force_release(leases[self.count % len(leases)])
                self.count += 1
                if ended is not None:
                    self.w.write_as_superseded(ended)
            except E2EError as exc:
                log(f"force-release: {exc}")

    def __enter__(self) -> Handovers:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)  # a zombie waits up to 30 s for the newer grant


def force_release_held(w: Writers, lease: str) -> Grant:
    """Force-release ``lease`` once it shows a grant (between two grants, wait for the next)."""
    return wait_for(
        f"{lease} held, to force-release it", lambda: w.force_release(lease, only_held=True), 30
    )


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


def judged_by_the_new_rule(
    report: Report, old_until: float
) -> tuple[list[Violation], Counter[str]]:
    """The violations, less ``superseded_admitted`` for writes sent while a previous-release
    webhook could still answer (plus a margin for its endpoint to go): 0.1.0 refused only
    tokens below one already written (the article's rule; docs/tokens.md, "Superseded
    generations"), and the stronger rule holds from the moment every webhook is new. A
    ``write_after_stale`` whose admitted write is one of those goes with it (a new webhook
    refused the superseded grant, an old one then admitted it: the same older rule)."""
    older = {
        write.op_id
        for v in report.violations
        if v.kind == "superseded_admitted"
        for write in v.events
        if isinstance(write, WriteInvoke) and write.t <= old_until + OLD_MARGIN
    }
    kept, older_rule = [], Counter[str]()
    for v in report.violations:
        admitted = [e.op_id for e in v.events if isinstance(e, WriteInvoke)][-1:]
        if v.kind in ("superseded_admitted", "write_after_stale") and set(admitted) & older:
            older_rule[v.kind] += 1
        else:
            kept.append(v)
    return kept, older_rule


def test_rolling_upgrade_under_load(env: NodeEnv, writers: Writers) -> None:
    start = time.time()
    writers.start()
    writers.wait_writing("on the previous release", start, 180)
    t_up = time.monotonic()
    with Handovers(writers, 12.0):
        doc = (ROOT / "docs" / "install.md").read_text()
        assert f"-n fencedlease {TAKE_OVER}" in doc
        # The chart takes over and upgrades the CRDs the previous chart created: no kubectl step.
        env.helm(
            "upgrade",
            RELEASE,
            str(ROOT / "charts" / "fencedlease"),
            "-n",
            SYSTEM_NS,
            "--reset-then-reuse-values",
            TAKE_OVER,
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
    # Zombies once every webhook is of this release: the fence's own refusal, for sure.
    for lease in LEASES:
        writers.write_as_superseded(force_release_held(writers, lease))
    upgrade_seconds = time.monotonic() - t_up
    history = writers.stop()
    report = check(history)
    refused, should = refused_current(history)
    both = coexisted(writers.pods_seen, env.images["previous"], env.images["operator"])
    old_until = old_webhook_until(writers.pods_seen, env.images["previous"])
    violations, older_rule = judged_by_the_new_rule(report, old_until)
    control = zombie_control(writers, old_until + OLD_MARGIN)
    figures = {
        **summary(report),
        "violations_under_the_new_rule": len(violations),
        "superseded_admitted_by_previous_webhooks": older_rule["superseded_admitted"],
        "write_after_stale_by_previous_webhooks": older_rule["write_after_stale"],
        "previous_webhooks_gone_after_seconds": round(old_until - start, 1),
        "upgrade_and_restart_seconds": round(upgrade_seconds, 1),
        "force_releases": len(writers.superseded),
        "grants": len({(g.lease, g.token) for g in history.of(Grant)}),
        "refused_that_should_pass": refused,
        "writes_that_should_pass": should,
        "old_and_new_ready_at_once": both,
    }
    RESULTS["day2_upgrade"] = figures
    RESULTS["day2_upgrade_control"] = control
    log(f"upgrade under load: {figures}; control: {control}")
    assert not violations, [v.detail for v in violations[:10]]
    assert both, f"old and new replicas never ran at once: {writers.pods_seen}"
    assert should > 50, figures
    assert refused <= REFUSED_BOUND * should, figures
    # The control: the same zombie writes, unguarded, are what an unfenced system admits.
    assert control["control_violations"].get("superseded_admitted", 0) >= 1, control
    # Past the previous release's webhooks, this release's fence refused zombies itself (an
    # admitted one would be a violation above as well).
    assert control["late_refused_stale_fence"] >= 1, control
    assert "ok" not in control["late_zombie_outcomes"], control


def zombie_control(writers: Writers, since: float) -> dict[str, Any]:
    """The zombies' figures (after :meth:`Writers.stop`): their fenced writes by outcome (all
    of them, and those sent after ``since``), their unguarded twins, and what the checker
    reports on the control history (the run's grants and the unguarded writes)."""
    fenced = writers.zombie_writes
    unguarded = outcomes(writers.control)
    violations = check(writers.control_history()).violations
    kinds = Counter(v.kind for v in violations)
    late_kinds = Counter(
        v.kind
        for v in violations
        if any(isinstance(e, WriteInvoke) and e.t > since for e in v.events)
    )
    late = Counter(code for w, code in fenced if w.t > since)
    return {
        "grants_ended": len(writers.superseded),
        "zombie_writes": len(fenced),
        "zombie_outcomes": dict(Counter(code for _, code in fenced)),
        "zombies_admitted_before": sum(code == "ok" for w, code in fenced if w.t <= since),
        "late_zombie_writes": sum(late.values()),
        "late_zombie_outcomes": dict(late),
        "late_refused_stale_fence": late["stale_fence"],
        "control_writes": len(unguarded),
        "control_admitted": sum(code == "ok" for _, code in unguarded),
        "control_violations": dict(kinds),
        "late_control_violations": dict(late_kinds),
    }


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
        ended = writers.force_release(lease)
        if ended is not None:
            writers.write_as_superseded(ended)
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
    # And the grants made after the snapshot end too (zombies of what the snapshot lacks).
    for lease in LEASES:
        ended = force_release_held(writers, lease)
        assert ended.token > revision, (ended, revision)
        writers.write_as_superseded(ended)
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
    # Zombies after the restore: every grant ended before the loss (some granted after the
    # snapshot, so the restored store never saw them) writes again, once every lease has a
    # grant from the restored store.
    writers.wait_granted("after the restore", down, 60)
    ended_before = list(writers.superseded)
    for ended in ended_before:
        writers.write_as_superseded(ended, timeout=5)
    granted = writers.granted_since(down)
    history = writers.stop()
    control = zombie_control(writers, down)

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
        "grants_ended_before_the_loss": len(ended_before),
        "of_them_after_the_snapshot": sum(g.token > revision for g in ended_before),
    }
    RESULTS["day2_restore"] = figures
    RESULTS["day2_restore_control"] = control
    log(f"restore: {figures}; control: {control}")
    assert report.safe, [v.detail for v in report.violations[:10]]
    assert new_tokens and not stale, figures
    assert granted == set(LEASES), f"not granted after the restore: {set(LEASES) - granted}"
    assert revision < before, "the snapshot must be older than the accepted tokens"
    assert figures["of_them_after_the_snapshot"] >= len(LEASES), figures
    # The control: unguarded, the zombies' writes are admitted, before and after the restore.
    assert control["control_violations"].get("superseded_admitted", 0) >= 1, control
    assert control["late_control_violations"].get("superseded_admitted", 0) >= 1, control
    # Fenced, each one written after the restore was refused stale_fence.
    assert control["late_zombie_outcomes"] == {"stale_fence": len(ended_before)}, control


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
