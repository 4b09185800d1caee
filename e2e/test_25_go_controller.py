"""The Go example controller on a real node (examples/go-controller, docs/go.md).

A node cluster of its own, the chart installed from locally built images with Beacons and
ConfigMaps among the kinds its controller records, then the example's two replicas on the
image :mod:`fencedlease.local.go_example` builds from this checkout (no registry) and names as
the manifests do. Each round,
the leader decides a spec patch, a status patch, a child create and the delete of its previous
child, and sends them after ``WRITE_HOLD`` (the example's stand-in for a request held in the
network). The leader is frozen with ``ctr tasks pause`` during a held round that deletes a
child (its log, read while it is frozen, proves it); the other replica is granted the lease
and writes the Beacon; the old leader thaws: each of its queued writes is refused by the fence
with a typed error (``IsStaleFence``/``IsHolderMismatch`` in its log), the Beacon keeps the new
leader's content, the child it meant to delete stays, and it stops leading (exit 3). The
control (an unlabelled Beacon: nothing fenced) shows the overwrite and the delete landing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.history import History, after
from e2e.node import RESULTS, ROOT, E2EError, NodeEnv, log
from e2e.scenarios import wait_for
from e2e.test_30_examples import container_id, holder, pods
from fencedlease.local.go_example import load_go_controller

pytestmark = pytest.mark.timeout(1500)

NS = "go-controller-e2e"
EXAMPLE = ROOT / "examples" / "go-controller"
LEASE = "go-controller"
SELECTOR = "app.kubernetes.io/name=go-controller"
HOLD = "3s"
RESOURCES = json.dumps(
    [
        {"apiGroup": "example.com", "resources": ["beacons"]},
        {"apiGroup": "", "resources": ["configmaps"]},
    ]
)


def manifests() -> list[dict[str, Any]]:
    """examples/go-controller/manifests.yaml as written (its image is the name
    :func:`load_go_controller` tags), never pulled, with the hold the test needs."""
    docs = [d for d in yaml.safe_load_all((EXAMPLE / "manifests.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["imagePullPolicy"] = "Never"
            container["env"] = [e for e in container["env"] if e["name"] != "ROUND_INTERVAL"] + [
                {"name": "WRITE_HOLD", "value": HOLD},
                {"name": "ROUND_INTERVAL", "value": "0s"},
            ]
    return docs


def explain(env: NodeEnv) -> str:
    """The example's Pods, lease, Beacons, children and both replicas' logs."""
    parts = []
    for args in (
        ("get", "pods,fencedleases,beacons,configmaps", "-n", NS, "-o", "wide"),
        ("get", "events", "-n", NS, "--sort-by=.lastTimestamp"),
        ("logs", "-n", NS, "-l", SELECTOR, "--tail=40", "--prefix"),
        ("logs", "-n", NS, "-l", SELECTOR, "--tail=40", "--prefix", "--previous"),
    ):
        got = env.kubectl(*args, check=False, timeout=30)
        parts.append(f"--- kubectl {' '.join(args)} ---\n{got.stdout[-6000:]}{got.stderr}")
    return "\n".join(parts)


@contextmanager
def explained(env: NodeEnv) -> Iterator[None]:
    """On a failure: the example's state and logs, then the node's and the operator's."""
    try:
        yield
    except BaseException:
        print(explain(env))
        print(env.diagnostics())
        raise


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    env = NodeEnv(state_root / "go-controller")
    with env.running():
        load_go_controller(env.containerd, ROOT, log)
        docs = manifests()
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        with explained(env):
            # The CRD first: the chart's controller watches the kinds fencedObjects lists.
            env.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
            env.kubectl(
                "wait", "--for=condition=Established", "crd/beacons.example.com", "--timeout=60s"
            )
            env.helm_install(f"--set-json=fencedObjects.resources={RESOURCES}")
            env.kubectl("create", "namespace", NS)
            rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
            env.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(rest))
            env.kubectl("rollout", "status", "-n", NS, "deployment/go-controller", "--timeout=300s")
        yield env


# ---------------------------------------------------------------------- the replicas' logs


def records(env: NodeEnv, pod: str, beacon: str) -> list[dict[str, Any]]:
    """The JSON log records of ``pod`` about ``beacon`` (previous container's first), and its
    lines that say leadership ended."""
    out = []
    for previous in (True, False):
        args = ["logs", "-n", NS, pod, *(["--previous"] if previous else [])]
        for line in env.kubectl(*args, check=False).stdout.splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("beacon") == f"{NS}/{beacon}" or "leadership lost" in record["msg"]:
                out.append(record)
    return out


def rounds(env: NodeEnv, pod: str, beacon: str) -> list[dict[str, Any]]:
    return [r for r in records(env, pod, beacon) if "round" in r]


def freeze_in_a_held_round(
    env: NodeEnv, pod: str, beacon: str, attempts: int = 5
) -> dict[str, Any]:
    """Pause ``pod``'s container while its round of ``beacon`` that deletes a child is held
    (queued, nothing of it answered yet): its log, read while frozen, must end with that
    round's ``queued round`` record; if the pause missed it, resume and take the next round."""
    cid = container_id(env, NS, pod)
    seen = len(rounds(env, pod, beacon))
    for attempt in range(attempts):

        def queued(seen: int = seen) -> dict[str, Any] | None:
            got = rounds(env, pod, beacon)
            fresh = [
                r for r in got[seen:] if r["msg"] == "queued round" and "delete " in r["writes"]
            ]
            return fresh[-1] if fresh else None

        wanted = wait_for(
            f"{pod} queueing a round of {beacon} with a delete", queued, 120, every=0.2
        )
        env.containerd.ctr("tasks", "pause", cid)
        last = rounds(env, pod, beacon)[-1]
        if last["msg"] == "queued round" and last["round"] == wanted["round"]:
            log(f"froze {pod} holding round {last['round']}: {last['writes']}")
            return last
        env.containerd.ctr("tasks", "resume", cid)
        seen = len(rounds(env, pod, beacon))
        log(f"the pause missed round {wanted['round']}'s hold (attempt {attempt + 1}); again")
    raise E2EError(f"could not freeze {pod} during a held round in {attempts} attempts")


