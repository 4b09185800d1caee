"""The article's scenario for a controller on a real node: examples/fenced-controller.

A node cluster of its own (``fencedlease local up --node``), the chart installed from locally
built images (``local/images.py``, no registry) with ConfigMaps among the kinds its controller
records, then the example operator with two replicas on the operator image (its code in a
ConfigMap). The leader is frozen with ``ctr tasks pause`` past its lease; the other replica is
granted the lease and writes; the old leader thaws, its queued write is refused with
``stale_fence``, the object keeps the new leader's content and the old leader stops (its
container exits with 3). Its queued **status** and **scale** writes of the example's Heartbeat
(no token: decided by who writes, its Pod-bound identity) are refused too, and the Heartbeat
keeps the new leader's status and replicas. The control run (``FENCED=false``: nothing
labelled) shows the three overwrites, so the test can fail. The manifests apply as written:
their image is the chart's default name, which the node's operator image is tagged with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.history import History, overwritten
from e2e.node import RESULTS, ROOT, E2EError, NodeEnv, log
from e2e.scenarios import wait_for

pytestmark = pytest.mark.timeout(1500)

NS = "fenced-controller-e2e"
EXAMPLE = ROOT / "examples" / "fenced-controller"
LEASE = "fenced-controller"


@pytest.fixture(scope="module")
def env(state_root: Path) -> Iterator[NodeEnv]:
    env = NodeEnv(state_root / "controller")
    with env.running():
        env.tag_release_image()
        env.helm_install(
            "--set-json=fencedObjects.resources="
            '[{"apiGroup":"","resources":["configmaps"]},'
            '{"apiGroup":"example.fencedlease.io","resources":["heartbeats"]}]'
        )
        env.kubectl("create", "namespace", NS)
        env.kubectl(
            "create",
            "configmap",
            "-n",
            NS,
            "fenced-controller-code",
            f"--from-file={EXAMPLE / 'fenced_controller.py'}",
        )
        yield env


def manifests(env: NodeEnv, fenced: bool, state: str) -> str:
    docs = list(yaml.safe_load_all((EXAMPLE / "manifests.yaml").read_text()))
    for doc in docs:
        if doc.get("kind") == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert container["image"] == env.images["release"], container["image"]
            container["env"] += [
                {"name": "FENCED", "value": "true" if fenced else "false"},
                {"name": "STATE_NAME", "value": state},
            ]
    return yaml.safe_dump_all(docs)


HEARTBEATS = "heartbeats.example.fencedlease.io"


def get(env: NodeEnv, kind: str, name: str) -> dict[str, Any] | None:
    return env.get(kind, name, namespace=NS)


def replicas(env: NodeEnv) -> list[str]:
    """The example's Pods that are not being deleted."""
    got = env.kubectl("get", "pods", "-n", NS, "-l", "app=fenced-controller", "-o", "json")
    return [
        str(p["metadata"]["name"])
        for p in json.loads(got.stdout)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]


def holder(env: NodeEnv, exclude: str | None = None) -> tuple[str, int] | None:
    """The lease's holder among the current replicas (a status naming a Pod of an earlier
    run does not count)."""
    status = (get(env, "fencedleases.fencedlease.io", LEASE) or {}).get("status") or {}
    name, token = status.get("holder"), status.get("fencingToken")
    if status.get("phase") != "Held" or not name or name == exclude or not token:
        return None
    if name not in replicas(env):
        return None
    return str(name), int(token)


def leader_shown(env: NodeEnv, state: str) -> str | None:
    found = get(env, "configmap", state) or {}
    return (found.get("data") or {}).get("leader")


def heartbeat(env: NodeEnv, state: str) -> tuple[str | None, int | None]:
    """The Heartbeat's status leader and its replicas (written through ``scale``)."""
    found = get(env, HEARTBEATS, state) or {}
    return (found.get("status") or {}).get("leader"), (found.get("spec") or {}).get("replicas")


def _data_leader(found: dict[str, Any]) -> dict[str, Any]:
    return {"leader": (found.get("data") or {}).get("leader")}


def _status_leader(found: dict[str, Any]) -> dict[str, Any]:
    return {"leader": (found.get("status") or {}).get("leader")}


