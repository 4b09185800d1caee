"""Controller failover through the real API server: two ``fencedlease run --role controller``
replicas elect one writer with a coordination.k8s.io Lease.

* kill -9 of the leader: the standby takes over and renews the holder's grant (same token)
  within the election's lease duration + skew + one retry period (measured, printed);
* graceful stop (SIGTERM): the leader releases the Lease and the standby takes over at once;
* SIGSTOP: a paused leader that resumes after its successor ran writes nothing (no Pod
  annotation, no status, no Event) until it has waited out a full election duration, and
  nothing stale after — seen in watch streams of every object it could write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess

from .k8s import (
    apply,
    lease,
    lease_status,
    pod_lease_annotations,
    ready_pods,
    running_operator,
    set_ready,
    wait_for,
    wait_held,
)

ELECTION = "fencedlease-controller"
DURATION, RENEW_DEADLINE, RETRY, SKEW = 5, 3.0, 1.0, 1.0  # the settings' defaults


def election(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "lease", ELECTION, "-n", namespace, "-o", "json", check=False)
    if result.returncode != 0:
        return {}
    obj: dict[str, Any] = json.loads(result.stdout)
    return obj


def holder(cluster: LocalCluster, namespace: str) -> str | None:
    spec = election(cluster, namespace).get("spec") or {}
    return spec.get("holderIdentity") or None


@contextmanager
def replicas(
    cluster: LocalCluster, tmp_path: Path, namespace: str, *names: str
) -> Iterator[dict[str, ManagedProcess]]:
    """Controller replicas scoped to ``namespace`` (their election Lease lives there)."""
    with ExitStack() as stack:
        procs = {
            name: stack.enter_context(
                running_operator(
                    cluster,
                    tmp_path,
                    "--role",
                    "controller",
                    "--namespace",
                    namespace,
                    name=name,
                    env={"FENCEDLEASE_LEADER_ELECTION_IDENTITY": name, "HOSTNAME": name},
                )
            )
            for name in names
        }
        try:
            yield procs
        except BaseException:
            for name, proc in procs.items():
                print(f"----- {name} -----\n{proc.log_tail(80)}")
            raise
        finally:
            for proc in procs.values():  # a stopped process cannot handle SIGTERM
                if proc.alive() and proc.proc is not None:
                    os.kill(proc.proc.pid, signal.SIGCONT)


def pid(proc: ManagedProcess) -> int:
    assert proc.proc is not None
    return proc.proc.pid


def test_kill_9_of_the_leader_fails_over_before_the_holder_loses_its_grant(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("fo", namespace, duration=20))
    with replicas(cluster, tmp_path, namespace, "r-1", "r-2") as procs:
        first = wait_for(lambda: holder(cluster, namespace), timeout=20, what="a leader")
        held = wait_held(cluster, "fo", namespace)
        survivor = next(n for n in procs if n != first)
        assert holder(cluster, namespace) == first  # the standby never took it

        os.kill(pid(procs[first]), signal.SIGKILL)
        killed = time.monotonic()
        procs[first].proc.wait(10)  # type: ignore[union-attr]
        time.sleep(0.3)  # lets a write the dead process had in flight land first
        before = lease_status(cluster, "fo", namespace)["renewTime"]

        def renewed_by_survivor() -> dict[str, Any] | None:
            status = lease_status(cluster, "fo", namespace)
            if status.get("renewTime") != before and holder(cluster, namespace) == survivor:
                return status
            return None

        bound = DURATION + SKEW + 2 * RETRY + 2  # takeover bound + the first pass
        status = wait_for(renewed_by_survivor, timeout=bound + 5, what="renewal by the survivor")
        failover = time.monotonic() - killed
        print(f"\nFAILOVER kill -9 -> next renewal by the new leader: {failover:.2f}s")
        taken = election(cluster, namespace)["spec"]
        assert taken["leaseTransitions"] >= 1
        # The holder kept its grant: same token and lease id, still held, well in time.
        assert (status["fencingToken"], status["leaseId"]) == (
            held["fencingToken"],
            held["leaseId"],
        )
        assert pod_lease_annotations(cluster, status["holder"], namespace, "fo")["state"] == "held"
        assert failover < bound, failover
        assert failover < 20 / 2, "failover must be well under the holders' lease duration"


def test_a_graceful_stop_hands_the_election_over_at_once(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a")
    apply(cluster, lease("gs", namespace, duration=20))
    with replicas(cluster, tmp_path, namespace, "r-1", "r-2") as procs:
        first = wait_for(lambda: holder(cluster, namespace), timeout=20, what="a leader")
        held = wait_held(cluster, "gs", namespace)
        survivor = next(n for n in procs if n != first)
        os.kill(pid(procs[first]), signal.SIGTERM)
        stopped, took_over_at = time.monotonic(), int(time.time())
        wait_for(
            lambda: holder(cluster, namespace) == survivor,
            timeout=RETRY + 2,
            what="the survivor to take the released Lease",
        )
        print(f"\nFAILOVER SIGTERM -> new leader: {time.monotonic() - stopped:.2f}s")
        # The new leader renews the same grant: the holder's deadline moves (each renewal
        # publishes valid-until on the Pod), and its first renewal of the term is in the status
        # (not before the takeover).
        published = pod_lease_annotations(cluster, "w-a", namespace, "gs")["valid_until"]
        wait_for(
            lambda: (
                pod_lease_annotations(cluster, "w-a", namespace, "gs")["valid_until"] != published
                and lease_status(cluster, "gs", namespace).get("fencingToken")
                == held["fencingToken"]
            ),
            timeout=20,
            what="the new leader's renewal of the same grant",
        )
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(took_over_at))
        wait_for(
            lambda: lease_status(cluster, "gs", namespace).get("renewTime", "") >= since,
            timeout=10,
            what=f"the new term's first renewal in the status (renewTime >= {since})",
        )
        procs[first].proc.wait(30)  # type: ignore[union-attr]
        log = procs[first].log_tail(40)
        # it stopped writing, then released, before its watches and passes ended
        assert (
            log.index("stopped leading")
            < log.index("released Lease")
            < log.index("controller stopping")
        ), log


# ------------------------------------------------------------------------------- SIGSTOP


class Watch:
    """``kubectl get KIND --watch -o json --output-watch-events`` collected in a thread."""

    def __init__(self, cluster: LocalCluster, kind: str, namespace: str) -> None:
        self.kind = kind
        self.events: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [
                str(binary_path("kubectl")),
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                kind,
                "-n",
                namespace,
                "--watch",
                "--output-watch-events",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    obj, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break
                buffer = buffer.lstrip()[end:]
                self.events.append(obj)

    def after(self, rv: int) -> list[dict[str, Any]]:
        return [e for e in self.events if rev(e["object"]) > rv]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def rev(obj: dict[str, Any]) -> int:
    # One etcd behind one API server: resourceVersions are its revisions, in commit order.
    return int(obj["metadata"]["resourceVersion"])


def current_revision(cluster: LocalCluster, namespace: str) -> int:
    raw = cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods?limit=1").stdout
    return int(json.loads(raw)["metadata"]["resourceVersion"])


def describe(event: dict[str, Any]) -> str:
    obj = event["object"]
    meta = obj["metadata"]
    return (
        f"{event['type']} {obj.get('kind')} {meta['name']} rv={meta['resourceVersion']} "
        f"{json.dumps(meta.get('annotations') or obj.get('status') or obj.get('message'))[:300]}"
    )


@pytest.mark.timeout(180)
def test_a_paused_leader_that_resumes_writes_nothing_stale(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    ready_pods(cluster, namespace, "w-a", "w-b")
    apply(cluster, lease("st", namespace, duration=3))
    with replicas(cluster, tmp_path, namespace, "r-1", "r-2") as procs:
        a = wait_for(lambda: holder(cluster, namespace), timeout=20, what="a leader")
        b = next(n for n in procs if n != a)
        first = wait_held(cluster, "st", namespace)
        assert first["holder"] == "w-a"

        # 1. A freezes; B takes over once A's Lease went a full duration + skew unrenewed.
        os.kill(pid(procs[a]), signal.SIGSTOP)
        paused = time.monotonic()
        wait_for(lambda: holder(cluster, namespace) == b, timeout=DURATION + SKEW + 2 * RETRY + 3)
        assert time.monotonic() - paused >= DURATION + SKEW - RETRY  # it waited out A's term

        # 2. The world moves on under B: w-a stops being Ready, B grants w-b a greater token.
        set_ready(cluster, "w-a", namespace, False)
        moved = wait_for(
            lambda: (
                (s := lease_status(cluster, "st", namespace)).get("holder") == "w-b"
                and s.get("fencingToken", 0) > first["fencingToken"]
                and pod_lease_annotations(cluster, "w-a", namespace, "st").get("state") == "lost"
                and s
            ),
            timeout=30,
            what="the grant to move to w-b under B",
        )

        # 3. B freezes too: from now on every write in the namespace can only be A's.
        os.kill(pid(procs[b]), signal.SIGSTOP)
        kinds = ("pods", "fencedleases", "events", "leases.coordination.k8s.io")
        watches = [Watch(cluster, kind, namespace) for kind in kinds]
        try:
            wait_for(lambda: all(w.events for w in watches), timeout=20, what="watches listing")
            snapshot = current_revision(cluster, namespace)
            os.kill(pid(procs[a]), signal.SIGCONT)
            resumed = time.monotonic()

            # 4. A must wait out B's term before it may lead (its own is long over).
            wait_for(
                lambda: holder(cluster, namespace) == a,
                timeout=DURATION + SKEW + 2 * RETRY + 5,
                what="the resumed replica to take over after B's term",
            )
            waited = time.monotonic() - resumed
            # A's term begins at the commit that made it the holder: the first version of the
            # election Lease naming A after the snapshot (its current version would also count
            # A's first writes as leader, made before that read, as writes before its term).
            acquired = wait_for(
                lambda: min(
                    (
                        rev(e["object"])
                        for e in watches[3].after(snapshot)
                        if e["object"]["metadata"]["name"] == ELECTION
                        and (e["object"].get("spec") or {}).get("holderIdentity") == a
                    ),
                    default=None,
                ),
                timeout=15,
                what="the watch to deliver the election Lease naming the resumed replica",
            )
            # ... and leads from a fresh view: it renews w-b's current grant.
            wait_for(
                lambda: (
                    (s := lease_status(cluster, "st", namespace)).get("renewTime")
                    != moved.get("renewTime")
                    and s
                ),
                timeout=15,
                what="a renewal by the resumed leader",
            )
            time.sleep(0.5)  # let the watch streams catch up with what we just read
        finally:
            for w in watches:
                w.stop()

        log_a = procs[a].log_tail(200)
        assert "stopped leading" in log_a, log_a
        assert waited >= DURATION + SKEW - RETRY, f"took over after only {waited:.2f}s"

        # Nothing at all was written between A's resume and its new term.
        before_term = [
            describe(e) for w in watches for e in w.after(snapshot) if rev(e["object"]) < acquired
        ]
        assert before_term == [], "\n".join(before_term)

        # Nothing stale after: w-a never reads held again, the status never goes back.
        state = "state.fencedlease.io/st"
        for e in next(w for w in watches if w.kind == "pods").after(snapshot):
            meta = e["object"]["metadata"]
            if meta["name"] == "w-a":
                assert (meta.get("annotations") or {}).get(state) != "held", describe(e)
        for e in next(w for w in watches if w.kind == "fencedleases").after(snapshot):
            s = e["object"].get("status") or {}
            assert s.get("holder") == "w-b", describe(e)
            assert s.get("fencingToken") == moved["fencingToken"], describe(e)
            assert s.get("transitions", 0) >= moved.get("transitions", 0), describe(e)
        for e in next(w for w in watches if w.kind == "events").after(snapshot):
            assert e["object"].get("reason") != "Granted", describe(e)