# ---------------------------------------------------------------------- the Beacon's history


def _leaders(beacon: dict[str, Any]) -> dict[str, Any]:
    """A Beacon's leader as its spec and its status say."""
    return {
        "spec": (beacon.get("spec") or {}).get("leader"),
        "status": (beacon.get("status") or {}).get("leader"),
    }


def child_exists(env: NodeEnv, name: str) -> bool:
    return env.get("configmap", name, namespace=NS) is not None


def restarts(env: NodeEnv, pod: str) -> int:
    statuses = ((env.get("pod", pod, namespace=NS) or {}).get("status") or {}).get(
        "containerStatuses"
    ) or [{}]
    return int(statuses[0].get("restartCount") or 0)


def scenario(env: NodeEnv, fenced: bool, tmp: Path) -> dict[str, Any]:
    beacon = "fenced" if fenced else "control"
    labels = {} if fenced else {"example.com/fenced": "false"}  # the controller labels it
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Beacon",
        "metadata": {"name": beacon, "labels": labels},
        "spec": {},
    }
    env.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))
    watch = History(env, NS, "beacons.example.com", beacon, tmp / f"{beacon}.watch.json", _leaders)
    try:
        first, t1, _ = wait_for("a holder", lambda: holder(env, NS, LEASE), 180)
        restarts_before = restarts(env, first)
        held = freeze_in_a_held_round(env, first, beacon)
        queued = [w.strip() for w in held["writes"].split(",")]
        doomed = [w.removeprefix("delete ") for w in queued if w.startswith("delete ")]
        cid = container_id(env, NS, first)
        try:
            second, t2, _ = wait_for(
                "the other replica granted the lease", lambda: holder(env, NS, LEASE, first), 180
            )
            assert t2 > t1, (t1, t2)
            wait_for(
                f"{second} writing {beacon}",
                lambda: any(v["spec"] == second for v in watch.versions()) or None,
                120,
            )
        finally:
            env.containerd.ctr("tasks", "resume", cid, check=False)
        log(
            f"thawed {first}; its round {held['round']} ({held['writes']}) goes out with token {t1}"
        )

        def answered() -> dict[str, dict[str, Any]] | None:
            got = {
                r["write"]: r
                for r in records(env, first, beacon)
                if r.get("round") == held["round"] and "write" in r
            }
            return got if set(got) >= set(queued) else None

        answers = wait_for(f"{first}'s answers to round {held['round']}", answered, 120)
        log("; ".join(f"{w}: {a['msg']} {a.get('code', '')}" for w, a in answers.items()))
        if fenced:
            for what in queued:
                a = answers[what]
                assert a["msg"] == "write refused by the fence", (what, a)
                assert a["IsStaleFence"] or a["IsHolderMismatch"], (what, a)
            assert answers["spec"]["IsStaleFence"], answers["spec"]
            wait_for(
                f"{first} stopped leading and exited",
                lambda: (
                    (
                        restarts(env, first) > restarts_before
                        and any("leadership lost" in r["msg"] for r in records(env, first, beacon))
                    )
                    or None
                ),
                120,
            )
            # A round of the new leader after the thaw, seen by the watch: the refused writes
            # had their answer long before, so nothing of them can still land.
            last_rv = watch.versions()[-1]["rv"]
            wait_for(
                f"{second} writing {beacon} again",
                lambda: (
                    any(v["rv"] > last_rv and v["spec"] == second for v in watch.versions()) or None
                ),
                60,
            )
            for field in ("spec", "status"):
                stale = [v for v in after(watch.versions(), field, second) if v[field] == first]
                assert not stale, f"{field} overwritten by {first}: {stale}"
            for name in doomed:
                assert child_exists(env, name), f"{first}'s refused delete removed {name}"
        else:
            for what in queued:
                assert answers[what]["msg"] == "write sent", (what, answers[what])
            for field in ("spec", "status"):

                def overwritten(field: str = field) -> bool | None:
                    later = after(watch.versions(), field, second)
                    return any(v[field] == first for v in later) or None

                wait_for(
                    f"the watch showing {first}'s stale {field} over {second}'s", overwritten, 30
                )
            for name in doomed:
                assert not child_exists(env, name), f"the control's delete of {name} did not land"
        return {
            "frozen": first,
            "t1": t1,
            "new_leader": second,
            "t2": t2,
            "round": held["round"],
            "answers": {w: a.get("code", a["msg"]) for w, a in answers.items()},
        }
    finally:
        watch.stop()


def test_the_thawed_go_leaders_queued_writes_are_refused_typed_and_it_stops(
    env: NodeEnv, tmp_path: Path
) -> None:
    with explained(env):
        RESULTS["go_controller_pause"] = scenario(env, fenced=True, tmp=tmp_path)


def test_control_without_fencing_the_thawed_go_leader_overwrites(
    env: NodeEnv, tmp_path: Path
) -> None:
    with explained(env):
        RESULTS["go_controller_pause_control"] = scenario(env, fenced=False, tmp=tmp_path)
        assert len(pods(env, NS, SELECTOR)) == 2
