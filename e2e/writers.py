"""Writers and holders under load on the real node, recorded as one history for tests/chaos.

Each holder is a real Pod on the node (busybox, its own ServiceAccount) and a process on this
machine acting as that Pod: ``tests.chaos.holder`` with a Pod-bound token (``kubectl create
token --bound-object-kind Pod``), so the webhook sees the Pod's identity as it would see the
Pod's own requests. It reads its grants from its Pod's annotations and publishes the lease's
FencedArtifact with them (the article's loop). An observer thread polls the FencedLease
statuses and the artifacts and records every grant and every state it sees. :meth:`Writers.stop`
merges everything into one :class:`~tests.chaos.history.History` for the checker.

**Zombies, the same run's control.** :meth:`Writers.force_release` remembers the grant it ends;
:meth:`Writers.write_as_superseded` waits (bounded) until the observer has seen a newer grant of
that lease, then writes as the old grant's holder (its Pod-bound token) twice, right after each
other: the lease's FencedArtifact with the old token, through a ``tests.chaos.holder`` Holder's
own :class:`~fencedlease.client.Publisher` path (recorded in the run's history: the webhook
must refuse it), and a ConfigMap ``<lease>-control`` that no webhook guards, carrying the same
token and lease id (recorded apart: the API server takes it). :meth:`Writers.control_history`
is the run's grants plus those unguarded writes: the history an unfenced system would have
made from the same handovers, which the checker must report (``superseded_admitted``).

**A fenced namespace** (:class:`FencedNamespace`): the setting the real controllers' tests share
(test_35, test_36): a namespace a FencePolicy selects, a holder Pod (:func:`holder_pod`, as the
writers' holders) granted a FencedLease, and what a failure prints (:func:`fence_logs_about`).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tests.chaos import history as hist
from tests.chaos.checker import Report
from tests.chaos.history import ArtifactState, Grant, History, Policy, WriteInvoke, WriteOk
from tests.chaos.holder import Holder
from tests.integration import k8s

from e2e.node import RELEASE, ROOT, SYSTEM_NS, NodeEnv, log
from e2e.scenarios import wait_for
from fencedlease.client import KubeClient, KubeConfig
from fencedlease.client.errors import TransportError
from fencedlease.local import images

APP = "day2-holder"
GROUP_PATH = "/apis/fencedlease.io/v1alpha1/namespaces"


def _role(ns: str) -> list[dict[str, Any]]:
    rbac = "rbac.authorization.k8s.io"
    return [
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": APP, "namespace": ns},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                {
                    "apiGroups": ["fencedlease.io"],
                    "resources": ["fencedartifacts"],
                    "verbs": ["get", "create", "update", "patch"],
                },
                {  # the zombies' unguarded control object, <lease>-control
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["create", "update"],
                },
            ],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": APP, "namespace": ns},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": APP},
            "subjects": [
                {"kind": "Group", "name": f"system:serviceaccounts:{ns}", "apiGroup": rbac}
            ],
        },
    ]


def _pod(ns: str, name: str, leases: list[str]) -> dict[str, Any]:
    return holder_pod(ns, name, {"app": APP, **{f"lease-{lease}": "yes" for lease in leases}})


def holder_pod(ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A would-be holder on the node: a busybox Pod ``name`` sleeping, as its own
    ServiceAccount ``name`` (no token mounted)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "serviceAccountName": name,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": images.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sleep", "86400"],
                }
            ],
        },
    }


def lease_manifest(ns: str, name: str, policy: Policy, duration: int) -> dict[str, Any]:
    """The integration tests' FencedLease, its holders the Pods labelled for this lease."""
    manifest = k8s.lease(name, ns, duration, app=APP, policy=policy)
    manifest["spec"]["holderSelector"]["matchLabels"][f"lease-{name}"] = "yes"
    return manifest


