"""The fault campaign against the real system (``make chaos``; a short profile runs in
``make test``).

On a local control plane (etcd + kube-apiserver) it runs the product as users do — two
controller replicas and the fence webhook, each its own ``fencedlease run`` process, the grant
authority on its own 3-member etcd — and at least 8 holder processes (:mod:`tests.chaos.holder`),
each acting as its own Pod: a Pod object, its own ServiceAccount and a Pod-bound token, its
Ready condition set by the campaign as a kubelet would. Holders write through
:class:`~tests.chaos.proxy.FaultProxy`. A seeded nemesis injects real process-level faults:

=================  ==========================================================================
``pause``          SIGSTOP a holder inside a job for longer than its lease (its Pod turns
                   NotReady as a failing probe would) and until its successor has written
                   (bounded), then SIGCONT: the GC pause
``partition``      the proxy holds a holder's writes for longer than the lease while its Pod is
                   NotReady: the token-41 write delivered after 42
``duplicate``      the proxy delivers each write of a holder twice
``reorder``        random delays on every write (requests overtake each other)
``ready_flap``     a holder's Pod NotReady for a while (an ordinary handover)
``operator_kill``  kill -9 of a controller replica (the leader half of the time), restarted
``controller_pause``  SIGSTOP of a controller replica (the leader half of the time) for longer
                   than its election lease, then SIGCONT: a paused leader must write nothing
                   stale when it resumes
``webhook_kill``   kill -9 of the webhook process, restarted (no webhook: ``webhook_down``)
``etcd_kill``      kill -9 of one etcd member (the leader half of the time: a leader change),
                   restarted
``etcd_down``      kill -9 of every etcd member, restarted
``restore``        snapshot; later restore it without ``--bump-revision`` (grants must stop),
                   then with it (grants resume above every earlier token)
=================  ==========================================================================

Everything observed goes into one :class:`~tests.chaos.history.History`: the holders' grants
and write attempts (their JSON lines), the lease statuses and artifact states seen through
watches, and every fault window. :func:`tests.chaos.checker.check` decides; :mod:`.report`
writes the markdown summary and the PNG timeline.

``control=True`` runs the same holders and holder faults against a plain CRD with the
artifact's schema and no fence (no webhook, no CEL rule): the checker must call it unsafe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port, operator_process
from fencedlease.models import ARTIFACTS, GROUP, LEASES, VERSION
from tests.chaos import history as hist
from tests.chaos.checker import Report, check
from tests.chaos.etcd import EtcdCluster
from tests.chaos.history import ArtifactState, Fault, Grant, History, Policy, Vacant
from tests.chaos.holder import CONTROL_GROUP, CONTROL_PLURAL
from tests.chaos.proxy import FaultProxy
from tests.fence_servers import http_ok

REPO = Path(__file__).resolve().parents[2]
APP = "chaos-holder"

FAULTS = (
    "pause",
    "partition",
    "duplicate",
    "reorder",
    "ready_flap",
    "operator_kill",
    "controller_pause",
    "webhook_kill",
    "etcd_kill",
    "etcd_down",
    "restore",
)
HOLDER_FAULTS = ("pause", "partition", "duplicate", "reorder", "ready_flap")


@dataclass(frozen=True)
class Profile:
    name: str
    seed: int
    writes: int  # stop once the holders sent this many fenced writes ...
    max_seconds: float  # ... or after this long (the run then fails its write target)
    min_faults: int  # ... and not before each fault kind ran this many times (restore: 1/4)
    holders: int = 8
    leases: tuple[tuple[str, Policy], ...] = (
        ("alpha", "AllowEqual"),
        ("beta", "StrictlyGreater"),
        ("gamma", "AllowEqual"),
        ("delta", "StrictlyGreater"),
        ("epsilon", "AllowEqual"),
    )
    duration: int = 2  # leaseDurationSeconds
    faults: tuple[str, ...] = FAULTS
    control: bool = False
    # The healthy gap after each fault of the system lane, in lease durations. The short
    # profile waits longer: on 2 cores a restarted process takes up to 10 s to serve again,
    # and without the longer gap outages (not the holders) decide its write count.
    system_gap: float = 2.0


PROFILES = {
    "short": Profile("short", seed=7, writes=1000, max_seconds=300, min_faults=1, system_gap=3.0),
    "full": Profile("full", seed=12, writes=10_000, max_seconds=1740, min_faults=20),
    "control": Profile("control", seed=7, writes=300, max_seconds=120, min_faults=5, control=True),
}


@dataclass
class Proc:
    """A ``fencedlease run`` process the nemesis may kill and restart."""

    name: str
    make: Callable[[], ManagedProcess]
    health_port: int
    process: ManagedProcess | None = None

    def start(self) -> None:
        self.process = self.make()
        self.process.start()

    def ready(self) -> bool:
        return http_ok(f"http://127.0.0.1:{self.health_port}/readyz")

    def kill(self) -> None:
        if self.process is not None and self.process.proc is not None:
            self.process.proc.send_signal(signal.SIGKILL)
            self.process.proc.wait()
            self.process.stop()


@dataclass
class HolderProc:
    name: str
    uid: str
    token: str
    history: Path
    process: subprocess.Popen[bytes] | None = None
    stopped: bool = False


@dataclass
class Campaign:
    profile: Profile
    cluster: LocalCluster
    workdir: Path
    log: Callable[[str], None] = print
    namespace: str = field(default_factory=lambda: f"chaos-{uuid.uuid4().hex[:6]}")
    history: History = field(default_factory=History)
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.profile.seed)
        self.etcd = EtcdCluster(self.workdir / "etcd", 3, seed=self.profile.seed)
        self.holders: list[HolderProc] = []
        self.controllers: list[Proc] = []
        self.webhook: Proc | None = None
        self.webhook_port = 0
        self.proxy: FaultProxy | None = None
        self.busy: set[str] = set()  # targets under a fault now (one fault per target)
        self.sent = 0
        self._read_offsets: dict[Path, int] = {}
        self.history.policies = dict(self.profile.leases)
        self.history.durations = {n: float(self.profile.duration) for n, _ in self.profile.leases}
        self.snapshot_seq = 0
        self.current: dict[str, str] = {}  # lease → holder, as the last status showed
        self.current_token: dict[str, int] = {}  # lease → token, as the last status showed
        self.artifact_token: dict[str, int] = {}  # lease → token of its artifact's last state
        self.target_met = False  # the write target and every fault minimum reached in time

    # ================================================================= setup

    async def setup(self) -> None:
        await config.load_kube_config(config_file=str(self.cluster.kubeconfig))
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        await self.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=self.namespace))
        )
        if self.profile.control:
            self._install_control_crd()
        self.log(f"etcd: 3 members under {self.etcd.root}")
        self.etcd.start()
        await self._rbac()
        await self._pods()
        await self._start_operator()
        for name, policy in self.profile.leases:
            await self.custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                LEASES,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "FencedLease",
                    "metadata": {"name": name},
                    "spec": {
                        "leaseDurationSeconds": self.profile.duration,
                        "fencingPolicy": policy,
                        "holderSelector": {"matchLabels": {"app": APP, f"lease-{name}": "yes"}},
                    },
                },
            )
        self.proxy = FaultProxy(
            self.cluster.api_url,
            str(self.cluster.ca_file),
            {h.token: h.name for h in self.holders},
            self.profile.seed,
        )
        port = await self.proxy.start()
        for i, holder in enumerate(self.holders):
            self._start_holder(holder, f"http://127.0.0.1:{port}", i)

    def _install_control_crd(self) -> None:
        """The control resource: FencedArtifact's schema under another group, no CEL rule."""
        crd = yaml.safe_load((REPO / "crds" / "fencedartifacts.fencedlease.io.yaml").read_text())
        crd = copy.deepcopy(crd)
        crd["metadata"]["name"] = f"{CONTROL_PLURAL}.{CONTROL_GROUP}"
        crd["spec"]["group"] = CONTROL_GROUP
        crd["spec"]["names"] = {
            "plural": CONTROL_PLURAL,
            "singular": "plainartifact",
            "kind": "PlainArtifact",
            "listKind": "PlainArtifactList",
        }

        def strip(node: Any) -> Any:
            if isinstance(node, dict):
                return {k: strip(v) for k, v in node.items() if k != "x-kubernetes-validations"}
            if isinstance(node, list):
                return [strip(v) for v in node]
            return node

        crd = strip(crd)
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
        self.cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}"
        )

    async def _rbac(self) -> None:
        role = client.V1Role(
            metadata=client.V1ObjectMeta(name="chaos-holder"),
            rules=[
                client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get"]),
                client.V1PolicyRule(
                    api_groups=[GROUP, CONTROL_GROUP],
                    resources=[ARTIFACTS, CONTROL_PLURAL],
                    verbs=["get", "create", "update", "patch"],
                ),
            ],
        )
        await self.rbac.create_namespaced_role(self.namespace, role)
        binding = client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="chaos-holder"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="chaos-holder"
            ),
            subjects=[
                client.RbacV1Subject(
                    kind="Group",
                    name=f"system:serviceaccounts:{self.namespace}",
                    api_group="rbac.authorization.k8s.io",
                )
            ],
        )
        await self.rbac.create_namespaced_role_binding(self.namespace, binding)

    def candidates(self, lease_index: int) -> set[int]:
        """Each lease has three candidate holders: its first choice (the oldest Pod), which is
        no other lease's, and two of the spare holders: every lease starts on its own holder,
        and a fault hands it over to a spare."""
        n, h, k = len(self.profile.leases), self.profile.holders, lease_index
        spares = list(range(n, h)) or list(range(h))
        return {k % h, spares[k % len(spares)], spares[(k + 1) % len(spares)]}

    async def _pods(self) -> None:
        for i in range(self.profile.holders):
            name = f"holder-{i}"
            labels = {"app": APP}
            for k, (lease, _) in enumerate(self.profile.leases):
                if i in self.candidates(k):
                    labels[f"lease-{lease}"] = "yes"
            await self.core.create_namespaced_service_account(
                self.namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
            )
            pod = await self.core.create_namespaced_pod(
                self.namespace,
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name=name, labels=labels),
                    spec=client.V1PodSpec(
                        service_account_name=name,
                        automount_service_account_token=False,
                        containers=[client.V1Container(name="main", image="chaos.invalid/h:1")],
                    ),
                ),
            )
            request = await self.core.create_namespaced_service_account_token(
                name,
                self.namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(
                        audiences=[],
                        expiration_seconds=4 * 3600,
                        bound_object_ref=client.V1BoundObjectReference(
                            kind="Pod", api_version="v1", name=name, uid=pod.metadata.uid
                        ),
                    )
                ),
            )
            self.holders.append(
                HolderProc(
                    name, pod.metadata.uid, request.status.token, self.workdir / f"{name}.jsonl"
                )
            )
            await self.set_ready(name, True)

    async def set_ready(self, pod: str, ready: bool) -> None:
        """The kubelet's part: the Pod is Running, Ready or not."""
        body = {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            }
        }
        for _ in range(5):
            try:
                await self.core.patch_namespaced_pod_status(pod, self.namespace, body)
                return
            except ApiException as exc:
                if exc.status not in (409, 429, 500, 503, 504):
                    raise
                await asyncio.sleep(0.2)

    def _operator_env(self) -> dict[str, str]:
        return {
            "FENCEDLEASE_ETCD_ENDPOINTS": ",".join(self.etcd.endpoints),
            "FENCEDLEASE_LOG_LEVEL": "INFO",
        }

    def _operator(self, name: str, args: list[str]) -> Proc:
        health = free_port()

        def make() -> ManagedProcess:
            return operator_process(
                self.cluster.kubeconfig,
                ",".join(self.etcd.endpoints),
                self.workdir / f"{name}.log",
                ["--health-port", str(health), "--metrics-port", "0", *args],
                env=self._operator_env(),
            )

        return Proc(name, make, health)

    async def _start_operator(self) -> None:
        procs = []
        for i in (1, 2):
            proc = self._operator(
                f"controller-{i}", ["--role", "controller", "--namespace", self.namespace]
            )
            # The election Lease (in the campaign's namespace) names the leader by process.
            proc.make = _with_env(proc.make, FENCEDLEASE_LEADER_ELECTION_IDENTITY=proc.name)
            procs.append(proc)
        self.controllers = procs
        if not self.profile.control:
            port = self.webhook_port = free_port()
            self.webhook_config = f"{self.namespace}.fencedlease.io"
            self.webhook = self._operator(
                "webhook",
                [
                    "--role",
                    "webhook",
                    "--namespace",
                    self.namespace,
                    "--webhook-registration",
                    "url",
                    "--webhook-port",
                    str(port),
                    "--webhook-cert-dir",
                    str(self.workdir / "webhook-pki"),
                ],
            )
            self.webhook.make = _with_env(
                self.webhook.make, FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME=self.webhook_config
            )
            procs = [*procs, self.webhook]
        for proc in procs:
            proc.start()
        for proc in procs:
            await self._wait_ready(proc)

    async def _wait_ready(self, proc: Proc, bound: float = 90.0) -> float:
        start = time.monotonic()
        while not proc.ready():
            assert proc.process is not None
            if not proc.process.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.process.log_tail(60)}")
            if time.monotonic() - start > bound:
                raise RuntimeError(f"{proc.name} not ready:\n{proc.process.log_tail(60)}")
            await asyncio.sleep(0.1)
        return time.time()

    def _start_holder(self, holder: HolderProc, server: str, index: int) -> None:
        token_file = self.workdir / f"{holder.name}.token"
        token_file.write_text(holder.token)
        token_file.chmod(0o600)
        argv = [
            sys.executable,
            "-m",
            "tests.chaos.holder",
            "--name",
            holder.name,
            "--namespace",
            self.namespace,
            "--server",
            server,
            "--token-file",
            str(token_file),
            "--leases",
            ",".join(f"{n}:{p}" for n, p in self.profile.leases),
            "--history",
            str(holder.history),
            "--stage",
            str(self.workdir / "stage" / holder.name),
            "--seed",
            str(self.profile.seed * 100 + index),
            *(["--control"] if self.profile.control else []),
        ]
        log = (self.workdir / f"{holder.name}.log").open("ab")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        holder.process = subprocess.Popen(
            argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    # ================================================================= observing

    async def observe_leases(self) -> None:
        """Every grant the lease statuses show (a watch, resumed from its last version): a
        Grant event per status change while Held, a Vacant event when the status leaves Held
        (what ends a grant's held time: renewals do not write the status)."""
        shown: dict[str, str] = {}  # lease → its last phase recorded

        async def on(obj: dict[str, Any]) -> None:
            status = obj.get("status") or {}
            token, lease_id = status.get("fencingToken"), status.get("leaseId")
            name = obj["metadata"]["name"]
            phase = str(status.get("phase") or "")
            if phase != "Held" or not token or not lease_id:
                if name in shown and shown[name] != phase:
                    self.history.add(Vacant(time.time(), name, phase or "none"))
                shown[name] = phase
                return
            shown[name] = phase
            holder = str(status.get("holder", ""))
            self.current[name] = holder
            self.current_token[name] = int(token)
            self.history.add(Grant(time.time(), name, holder, int(token), str(lease_id)))

        await self._watch(GROUP, LEASES, on)

    async def observe_artifacts(self) -> None:
        """Every state of every artifact (or control object), in the order the watch saw them."""
        group, plural = (
            (CONTROL_GROUP, CONTROL_PLURAL) if self.profile.control else (GROUP, ARTIFACTS)
        )

        async def on(obj: dict[str, Any]) -> None:
            spec = obj.get("spec") or {}
            token = spec.get("fencingToken")
            if not isinstance(token, int):
                return
            lease = str((spec.get("leaseRef") or {}).get("name", ""))
            self.artifact_token[lease] = max(token, self.artifact_token.get(lease, 0))
            self.history.add(
                ArtifactState(
                    time.time(),
                    obj["metadata"]["name"],
                    str((spec.get("leaseRef") or {}).get("name", "")),
                    token,
                    str(spec.get("objectRef", "")),
                )
            )

        await self._watch(group, plural, on)

    async def _watch(
        self, group: str, plural: str, on: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        version: str | None = None
        last_spec: dict[str, str] = {}
        while True:
            try:
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    group,
                    VERSION,
                    self.namespace,
                    plural,
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                async for event in stream:
                    obj = event["object"]
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion", version)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        digest = json.dumps([obj.get("spec"), obj.get("status")], sort_keys=True)
                        if last_spec.get(meta.get("name", "")) == digest:
                            continue
                        last_spec[meta.get("name", "")] = digest
                        await on(obj)
            except ApiException as exc:
                if exc.status == 410:
                    version = None  # expired: relist (states in between are not seen)
                    continue
                await asyncio.sleep(0.2)
            except (TimeoutError, OSError, ValueError):
                await asyncio.sleep(0.2)

    def count_writes(self) -> int:
        for holder in self.holders:
            if not holder.history.exists():
                continue
            with holder.history.open("rb") as f:
                f.seek(self._read_offsets.get(holder.history, 0))
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self._read_offsets[holder.history] = self._read_offsets.get(holder.history, 0) + end
            self.sent += chunk[:end].count(b'"type": "WriteInvoke"')
        return self.sent

    # ================================================================= the nemesis

    def fault(self, kind: str, start: float, end: float, target: str = "") -> None:
        self.history.add(Fault(start, kind, end, target))
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def _free_holder(self, writing: bool = False) -> HolderProc | None:
        """A holder no other fault is acting on; one that holds a lease now (as the last
        status showed) four times in five: pausing or cutting off a Pod that holds nothing
        tests nothing. ``writing``: one that holds an ``AllowEqual`` lease, so it has more
        writes to make under its grant (under ``StrictlyGreater`` a grant allows one)."""
        free = [h for h in self.holders if h.name not in self.busy]
        policies = dict(self.profile.leases)
        names = {
            holder
            for lease, holder in self.current.items()
            if not writing or policies.get(lease) == "AllowEqual"
        }
        holding = [h for h in free if h.name in names]
        # The control exists to show harm: there, every holder fault hits a holder that holds.
        if holding and (self.profile.control or self.rng.random() < 0.8):
            return self.rng.choice(holding)
        return self.rng.choice(free) if free else None

    def kinds(self) -> list[str]:
        kinds = [k for k in self.profile.faults if k in FAULTS]
        if self.profile.control:
            # No webhook, and no authority faults: they are not needed to show harm, and a
            # controller killed during a pause delays the successor's grant past the pause.
            kinds = [k for k in kinds if k in HOLDER_FAULTS]
        return kinds

    async def nemesis(self, stop: asyncio.Event) -> None:
        """Two lanes: faults of holders and the network (several at once, one per holder), and
        faults of the system (controllers, webhook, etcd: one at a time, each followed by a
        healthy gap of ``Profile.system_gap`` lease durations, so recovery is measured and
        grants happen)."""
        kinds = self.kinds()
        lanes = [
            self._lane(stop, [k for k in kinds if k in HOLDER_FAULTS], gap=0.3, parallel=2),
            self._lane(
                stop,
                [k for k in kinds if k not in HOLDER_FAULTS],
                gap=self.profile.system_gap,
                parallel=1,
            ),
        ]
        await asyncio.gather(*lanes)

    async def _lane(self, stop: asyncio.Event, kinds: list[str], gap: float, parallel: int) -> None:
        if not kinds:
            return
        running: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            if len(running) >= parallel:
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                continue
            # The kinds that ran least first, so every kind reaches its count.
            low = min(self.counts.get(k, 0) for k in kinds)
            kind = self.rng.choice([k for k in kinds if self.counts.get(k, 0) == low])
            task = asyncio.create_task(getattr(self, f"_f_{kind}")())
            running.add(task)
            task.add_done_callback(running.discard)
            await asyncio.sleep(self.profile.duration * gap * self.rng.uniform(0.5, 1.5))
            if parallel == 1 and running:
                await asyncio.wait(running)
                await asyncio.sleep(self.profile.duration * gap)
        for task in list(running):
            with contextlib.suppress(Exception):
                await task

    def enough_faults(self) -> bool:
        for kind in self.kinds():
            want = (
                max(1, self.profile.min_faults // 4)
                if kind == "restore"
                else self.profile.min_faults
            )
            if self.counts.get(kind, 0) < want:
                return False
        return True

    async def _exclusive(self, target: str, action: Callable[[], Awaitable[None]]) -> None:
        if target in self.busy:
            return
        self.busy.add(target)
        try:
            await action()
        finally:
            self.busy.discard(target)

    async def _f_pause(self) -> None:
        holder = self._free_holder(writing=True)
        if holder is None or holder.process is None:
            return

        async def act() -> None:
            assert holder.process is not None
            await self._inside_a_job(holder)
            held = {
                lease: self.current_token.get(lease, 0)
                for lease, name in self.current.items()
                if name == holder.name
            }
            start = time.time()
            holder.process.send_signal(signal.SIGSTOP)
            await asyncio.sleep(0.3)  # the readiness probe times out
            await self.set_ready(holder.name, False)
            await asyncio.sleep(self.profile.duration * self.rng.uniform(2.5, 4.0))
            await self._until_superseded(held, bound=self.profile.duration * 4.0)
            holder.process.send_signal(signal.SIGCONT)
            end = time.time()
            await asyncio.sleep(self.rng.uniform(0.3, 1.0))  # it writes with what it held
            await self.set_ready(holder.name, True)
            self.fault("pause", start, end, holder.name)

        await self._exclusive(holder.name, act)

    async def _until_superseded(self, held: dict[str, int], bound: float) -> None:
        """Wait (up to ``bound``) until one of the leases the paused holder held has a newer
        token in its artifact: its successor has written. The pause then ends at the worst
        point of the article's race, with newer work there for the old owner to overwrite
        (whatever the nemesis did to the controllers meanwhile)."""
        deadline = time.monotonic() + bound
        while held and time.monotonic() < deadline:
            if any(self.artifact_token.get(lease, 0) > token for lease, token in held.items()):
                return
            await asyncio.sleep(0.05)

    async def _inside_a_job(self, holder: HolderProc, bound: float = 2.0) -> None:
        """Wait (up to ``bound``) for the holder's next history line: it has just written,
        so it is most likely inside a job, with more writes to make under the grant it read
        at the job's start. A pause there is the GC pause between the read and the write."""
        path = holder.history
        size = path.stat().st_size if path.exists() else 0
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_size > size:
                return
            await asyncio.sleep(0.005)

    async def _f_partition(self) -> None:
        holder = self._free_holder(writing=True)
        if holder is None or self.proxy is None:
            return

        async def act() -> None:
            assert self.proxy is not None
            start = time.time()
            span = self.profile.duration * self.rng.uniform(1.5, 2.0)
            self.proxy.delay(holder.name, span, span)
            await self.set_ready(holder.name, False)
            await asyncio.sleep(span)
            await self.set_ready(holder.name, True)
            await asyncio.sleep(span)  # writes held in the proxy arrive now, late
            self.fault("partition", start, time.time(), holder.name)

        await self._exclusive(holder.name, act)

    async def _f_duplicate(self) -> None:
        holder = self._free_holder()
        if holder is None or self.proxy is None:
            return

        async def act() -> None:
            assert self.proxy is not None
            start = time.time()
            self.proxy.duplicate(holder.name, 3.0)
            await asyncio.sleep(3.0)
            self.fault("duplicate", start, time.time(), holder.name)

        await self._exclusive(holder.name, act)

    async def _f_reorder(self) -> None:
        async def act() -> None:
            assert self.proxy is not None
            start = time.time()
            self.proxy.jitter(0.3, 3.0)
            await asyncio.sleep(3.0)
            self.fault("reorder", start, time.time())

        await self._exclusive("proxy-jitter", act)

    async def _f_ready_flap(self) -> None:
        holder = self._free_holder()
        if holder is None:
            return

        async def act() -> None:
            start = time.time()
            await self.set_ready(holder.name, False)
            await asyncio.sleep(self.profile.duration * self.rng.uniform(1.0, 2.0))
            await self.set_ready(holder.name, True)
            self.fault("ready_flap", start, time.time(), holder.name)

        await self._exclusive(holder.name, act)

    async def _leader(self) -> Proc | None:
        """The controller replica that holds the election Lease now, if one does."""
        try:
            lease = await client.CoordinationV1Api(self.api).read_namespaced_lease(
                "fencedlease-controller", self.namespace
            )
        except (ApiException, OSError):
            return None
        holder = lease.spec.holder_identity if lease.spec else None
        return next((p for p in self.controllers if p.name == holder), None)

    async def _controller(self) -> Proc:
        leader = await self._leader()
        if leader is not None and self.rng.random() < 0.5:
            return leader
        return self.rng.choice(self.controllers)

    async def _f_controller_pause(self) -> None:
        proc = await self._controller()
        if proc.process is None or proc.process.proc is None:
            return

        async def act() -> None:
            assert proc.process is not None and proc.process.proc is not None
            start = time.time()
            proc.process.proc.send_signal(signal.SIGSTOP)
            try:
                # Longer than the election lease (5 s) plus skew: the other replica takes over.
                await asyncio.sleep(self.rng.uniform(7.0, 10.0))
            finally:
                proc.process.proc.send_signal(signal.SIGCONT)
            self.fault("controller_pause", start, time.time(), proc.name)

        await self._exclusive(proc.name, act)

    async def _f_operator_kill(self) -> None:
        proc = await self._controller()

        async def act() -> None:
            start = time.time()
            proc.kill()
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            await self._restart(proc)
            self.fault("operator_kill", start, time.time(), proc.name)

        await self._exclusive(proc.name, act)

    async def _restart(self, proc: Proc) -> None:
        for attempt in range(5):
            proc.start()
            try:
                await self._wait_ready(proc)
                return
            except RuntimeError:
                if attempt == 4:
                    raise
                proc.kill()
                await asyncio.sleep(1.0)

    async def _f_webhook_kill(self) -> None:
        proc = self.webhook
        if proc is None:
            return

        async def act() -> None:
            start = time.time()
            proc.kill()
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            # The window is what was observed: no webhook could be reached from the kill until
            # the last failed connection to its port (not until /readyz answers: the new
            # process decides reviews a moment before its readiness is seen).
            down_until = time.time()
            proc.start()
            while True:
                attempt = time.time()
                try:
                    async with asyncio.timeout(0.5):
                        _, writer = await asyncio.open_connection("127.0.0.1", self.webhook_port)
                except (OSError, TimeoutError):
                    down_until = attempt
                    if proc.process is not None and not proc.process.alive():
                        break
                    await asyncio.sleep(0.02)
                    continue
                writer.close()
                break
            try:
                await self._wait_ready(proc)
            except RuntimeError:
                proc.kill()
                down_until = time.time()
                await self._restart(proc)
            self.fault("webhook_down", start, down_until, proc.name)
            self.counts["webhook_kill"] = self.counts.get("webhook_kill", 0) + 1

        await self._exclusive(proc.name, act)

    async def _f_etcd_kill(self) -> None:
        async def act() -> None:
            leader = await asyncio.to_thread(self.etcd.leader)
            member = (
                leader if leader and self.rng.random() < 0.5 else self.rng.choice(self.etcd.members)
            )
            start = time.time()
            await asyncio.to_thread(self.etcd.kill, member)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            await asyncio.to_thread(self.etcd.restart_all)
            kind = "etcd_leader_kill" if member is leader else "etcd_member_kill"
            self.fault(kind, start, time.time(), member.name)
            self.counts["etcd_kill"] = self.counts.get("etcd_kill", 0) + 1

        await self._exclusive("etcd", act)

    async def _f_etcd_down(self) -> None:
        if self.profile.control:
            return

        async def act() -> None:
            start = time.time()
            await asyncio.to_thread(self.etcd.kill_all)
            await asyncio.sleep(self.rng.uniform(1.0, 3.0))
            await asyncio.to_thread(self.etcd.restart_all)
            self.fault("etcd_down", start, time.time())

        await self._exclusive("etcd", act)

    async def _f_restore(self) -> None:
        if self.profile.control:
            return

        async def act() -> None:
            self.snapshot_seq += 1
            snap = self.workdir / f"snap-{self.snapshot_seq}.db"
            await asyncio.to_thread(self.etcd.snapshot, snap)
            # New generations after the snapshot: its holders lose readiness for a lease
            # duration, so every lease is granted again with tokens the snapshot lacks.
            holders = sorted(set(self.current.values()) - self.busy)
            self.busy.update(holders)
            try:
                for name in holders:
                    await self.set_ready(name, False)
                await asyncio.sleep(self.profile.duration * 1.5)
                for name in holders:
                    await self.set_ready(name, True)
            finally:
                self.busy.difference_update(holders)
            await asyncio.sleep(self.profile.duration)
            start = time.time()
            await asyncio.to_thread(self.etcd.restore, snap, None)
            await asyncio.sleep(self.profile.duration * 2.0)  # grants must stop here
            middle = time.time()
            self.fault("restore_no_bump", start, middle)
            await asyncio.to_thread(self.etcd.restore, snap, 1_000_000)
            self.fault("restore_bump", middle, time.time())
            self.counts["restore"] = self.counts.get("restore", 0) + 1

        await self._exclusive("etcd", act)

    # ================================================================= the run

    async def run(self) -> tuple[History, Report]:
        started = time.monotonic()
        await self.setup()
        self.log(f"  setup {time.monotonic() - started:.0f}s")
        self.log(
            f"campaign {self.profile.name} (seed {self.profile.seed}): {len(self.holders)}"
            f" holders, {len(self.profile.leases)} leases, namespace {self.namespace},"
            f" logs in {self.workdir}"
        )
        observers = [
            asyncio.create_task(self.observe_leases()),
            asyncio.create_task(self.observe_artifacts()),
        ]
        stop = asyncio.Event()
        nemesis = asyncio.create_task(self.nemesis(stop))
        begun = time.monotonic()
        last_report = 0.0
        try:
            while True:
                await asyncio.sleep(0.5)
                sent = self.count_writes()
                elapsed = time.monotonic() - begun
                if elapsed - last_report >= 10:
                    last_report = elapsed
                    self.log(f"  {elapsed:5.0f}s: {sent} writes sent, faults {dict(self.counts)}")
                if sent >= self.profile.writes and self.enough_faults():
                    self.target_met = True
                    break
                if elapsed > self.profile.max_seconds:
                    self.log(f"  time bound {self.profile.max_seconds:.0f}s reached")
                    break
                for proc in [*self.controllers, *([self.webhook] if self.webhook else [])]:
                    if proc.name not in self.busy and proc.process and not proc.process.alive():
                        raise RuntimeError(f"{proc.name} died:\n{proc.process.log_tail(60)}")
            stop.set()
            await nemesis
            await asyncio.sleep(1.0)  # the last answers and watch events
        finally:
            ended = time.monotonic()
            await self.teardown(observers)
            self.log(f"  teardown {time.monotonic() - ended:.0f}s")
        self._merge_holder_histories()
        report = check(self.history)
        self.log(f"campaign {self.profile.name} done in {time.monotonic() - started:.0f}s")
        return self.history, report

    def _merge_holder_histories(self) -> None:
        events = list(self.history.events)
        for holder in self.holders:
            if holder.history.exists():
                events.extend(hist.loads(holder.history.read_text()).events)
        events.sort(key=lambda e: e.t)
        self.history.events = events

    async def teardown(self, observers: list[asyncio.Task[None]]) -> None:
        # Holders first (SIGTERM ends a job between writes; after 3 s all are killed: their
        # histories are flushed line by line, and a write without an answer is a timeout).
        for holder in self.holders:
            if holder.process is not None and holder.process.poll() is None:
                holder.process.send_signal(signal.SIGCONT)
                holder.process.terminate()
        deadline = time.monotonic() + 3.0
        for holder in self.holders:
            if holder.process is not None:
                try:
                    await asyncio.to_thread(
                        holder.process.wait, max(0.0, deadline - time.monotonic())
                    )
                except subprocess.TimeoutExpired:
                    holder.process.kill()
                    await asyncio.to_thread(holder.process.wait)
        for task in observers:
            task.cancel()
        for task in observers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.proxy is not None:
            await self.proxy.stop()
        await asyncio.gather(
            *(
                asyncio.to_thread(proc.process.stop, 10.0)
                for proc in [*self.controllers, *([self.webhook] if self.webhook else [])]
                if proc.process is not None
            )
        )
        if self.webhook is not None:
            self.cluster.kubectl(
                "delete",
                "mutatingwebhookconfiguration",
                self.webhook_config,
                "--ignore-not-found",
                check=False,
            )
        self.etcd.stop()
        await self.api.close()

    def logs(self) -> str:
        """The tails that explain a failure: operator, webhook, etcd, holders."""
        parts = []
        for proc in [*self.controllers, *([self.webhook] if self.webhook else [])]:
            if proc.process is not None:
                parts.append(f"--- {proc.name}\n{proc.process.log_tail(40)}")
        parts.append(self.etcd.log_tails(10))
        return "\n".join(parts)


def _with_env(make: Callable[[], ManagedProcess], **extra: str) -> Callable[[], ManagedProcess]:
    def wrapped() -> ManagedProcess:
        proc = make()
        proc.env = {**(proc.env or {}), **extra}
        return proc

    return wrapped


async def run_campaign(
    profile: Profile, cluster: LocalCluster, workdir: Path, log: Callable[[str], None] = print
) -> tuple[Campaign, History, Report]:
    # A run's histories are appended to: never mix in an earlier run's.
    await asyncio.to_thread(shutil.rmtree, workdir, True)
    await asyncio.to_thread(workdir.mkdir, parents=True)
    campaign = Campaign(profile, cluster, workdir, log=log)
    history, report = await campaign.run()
    await asyncio.to_thread((workdir / "history.jsonl").write_text, hist.dumps(history))
    return campaign, history, report


def main(argv: list[str] | None = None) -> int:
    from tests.chaos.report import write_report

    parser = argparse.ArgumentParser(
        prog="make chaos", description="The fault campaign against the real system."
    )
    parser.add_argument(
        "--profile",
        choices=["short", "full", "control"],
        default="full",
        help="control: only the unfenced control run (the checker must call it unsafe)",
    )
    parser.add_argument("--seed", type=int, help="override the profile's seed")
    parser.add_argument("--out", type=Path, default=REPO / "chaos-report")
    parser.add_argument("--no-control", action="store_true", help="skip the unfenced control run")
    parser.add_argument("--faults", help=f"comma-separated subset of: {', '.join(FAULTS)}")
    parser.add_argument("--writes", type=int, help="override the profile's write target")
    args = parser.parse_args(argv)
    base = PROFILES[args.profile]
    if args.seed is not None:
        base = Profile(**{**base.__dict__, "seed": args.seed})
    if args.faults:
        unknown = set(args.faults.split(",")) - set(FAULTS)
        if unknown:
            parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
        base = Profile(**{**base.__dict__, "faults": tuple(args.faults.split(","))})
    if args.writes:
        base = Profile(**{**base.__dict__, "writes": args.writes})
    runs = [base]
    if not args.no_control and not base.control:
        control = PROFILES["control"]
        runs.append(Profile(**{**control.__dict__, "seed": base.seed}))
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    missed: list[str] = []
    with LocalCluster(args.out / "cluster") as cluster:
        for profile in runs:
            campaign, history, report = asyncio.run(
                run_campaign(profile, cluster, args.out / profile.name)
            )
            results.append((profile, campaign.counts, history, report))
            if not profile.control and not campaign.target_met:
                missed.append(
                    f"{profile.name}: {campaign.count_writes()} writes sent (target"
                    f" {profile.writes}), faults {dict(campaign.counts)} (each kind"
                    f" >= {profile.min_faults}) within {profile.max_seconds:.0f} s"
                )
    md = write_report(results, args.out)
    print(md)
    fenced = [r[3] for r in results if not r[0].control]
    controls = [r[3] for r in results if r[0].control]
    ok = (
        all(r.safe and r.admitted > 0 for r in fenced)
        and all(not r.safe for r in controls)
        and not missed
    )
    for line in missed:
        print(f"target missed: {line}")
    print(f"report: {args.out / 'report.md'}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