def container(env: NodeEnv, pod: str) -> dict[str, Any]:
    statuses = ((get(env, "pod", pod) or {}).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def logs(env: NodeEnv, pod: str, previous: bool = False) -> str:
    args = ["logs", "-n", NS, pod, *(["--previous"] if previous else [])]
    return env.kubectl(*args, check=False).stdout


def scenario(env: NodeEnv, fenced: bool, tmp: Path) -> dict[str, Any]:
    state = f"state-{'fenced' if fenced else 'control'}"
    env.kubectl("apply", "-n", NS, "-f", "-", input=manifests(env, fenced, state))
    env.kubectl("rollout", "status", "-n", NS, "deployment/fenced-controller", "--timeout=300s")
    first, t1 = wait_for("a holder", lambda: holder(env), 180)
    wait_for(f"{first} writing {state}", lambda: leader_shown(env, state) == first or None, 120)
    wait_for(  # both objects exist before they are watched
        f"{first} writing the Heartbeat's status",
        lambda: heartbeat(env, state)[0] == first or None,
        120,
    )
    # Every version of both objects: a stale leader's overwrite lasts only until the new
    # leader's next round, which a poll can miss (and a refused one must never show).
    with (
        History(env, NS, "configmap", state, tmp / "configmap.json", _data_leader) as states,
        History(env, NS, HEARTBEATS, state, tmp / "heartbeat.json", _status_leader) as beats,
    ):
        second, t2, before = freeze_and_hand_over(env, state, first, t1)
        if fenced:
            refusals = [
                f"{what}{state} write refused (403)" for what in ("", "status of ", "scale of ")
            ]

            def stopped() -> bool | None:
                text = logs(env, first) + logs(env, first, previous=True)
                restarted = int(container(env, first).get("restartCount") or 0) >= 1
                refused = all(r in text for r in refusals) and "stale_fence" in text
                return (refused and restarted) or None

            wait_for(f"{first}'s three queued writes refused and it stopped", stopped, 120)
            # Its three writes were answered (refused) before it stopped: none is in the
            # history after the new leader's first version.
            assert not overwritten(states, "leader", second, first), states.versions()
            assert not overwritten(beats, "leader", second, first), beats.versions()
            # B's replicas or more (B keeps writing; A's were lower): A's scale write refused
            after = heartbeat(env, state)
            assert (after[1] or 0) >= (before[1] or 0), (before, after)
        else:
            wait_for(
                f"{first}'s stale write overwriting {second}'s",
                lambda: overwritten(states, "leader", second, first),
                60,
            )
            wait_for(
                f"{first}'s stale status write overwriting {second}'s",
                lambda: overwritten(beats, "leader", second, first),
                60,
            )
    env.kubectl("delete", "deployment", "-n", NS, "fenced-controller", "--wait=true")
    wait_for("the replicas gone", lambda: not replicas(env) or None, 120)
    return {"frozen": first, "t1": t1, "new_leader": second, "t2": t2}


def freeze_and_hand_over(
    env: NodeEnv, state: str, first: str, t1: int
) -> tuple[str, int, tuple[str | None, int | None]]:
    """Pause ``first``'s container until the other replica holds the lease with a greater
    token and has written the ConfigMap and the Heartbeat's status; then thaw it. The new
    holder, its token and the Heartbeat it wrote."""
    cid = str(container(env, first).get("containerID", "")).split("://", 1)[-1]
    if not cid:
        raise E2EError(f"no container of {first}")
    log(f"freezing leader {first} (token {t1}) with ctr tasks pause")
    env.containerd.ctr("tasks", "pause", cid)
    try:
        second, t2 = wait_for(
            "the other replica granted the lease", lambda: holder(env, exclude=first), 180
        )
        assert t2 > t1
        wait_for(f"{second} writing", lambda: leader_shown(env, state) == second or None, 120)
        before = wait_for(
            f"{second} writing the Heartbeat's status",
            lambda: ((found := heartbeat(env, state))[0] == second and found) or None,
            60,
        )
    finally:
        env.containerd.ctr("tasks", "resume", cid, check=False)
    log(f"thawed {first}; its queued write carries token {t1}")
    return second, t2, before


def test_the_thawed_leaders_queued_write_is_refused_and_it_stops(
    env: NodeEnv, tmp_path: Path
) -> None:
    RESULTS["controller_pause"] = scenario(env, fenced=True, tmp=tmp_path)


def test_control_without_fencing_the_thawed_leader_overwrites(env: NodeEnv, tmp_path: Path) -> None:
    RESULTS["controller_pause_control"] = scenario(env, fenced=False, tmp=tmp_path)


def test_refusals_are_recorded(env: NodeEnv) -> None:
    events = env.kubectl(
        "get", "events", "-n", NS, "--field-selector", "reason=FenceStaleFence", "-o", "json"
    )
    assert json.loads(events.stdout)["items"], "no FenceStaleFence Event on the state ConfigMap"