@dataclass
class Writers:
    """``holders`` holder Pods and processes writing the artifacts of ``leases`` in ``ns``."""

    env: NodeEnv
    ns: str
    workdir: Path
    leases: dict[str, Policy]
    holders: int = 3
    duration: int = 10
    pace: float = 0.15
    names: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    observed: list[hist.Event] = field(default_factory=list)
    pods_seen: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    superseded: list[Grant] = field(default_factory=list)  # read by force_release, then ended
    control: list[hist.Event] = field(default_factory=list)  # the zombies' unguarded writes
    zombie_writes: list[tuple[WriteInvoke, str]] = field(default_factory=list)  # after stop()
    _zombies: dict[str, Holder] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _run: int = 0

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        """Namespace, RBAC, holder Pods (Ready), their tokens, the leases."""
        env, ns = self.env, self.ns
        self.workdir.mkdir(parents=True, exist_ok=True)
        env.kubectl("create", "namespace", ns)
        env.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"kind": "List", "apiVersion": "v1", "items": _role(ns)}),
        )
        self.names = [f"holder-{i}" for i in range(self.holders)]
        for name in self.names:
            env.kubectl("create", "serviceaccount", "-n", ns, name)
            env.kubectl("apply", "-f", "-", input=json.dumps(_pod(ns, name, list(self.leases))))
            time.sleep(1.1)  # distinct creation times: the oldest Ready candidate wins
        env.kubectl(
            "wait",
            "-n",
            ns,
            "--for=condition=Ready",
            "pod",
            "-l",
            f"app={APP}",
            "--timeout=180s",
            timeout=200,
        )
        for name in self.names:
            pod = env.get("pod", name, namespace=ns) or {}
            uid = pod["metadata"]["uid"]
            token = env.kubectl(
                "create",
                "token",
                "-n",
                ns,
                name,
                "--duration=4h",
                "--bound-object-kind=Pod",
                f"--bound-object-name={name}",
                f"--bound-object-uid={uid}",
            ).stdout.strip()
            path = self.workdir / f"{name}.token"
            path.write_text(token)
            path.chmod(0o600)
        for lease, policy in self.leases.items():
            env.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps(lease_manifest(ns, lease, policy, self.duration)),
            )

    def api(self) -> tuple[str, Path]:
        """The API server's URL and its CA as a file (from the node's kubeconfig)."""
        config = yaml.safe_load(self.env.kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        ca = self.workdir / "ca.crt"
        if "certificate-authority-data" in cluster:
            ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
        return str(cluster["server"]), ca

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Start the holders and the observer (a new history each time)."""
        self._run += 1
        self.observed, self.pods_seen = [], []
        self.superseded, self.control, self.zombie_writes, self._zombies = [], [], [], {}
        self._stop.clear()
        server, ca = self.api()
        for i, name in enumerate(self.names):
            argv = [
                sys.executable,
                "-m",
                "tests.chaos.holder",
                "--name",
                name,
                "--namespace",
                self.ns,
                "--server",
                server,
                "--ca-file",
                str(ca),
                "--token-file",
                str(self.workdir / f"{name}.token"),
                "--leases",
                ",".join(f"{n}:{p}" for n, p in self.leases.items()),
                "--history",
                str(self._history_file(name)),
                "--stage",
                str(self.workdir / "stage" / name),
                "--seed",
                str(self._run * 100 + i),
                "--pace",
                str(self.pace),
                "--job-steps",
                "6",
            ]
            out = (self.workdir / f"{name}.log").open("ab")
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=dict(os.environ, PYTHONPATH=str(ROOT)),
                )
            )
        self._thread = threading.Thread(target=self._observe, name="day2-observer", daemon=True)
        self._thread.start()

    def _history_file(self, name: str) -> Path:
        return self.workdir / f"{name}.run{self._run}.jsonl"

    def _observe(self) -> None:
        kube = KubeClient(KubeConfig.load(str(self.env.kubeconfig)))
        last_grant: dict[str, tuple[int, str]] = {}
        last_state: dict[str, tuple[int, str]] = {}
        last_pods: dict[str, str] = {}
        while not self._stop.is_set():
            try:
                self._poll(kube, last_grant, last_state, last_pods)
            except Exception as exc:  # the API server restarting: look again
                log(f"observer: {exc}")
            self._stop.wait(0.2)

    def _poll(
        self,
        kube: KubeClient,
        last_grant: dict[str, tuple[int, str]],
        last_state: dict[str, tuple[int, str]],
        last_pods: dict[str, str],
    ) -> None:
        leases = kube.request("GET", f"{GROUP_PATH}/{self.ns}/fencedleases")
        now = time.time()
        for obj in leases.json().get("items", []) if leases.ok else []:
            status = obj.get("status") or {}
            token, lease_id = status.get("fencingToken"), status.get("leaseId")
            if status.get("phase") != "Held" or not isinstance(token, int) or not lease_id:
                continue
            name = obj["metadata"]["name"]
            if last_grant.get(name) != (token, str(lease_id)):
                last_grant[name] = (token, str(lease_id))
                self.observed.append(
                    Grant(now, name, str(status.get("holder", "")), token, str(lease_id))
                )
        artifacts = kube.request("GET", f"{GROUP_PATH}/{self.ns}/fencedartifacts")
        now = time.time()
        for obj in artifacts.json().get("items", []) if artifacts.ok else []:
            spec = obj.get("spec") or {}
            token = spec.get("fencingToken")
            if not isinstance(token, int):
                continue
            name, pointer = obj["metadata"]["name"], str(spec.get("objectRef", ""))
            if last_state.get(name) != (token, pointer):
                last_state[name] = (token, pointer)
                lease = str((spec.get("leaseRef") or {}).get("name", ""))
                self.observed.append(ArtifactState(now, name, lease, token, pointer))
        pods = kube.request("GET", "/api/v1/namespaces/fencedlease-system/pods")
        current = {  # Ready, or terminating after it was Ready (a webhook drains)
            p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
            for p in (pods.json().get("items", []) if pods.ok else [])
            if any(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [])
            or p["metadata"].get("deletionTimestamp")
        }
        if current != last_pods:
            last_pods.clear()
            last_pods.update(current)
            self.pods_seen.append((time.time(), dict(current)))

    def stop(self) -> History:
        """Stop the holders (SIGTERM, bounded) and the observer; the merged history."""
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs = []
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        history = History(
            policies=dict(self.leases), durations={n: float(self.duration) for n in self.leases}
        )
        events: list[hist.Event] = [*self.observed, *self.superseded]
        for name in self.names:
            path = self._history_file(name)
            if path.exists():
                events += hist.loads(path.read_text()).events
        zombie = self._zombie_events()
        events += zombie
        self.zombie_writes = outcomes(zombie)
        history.events = sorted(events, key=lambda e: e.t)
        (self.workdir / f"history.run{self._run}.jsonl").write_text(hist.dumps(history))
        return history

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.workdir.glob("holder-*.log"))
        )

    # ------------------------------------------------------------------ driving

    def admitted_since(self, since: float) -> dict[str, int]:
        """Per lease, the admitted writes the holders recorded after ``since`` (so far)."""
        counts = {lease: 0 for lease in self.leases}
        for name in self.names:
            path = self._history_file(name)
            if not path.exists():
                continue
            lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
            events = hist.loads(lines[:-1] if lines and not lines[-1].endswith("}") else lines)
            invokes = {e.op_id: e for e in events.of(WriteInvoke)}
            for ok in events.of(WriteOk):
                if ok.t > since and ok.op_id in invokes:
                    counts[invokes[ok.op_id].lease] += 1
        return counts

    def wait_writing(self, what: str, since: float, timeout: float) -> None:
        """Until every lease has an admitted write after ``since``."""
        wait_for(
            f"writes admitted on every lease ({what})",
            lambda: all(v > 0 for v in self.admitted_since(since).values()) or None,
            timeout,
        )

    def granted_since(self, since: float) -> set[str]:
        """The leases the observer saw granted (a new token or lease id, Held) after ``since``."""
        return {e.lease for e in list(self.observed) if isinstance(e, Grant) and e.t > since}

    def wait_granted(self, what: str, since: float, timeout: float) -> None:
        """Until every lease was seen granted after ``since``. A grant, not a write: under
        ``StrictlyGreater`` a grant that already wrote its one write writes no more."""
        wait_for(
            f"a grant seen on every lease ({what})",
            lambda: self.granted_since(since) >= set(self.leases) or None,
            timeout,
        )

    def force_release(self, lease: str, *, only_held: bool = False) -> Grant | None:
        """``kubectl fencedlease force-release``'s annotation (for the lease id the status
        shows, whatever its phase: the annotation also makes the controller look at the lease
        again): the next grant supersedes. The grant it ends when the status showed it
        ``Held``, as read just before (also kept in ``superseded``), else ``None``.
        ``only_held``: no annotation either unless the status shows a grant ``Held``."""
        t = time.time()  # before the read: the grant read was current at some time after t
        obj = self.env.get("fencedleases.fencedlease.io", lease, namespace=self.ns) or {}
        status = obj.get("status") or {}
        lease_id, token = status.get("leaseId"), status.get("fencingToken")
        held = status.get("phase") == "Held" and bool(lease_id) and isinstance(token, int)
        if not lease_id or (only_held and not held):
            return None
        self.env.kubectl(
            "annotate",
            "fl",
            lease,
            "-n",
            self.ns,
            "--overwrite",
            f"fencedlease.io/force-release={lease_id}",
        )
        if not held or not isinstance(token, int):
            return None
        ended = Grant(t, lease, str(status.get("holder", "")), token, str(lease_id))
        self.superseded.append(ended)
        return ended

    # ------------------------------------------------------------------ zombies

    def newer_grant(self, old: Grant) -> Grant | None:
        """The first grant of ``old``'s lease with a higher token the observer has seen."""
        return next(
            (
                g
                for g in list(self.observed)
                if isinstance(g, Grant) and g.lease == old.lease and g.token > old.token
            ),
            None,
        )

    def write_as_superseded(self, old: Grant, timeout: float = 30.0) -> Grant:
        """Once a newer grant of ``old.lease`` was observed (waiting at most ``timeout``), write
        as ``old``'s holder with its token and lease id: the FencedArtifact (the fence must
        refuse it), then the unguarded ConfigMap ``<lease>-control`` (taken). The newer grant."""
        newer = wait_for(
            f"a grant of {old.lease} newer than token {old.token}",
            lambda: self.newer_grant(old),
            timeout,
            every=0.1,
        )
        zombie = self._zombie(old.holder.rsplit("/", 1)[-1])
        zombie.write(old.lease, old.token, old.lease_id)  # recorded in its history file
        self._control_write(zombie, old)
        return newer

    def _zombie(self, pod: str) -> Holder:
        """A holder process's own code, in this process, as Pod ``pod`` (its bound token)."""
        if pod not in self._zombies:
            server, ca = self.api()
            args = argparse.Namespace(
                name=pod,
                namespace=self.ns,
                leases=",".join(f"{n}:{p}" for n, p in self.leases.items()),
                control=False,
                stage=str(self.workdir / "stage" / f"zombie-{pod}"),
                seed=0,
                server=server,
                ca_file=str(ca),
                token_file=str(self.workdir / f"{pod}.token"),
                timeout=20.0,
                history=str(self._zombie_file(pod)),
                job_steps=1,
                pace=0.0,
            )
            self._zombies[pod] = Holder(args)
        return self._zombies[pod]

    def _zombie_file(self, pod: str) -> Path:
        return self.workdir / f"zombie-{pod}.run{self._run}.jsonl"

    def _control_write(self, zombie: Holder, old: Grant) -> None:
        """The same write to an object no webhook guards, as the zombie's Pod: a ConfigMap
        replaced unconditionally (no resourceVersion), created if missing."""
        name = f"{old.lease}-control"
        op_id = f"{zombie.name}-control-{uuid.uuid4().hex[:6]}"
        base = f"/api/v1/namespaces/{self.ns}/configmaps"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.ns},
            "data": {"fencingToken": str(old.token), "leaseId": old.lease_id, "opId": op_id},
        }
        self.control.append(
            WriteInvoke(time.time(), op_id, old.lease, old.holder, old.token, old.lease_id, name)
        )
        try:
            answer = zombie.kube.request("PUT", f"{base}/{name}", body=body)
            if answer.status_code == 404:
                answer = zombie.kube.request("POST", base, body=body)
        except TransportError:
            self.control.append(hist.WriteTimeout(time.time(), op_id))
            return
        code = f"http_{answer.status_code}"
        ok = WriteOk(time.time(), op_id)
        self.control.append(ok if answer.ok else hist.WriteFail(ok.t, op_id, code))

    def _zombie_events(self) -> list[hist.Event]:
        events: list[hist.Event] = []
        for pod, zombie in self._zombies.items():
            zombie.history.out.close()  # no more writes in this run
            events += hist.loads(self._zombie_file(pod).read_text()).events
        return events

    def control_history(self) -> History:
        """The run's observed grants and the zombies' unguarded writes (after :meth:`stop`)."""
        grants = [e for e in [*self.observed, *self.superseded] if isinstance(e, Grant)]
        return History(
            policies=dict(self.leases),
            durations={n: float(self.duration) for n in self.leases},
            events=sorted([*grants, *self.control], key=lambda e: e.t),
        )

    def tokens(self) -> dict[str, int]:
        """Per lease: the highest token its status and its artifact show now."""
        best: dict[str, int] = {}
        for kind in ("fencedleases", "fencedartifacts"):
            got = self.env.kubectl("get", kind, "-n", self.ns, "-o", "json")
            for obj in json.loads(got.stdout)["items"]:
                section = obj.get("status" if kind == "fencedleases" else "spec") or {}
                token = section.get("fencingToken")
                lease = (
                    obj["metadata"]["name"]
                    if kind == "fencedleases"
                    else ((section.get("leaseRef") or {}).get("name", ""))
                )
                if isinstance(token, int):
                    best[lease] = max(best.get(lease, 0), token)
        return best


def outcomes(events: list[hist.Event]) -> list[tuple[WriteInvoke, str]]:
    """Each write and how it ended: ``ok``, its refusal code, or ``timeout`` (no answer)."""
    ended: dict[str, str] = {}
    for event in events:
        if isinstance(event, WriteOk):
            ended[event.op_id] = "ok"
        elif isinstance(event, hist.WriteFail):
            ended[event.op_id] = event.code
    writes = [e for e in events if isinstance(e, WriteInvoke)]
    return [(w, ended.get(w.op_id, "timeout")) for w in sorted(writes, key=lambda w: w.t)]


def refused_current(history: History) -> tuple[int, int]:
    """Writes sent with the newest grant observed for their lease that were not admitted
    (refused with any code, or no answer), and all such writes: the writes that should pass."""
    grants = sorted(history.of(Grant), key=lambda g: g.t)
    answers: dict[str, str] = {}
    for event in history.events:
        if isinstance(event, WriteOk):
            answers[event.op_id] = "ok"
        elif isinstance(event, hist.WriteFail | hist.WriteTimeout):
            answers.setdefault(event.op_id, "refused")
    should, refused = 0, 0
    for write in history.of(WriteInvoke):
        newest = max(
            (g.token for g in grants if g.lease == write.lease and g.t < write.t), default=0
        )
        if write.token < newest or write.op_id not in answers:
            continue
        should += 1
        refused += answers[write.op_id] != "ok"
    return refused, should


def summary(report: Report) -> dict[str, Any]:
    return {
        "violations": len(report.violations),
        "kinds": sorted({v.kind for v in report.violations}),
        "admitted": report.admitted,
        "refused": report.refused,
    }


LEASE_LABEL = "fencedlease.io/lease"
TOKEN_ANNOTATION = "fencedlease.io/token"


@contextmanager
def fenced_objects_node(state: Path, api_group: str, resource: str) -> Iterator[NodeEnv]:
    """A node cluster of its own under ``state``, the chart installed with ``resource`` of
    ``api_group`` among the kinds its controller records (and its webhook reads)."""
    env = NodeEnv(state)
    with env.running():
        kinds = json.dumps(
            [{"apiGroup": api_group, "resources": [resource]}], separators=(",", ":")
        )
        env.helm_install(f"--set-json=fencedObjects.resources={kinds}")
        yield env


def apply(
    env: NodeEnv, obj: dict[str, Any], *flags: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``kubectl apply [flags] -f -`` of ``obj``."""
    return env.kubectl("apply", *flags, "-f", "-", input=json.dumps(obj), check=check)


def fence_logs_about(env: NodeEnv, ns: str) -> list[str]:
    """The webhook's and the controller's last log lines about ``ns`` (or an error), each
    component's under its own heading: what a failure prints."""
    parts = []
    for component in ("webhook", "controller"):
        logs = env.kubectl(
            "logs", "-n", SYSTEM_NS,
            "-l", f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}",
            "--tail=400", "--prefix", check=False,
        )  # fmt: skip
        about = [ln for ln in logs.stdout.splitlines() if ns in ln or "rror" in ln][-60:]
        parts.append(f"--- {component} logs about {ns} ---\n" + "\n".join(about))
    return parts


@dataclass(frozen=True)
class FencedNamespace:
    """A namespace ``ns`` on the node whose objects of ``resource`` (``api_group``) a
    FencePolicy ``policy`` fences (selecting the namespace by the label ``selected``), and a
    FencedLease ``lease`` held by the Pod ``app``: the setting of the real controllers' tests
    (test_35, test_36)."""

    env: NodeEnv
    ns: str
    lease: str
    app: str
    policy: str
    selected: str
    api_group: str
    resource: str

    def create(self) -> None:
        """The namespace (labelled for the policy), the holder's ServiceAccount and Pod, the
        lease; no policy yet (:meth:`fence_policy`)."""
        env, ns = self.env, self.ns
        env.kubectl("create", "namespace", ns)
        env.kubectl("label", "namespace", ns, f"{self.selected}=yes")
        env.kubectl("create", "serviceaccount", "-n", ns, self.app)
        apply(env, holder_pod(ns, self.app, {"app": self.app}))
        apply(env, k8s.lease(self.lease, ns, duration=30, app=self.app))

    def fence_policy(self) -> dict[str, Any]:
        return {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencePolicy",
            "metadata": {"name": self.policy},
            "spec": {
                "resources": [{"apiGroup": self.api_group, "resources": [self.resource]}],
                "namespaceSelector": {"matchLabels": {self.selected: "yes"}},
            },
        }

    def policy_ready(self) -> bool:
        out = self.env.kubectl(
            "get", "fencepolicies.fencedlease.io", self.policy, "-o", "json", check=False
        )
        got = json.loads(out.stdout) if out.returncode == 0 else {}
        conditions = (got.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def grant(self) -> tuple[str, int] | None:
        """(holder, token) once the lease is held by the holder Pod."""
        found = self.env.get("fencedleases.fencedlease.io", self.lease, namespace=self.ns)
        status = (found or {}).get("status") or {}
        holder, token = status.get("holder"), status.get("fencingToken")
        if status.get("phase") != "Held" or holder != self.app or not token:
            return None
        return str(holder), int(token)

    def held(self, fenced: str, enforced: Callable[[], bool]) -> tuple[str, int]:
        """Once the policy is Ready, ``enforced()`` (the API server refuses an untokened
        labelled object: ``fenced`` says which), the holder Pod Ready and the lease granted
        to it: (holder, token)."""
        wait_for(f"FencePolicy {self.policy} Ready", lambda: self.policy_ready() or None, 120)
        wait_for(fenced, lambda: enforced() or None, 60)
        self.env.kubectl(
            "wait", "-n", self.ns, "--for=condition=Ready", f"pod/{self.app}", "--timeout=180s"
        )
        holder, token = wait_for(f"{self.app} granted {self.lease}", self.grant, 120)
        log(f"{holder} holds {self.lease} with token {token}")
        return holder, token

    def gone(self) -> bool:
        got = self.env.kubectl("get", "namespace", self.ns, "-o", "name", check=False)
        return got.returncode != 0 and "NotFound" in got.stderr

    def delete_policy(self) -> None:
        self.env.kubectl(
            "delete", "fencepolicies.fencedlease.io", self.policy, "--ignore-not-found", check=False
        )
