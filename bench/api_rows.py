"""The API-server rows of ``make bench``: what a fenced write costs against the identical plain one.

Started the way the integration tests start them (:class:`fencedlease.local.cluster.LocalCluster`:
etcd + kube-apiserver + the CRDs), plus:

- a CRD ``plainartifacts.bench.fencedlease.io`` with the **same schema** as FencedArtifact and
  no webhook (the baseline write);
- the fence webhook as its **own process** (``fencedlease run`` with ``role=webhook``,
  registered by URL over TLS, the same code path as ``fencedlease local up``), reading the
  lease store on the cluster's etcd; the grant comes from :class:`EtcdStore` (a real token);
- the **null webhook** (``bench/null_webhook.py``) as a third process, registered for a third
  copy of the schema (``nullartifacts.null.fencedlease.io``): served the same way (aiohttp on
  uvloop, the same TLS), it parses each review and allows it, checking nothing. It is the
  floor under any Python fence webhook here: kube-apiserver's call, TLS, HTTP, JSON.

Rows (interleaved in a fresh random order per round, A/B like the store rows):

- **Lease GET + PUT**: a ``coordination.k8s.io`` Lease renewed the client-go way;
- **plain CR PATCH**: a merge patch of ``spec`` (a new ``operationId``) on a PlainArtifact;
- **fenced PATCH**: the identical merge patch on a FencedArtifact, admitted by the webhook
  with the granted token (every write is a fence check: the spec changes);
- **null-webhook PATCH**: the identical merge patch on a NullArtifact, through the null webhook.

Then a throughput phase: ``writers`` concurrent clients, each on its own object, in plain,
fenced and null-webhook windows; writes/s and CPU per write, summed over kube-apiserver, etcd,
both webhooks and this client process (``/proc/<pid>/stat`` utime + stime).

The client is aiohttp with the admin certificate and raw JSON (a keep-alive connection pool),
so the client's own CPU stays small next to the servers'.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import random
import re
import socket
import ssl
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import null_webhook  # bench/null_webhook.py (the script's directory is on sys.path)
import yaml

from fencedlease.authority.types import Acquired
from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port, operator_process
from fencedlease.models import ARTIFACT_FINALIZER, ARTIFACTS, GROUP, LEASES, VERSION
from fencedlease.registration.selfregistration import WEBHOOK_NAME, desired_configuration
from fencedlease.settings import Settings
from fencedlease.store.etcd import EtcdStore

PLAIN_GROUP = "bench.fencedlease.io"
PLAIN = "plainartifacts"
NULL_GROUP = "null.fencedlease.io"
NULL = "nullartifacts"
NULL_CONFIGURATION = "fencedlease-bench-null"
KINDS = ("plain", "fenced", "null")
"""The three writes: no webhook, the fence webhook, the null webhook."""
_TARGETS = {
    "plain": (PLAIN_GROUP, PLAIN, "PlainArtifact"),
    "fenced": (GROUP, ARTIFACTS, "FencedArtifact"),
    "null": (NULL_GROUP, NULL, "NullArtifact"),
}
NAMESPACE = "bench"
LEASE = "bench-lease"
PREFIX = "/fencedlease-bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def plain_crd(source: Path, kind: str = "plain") -> dict[str, Any]:
    """FencedArtifact's CRD under another group and kind: the same schema, no fence webhook
    (``kind``: ``plain`` or ``null``, see :data:`KINDS`)."""
    group, plural, name = _TARGETS[kind]
    crd: dict[str, Any] = yaml.safe_load(source.read_text())
    crd = copy.deepcopy(crd)
    crd["metadata"] = {"name": f"{plural}.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"] = {
        "kind": name,
        "listKind": f"{name}List",
        "plural": plural,
        "singular": name.lower(),
    }
    return crd


def null_configuration(port: int, ca_bundle: str) -> dict[str, Any]:
    """The null webhook's registration: the fence webhook's (``desired_configuration``: the
    same failure policy, side effects, timeout and selectors), for NullArtifacts."""
    settings = Settings(webhook_configuration_name=NULL_CONFIGURATION)
    config = desired_configuration(settings, port, ca_bundle, namespace_selector={})
    webhook = config["webhooks"][0]  # the fence's (releases and claims are not timed)
    config["webhooks"] = [webhook]
    webhook["name"] = "null.fencedlease.io"
    webhook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{null_webhook.PATH}"
    (rule,) = webhook["rules"]
    rule["apiGroups"] = [NULL_GROUP]
    rule["resources"] = [NULL, f"{NULL}/status"]
    return config


class Api:
    """A lean kube-apiserver client: aiohttp, admin client certificate, raw JSON."""

    def __init__(self, url: str, context: ssl.SSLContext, pool: int) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=pool, limit_per_host=pool),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self.session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201),
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``headers``: more request headers (impersonation: ``bench/status_rows.py``)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json", **(headers or {})}
        async with self.session.request(
            method, self.url + path, data=data, headers=headers
        ) as resp:
            raw = await resp.read()
            if resp.status not in ok:
                raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
            reply: dict[str, Any] = json.loads(raw) if raw else {}
            return reply


def _artifact_path(group: str, plural: str, name: str = "") -> str:
    tail = f"/{name}" if name else ""
    return f"/apis/{group}/{VERSION}/namespaces/{NAMESPACE}/{plural}{tail}"


@dataclass
class ApiBench:
    """The started control plane, webhook process and objects the API rows use."""

    cluster: LocalCluster
    webhook: ManagedProcess
    null: ManagedProcess
    store: EtcdStore
    api: Api
    token: int
    writers: int

    @property
    def processes(self) -> dict[str, int]:
        cluster = self.cluster
        assert cluster.etcd is not None and cluster.apiserver is not None
        procs = {
            "kube-apiserver": cluster.apiserver.process,
            "etcd": cluster.etcd.process,
            "webhook": self.webhook,
            "null webhook": self.null,
        }
        pids = {}
        for name, proc in procs.items():
            assert proc is not None and proc.proc is not None
            pids[name] = proc.proc.pid
        pids["client"] = os.getpid()
        return pids

    async def stop(self) -> None:
        await self.api.close()
        await self.store.close()
        self.null.stop()
        self.webhook.stop()
        self.cluster.stop()

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.processes.items()}

    async def patch(self, kind: str, name: str, i: int | str) -> None:
        """Merge-patch ``spec.operationId`` of ``kind``'s object ``name`` (see :data:`KINDS`)."""
        group, plural, _ = _TARGETS[kind]
        spec = {"operationId": i if isinstance(i, str) else f"op-{i}"}
        await self.api.call(
            "PATCH",
            _artifact_path(group, plural, name),
            {"spec": spec},
            content_type="application/merge-patch+json",
        )

    async def lease_renew(self, i: int) -> None:
        """client-go's leader election: GET the Lease, PUT it back with a new renewTime."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/bench-election"
        lease = await self.api.call("GET", path)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease["spec"]["renewTime"] = now
        lease["spec"]["holderIdentity"] = "bench-client"
        await self.api.call("PUT", path, lease)


def _artifact(group: str, kind: str, name: str, token: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "leaseRef": {"name": LEASE},
            "fencingToken": token,
            "objectRef": f"reports/{name}.tmp",
            "operationId": "op-create",
        },
    }


async def start(
    state: Path,
    writers: int,
    say: Callable[[str], None],
    webhook_env: Mapping[str, str] | None = None,
) -> ApiBench:
    """Start everything; create the objects (``writers`` of each kind, plus one for latency).

    ``webhook_env``: more environment for the webhook process (``bench/webhook_tail.py``'s
    probe)."""
    cluster = LocalCluster(state / "cluster")
    cluster.start(progress=say)
    crd = state / "plain-crd.yaml"
    assert cluster.crds_dir is not None
    crd.write_text(
        yaml.safe_dump_all(
            plain_crd(cluster.crds_dir / "fencedartifacts.fencedlease.io.yaml", kind)
            for kind in ("plain", "null")
        )
    )
    cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(crd))
    cluster.kubectl("create", "namespace", NAMESPACE)
    webhook_port = free_port()
    webhook = operator_process(
        cluster.kubeconfig,
        cluster.etcd_endpoint,
        state / "webhook.log",
        env={
            "FENCEDLEASE_ROLE": "webhook",
            "FENCEDLEASE_WEBHOOK_REGISTRATION": "url",
            "FENCEDLEASE_WEBHOOK_HOST": "127.0.0.1",
            "FENCEDLEASE_WEBHOOK_PORT": str(webhook_port),
            "FENCEDLEASE_WEBHOOK_CERT_DIR": str(state / "webhook-tls"),
            "FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME": "fencedlease-bench",
            "FENCEDLEASE_ETCD_PREFIX": PREFIX,
            "FENCEDLEASE_ALLOWED_WRITERS": "admin",
            "FENCEDLEASE_METRICS_PORT": str(free_port()),
            "FENCEDLEASE_HEALTH_PORT": "0",
            "FENCEDLEASE_LEADER_ELECTION": "false",
            **(webhook_env or {}),
        },
    )
    say(f"starting the webhook process on 127.0.0.1:{webhook_port}")
    webhook.start()
    for _ in range(300):  # registered by URL once it serves
        found = cluster.kubectl(
            "get", "mutatingwebhookconfiguration", "fencedlease-bench", check=False
        )
        if found.returncode == 0:
            break
        if not webhook.alive():
            raise RuntimeError("webhook died:\n" + webhook.log_tail())
        await asyncio.sleep(0.2)
    null = _start_null(cluster, state, say)
    store = EtcdStore([cluster.etcd_endpoint], prefix=PREFIX, timeout=10)
    await store.connect()
    got = await store.acquire(NAMESPACE, LEASE, "bench-pod", 86400, holder_uid="uid-bench")
    assert isinstance(got, Acquired), got
    apiserver = cluster.apiserver
    assert apiserver is not None
    api = Api(apiserver.url, apiserver.ssl_context(), writers + 4)
    bench = ApiBench(cluster, webhook, null, store, api, got.token, writers)
    try:
        await _objects(bench)
    except BaseException:
        await bench.stop()
        raise
    return bench


def _start_null(cluster: LocalCluster, state: Path, say: Callable[[str], None]) -> ManagedProcess:
    """Start the null webhook on the fence webhook's certificate and register it."""
    certs = state / "webhook-tls"  # written by the fence webhook before it registered
    port = free_port()
    null = ManagedProcess(
        "null-webhook",
        [
            sys.executable,
            str(Path(__file__).with_name("null_webhook.py")),
            "--port",
            str(port),
            "--cert-dir",
            str(certs),
        ],
        state / "null-webhook.log",
    )
    say(f"starting the null webhook on 127.0.0.1:{port}")
    null.start()
    deadline = time.monotonic() + 60
    while True:  # registered once it listens (a call before would fail the write)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if not null.alive() or time.monotonic() > deadline:
                null.stop()
                raise RuntimeError("null webhook did not start:\n" + null.log_tail()) from None
            time.sleep(0.1)
    bundle = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
    config = state / "null-webhook.yaml"
    config.write_text(yaml.safe_dump(null_configuration(port, bundle)))
    cluster.kubectl("apply", "-f", str(config))
    return null


async def _objects(bench: ApiBench) -> None:
    api = bench.api
    await api.call(
        "POST",
        f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{LEASES}",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FencedLease",
            "metadata": {"name": LEASE, "namespace": NAMESPACE},
            "spec": {
                "leaseDurationSeconds": 30,
                "fencingPolicy": "AllowEqual",
                "holderSelector": {"matchLabels": {"app": "bench"}},
            },
        },
    )
    await api.call(
        "POST",
        f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "bench-election", "namespace": NAMESPACE},
            "spec": {"holderIdentity": "bench-client", "leaseDurationSeconds": 15},
        },
    )
    names = ["latency", *(f"w{i}" for i in range(bench.writers))]
    deadline = time.monotonic() + 60
    for name in names:
        for kind in ("plain", "null"):
            group, plural, kind_name = _TARGETS[kind]
            await api.call(
                "POST",
                _artifact_path(group, plural),
                _artifact(group, kind_name, name, bench.token),
            )
        while True:  # the webhook registers itself shortly after it starts
            try:
                created = await api.call(
                    "POST",
                    _artifact_path(GROUP, ARTIFACTS),
                    _artifact(GROUP, "FencedArtifact", name, bench.token),
                )
                break
            except (RuntimeError, aiohttp.ClientError):
                if not bench.webhook.alive():
                    raise RuntimeError("webhook died:\n" + bench.webhook.log_tail()) from None
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        if ARTIFACT_FINALIZER not in created["metadata"].get("finalizers", []):
            raise RuntimeError(f"{name} was written before the webhook was registered")
    while True:  # the null webhook's registration reaches kube-apiserver's informer
        try:
            await bench.patch("null", "latency", null_webhook.PROBE)
        except RuntimeError as error:
            if "null webhook: probe denied" in str(error):
                break
            raise
        if not bench.null.alive():
            raise RuntimeError("null webhook died:\n" + bench.null.log_tail())
        if time.monotonic() > deadline:
            raise RuntimeError("kube-apiserver never called the null webhook")
        await asyncio.sleep(0.2)


# ------------------------------------------------------------------------ the latency rows

LEASE_ROW = "coordination.k8s.io Lease GET + PUT (client-go)"
PLAIN_ROW = "plain CR PATCH (same schema, no webhook)"
FENCED_ROW = "fenced FencedArtifact PATCH (webhook, real token)"
NULL_ROW = "null-webhook PATCH (parses the review, checks nothing)"


def latency_ops(bench: ApiBench) -> list[tuple[str, Callable[[int], Awaitable[object]], str]]:
    async def lease(i: int) -> object:
        await bench.lease_renew(i)
        return None

    async def plain(i: int) -> object:
        await bench.patch("plain", "latency", i)
        return None

    async def fenced(i: int) -> object:
        await bench.patch("fenced", "latency", i)
        return None

    async def null(i: int) -> object:
        await bench.patch("null", "latency", i)
        return None

    return [
        (LEASE_ROW, lease, "GET + PUT of a `coordination.k8s.io/v1` Lease, as client-go renews"),
        (PLAIN_ROW, plain, "merge patch of `spec.operationId` on a PlainArtifact"),
        (
            FENCED_ROW,
            fenced,
            "the identical merge patch on a FencedArtifact: the API server calls the webhook "
            "(TLS), which looks up the lease's policy and checks the token in etcd",
        ),
        (
            NULL_ROW,
            null,
            "the identical merge patch on a NullArtifact: the API server calls the null "
            "webhook (`bench/null_webhook.py`, served like the fence webhook), which allows "
            "it unchecked; the floor under any Python webhook here",
        ),
    ]


# ---------------------------------------------------------------------- the throughput rows


@dataclass
class Window:
    kind: str
    """One of :data:`KINDS`."""
    seconds: float
    writes: int
    cpu: dict[str, float]
    webhook: WebhookTimes | None = None
    """Both sides' webhook histograms over the measured part of a fenced window only (not its
    ramp): ``webhook.call.count / writes`` is how many times kube-apiserver called the
    webhook per fenced write."""

    @property
    def rate(self) -> float:
        return self.writes / self.seconds


async def window(
    bench: ApiBench, kind: str, seconds: float, seq: list[int], profile: Path | None = None
) -> Window:
    """``bench.writers`` clients write as fast as they can for ``seconds``; each its own
    object (no conflicts: every write is one admission and one etcd write).

    ``profile``: also record the webhook process with py-spy during a fenced window
    (collapsed stacks, ``py-spy record --format raw``) into that file."""
    stop_at = [0.0]
    count = [0]

    async def writer(w: int) -> None:
        while time.perf_counter() < stop_at[0]:
            seq[0] += 1
            await bench.patch(kind, f"w{w}", seq[0])
            count[0] += 1

    # Ramp: a short unmeasured burst so every connection of the pool is open.
    stop_at[0] = time.perf_counter() + 0.5
    await asyncio.gather(*(writer(w) for w in range(bench.writers)))
    count[0] = 0
    fenced = kind == "fenced"
    # Read outside the CPU window and the profile (kube-apiserver's /metrics is large).
    times = await webhook_times(bench) if fenced else None
    spy = None
    if profile is not None and fenced:
        spy = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--nonblocking",
            "--rate",
            "250",
            "--format",
            "raw",
            "--duration",
            str(max(1, int(seconds))),
            "--pid",
            str(bench.processes["webhook"]),
            "--output",
            str(profile),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    before, t0 = bench.cpu(), time.perf_counter()
    stop_at[0] = t0 + seconds
    await asyncio.gather(*(writer(w) for w in range(bench.writers)))
    took = time.perf_counter() - t0
    after = bench.cpu()
    if spy is not None:
        await spy.wait()
    seen = (await webhook_times(bench)).since(times) if times is not None else None
    return Window(kind, took, count[0], {k: after[k] - before[k] for k in before}, seen)


async def throughput(
    bench: ApiBench, windows: int, seconds: float, seed: int, profile: Path | None = None
) -> dict[str, list[Window]]:
    """``windows`` windows of each of :data:`KINDS`, in a random order per round."""
    rng = random.Random(seed)
    seq = [10_000_000]
    done: dict[str, list[Window]] = {kind: [] for kind in KINDS}
    for _ in range(windows):
        order = list(KINDS)
        rng.shuffle(order)
        for kind in order:
            done[kind].append(await window(bench, kind, seconds, seq, profile))
            profile = None if kind == "fenced" else profile  # one fenced window is enough
    return done


def summed(windows: list[Window]) -> tuple[float, int, dict[str, float]]:
    seconds = sum(w.seconds for w in windows)
    writes = sum(w.writes for w in windows)
    cpu: dict[str, float] = {}
    for w in windows:
        for k, v in w.cpu.items():
            cpu[k] = cpu.get(k, 0.0) + v
    return seconds, writes, cpu


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over the series that matched: count, sum (seconds) and
    the cumulative bucket counts by upper bound."""

    count: float
    total: float
    buckets: dict[float, float]

    def since(self, earlier: Histogram) -> Histogram:
        return Histogram(
            self.count - earlier.count,
            self.total - earlier.total,
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
        )

    def plus(self, other: Histogram) -> Histogram:
        bounds = self.buckets.keys() | other.buckets.keys()
        return Histogram(
            self.count + other.count,
            self.total + other.total,
            {le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0) for le in bounds},
        )

    @property
    def mean_ms(self) -> float:
        return self.total / self.count * 1e3 if self.count else 0.0

    def over(self, seconds: float) -> float:
        """The share of observations above ``seconds`` (a bucket bound of both histograms)."""
        if not self.count:
            return 0.0
        return 1.0 - self.buckets.get(seconds, self.count) / self.count


_SAMPLE = re.compile(r"^(?P<name>[a-z_:]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def histogram(text: str, metric: str, **labels: str) -> Histogram:
    """Histogram ``metric`` in exposition ``text``, summed over its series whose labels include
    ``labels``."""
    count = total = 0.0
    buckets: dict[float, float] = {}
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match["name"].startswith(metric):
            continue
        found = match["labels"] or ""
        if not all(w in found.split(",") for w in wanted):
            continue
        value = float(match["value"])
        suffix = match["name"][len(metric) :]
        if suffix == "_count":
            count += value
        elif suffix == "_sum":
            total += value
        elif suffix == "_bucket":
            le = re.search(r'le="([^"]+)"', found)
            if le is not None:
                bound = float(le.group(1))
                buckets[bound] = buckets.get(bound, 0.0) + value
    return Histogram(count, total, buckets)


@dataclass(frozen=True)
class WebhookTimes:
    """Where a fenced write's webhook call spends its time, from both sides' histograms:
    ``call`` is kube-apiserver's (``apiserver_admission_webhook_admission_duration_seconds``:
    encoding, TLS, HTTP, the webhook, decoding), ``handler`` the webhook's own
    (``fencedlease_admission_latency_seconds``: from the parsed body to the reply) and
    ``read`` its etcd read (``fencedlease_store_latency_seconds{operation="fence"}``)."""

    call: Histogram
    handler: Histogram
    read: Histogram

    def since(self, earlier: WebhookTimes) -> WebhookTimes:
        return WebhookTimes(
            self.call.since(earlier.call),
            self.handler.since(earlier.handler),
            self.read.since(earlier.read),
        )

    def plus(self, other: WebhookTimes) -> WebhookTimes:
        return WebhookTimes(
            self.call.plus(other.call),
            self.handler.plus(other.handler),
            self.read.plus(other.read),
        )

    def summary(self) -> str:
        return (
            f"kube-apiserver's webhook call {self.call.mean_ms:.3f} ms mean "
            f"({self.call.over(0.005):.1%} over 5 ms, {self.call.over(0.025):.1%} over 25 ms, "
            f"n {self.call.count:.0f}); the webhook's handler {self.handler.mean_ms:.3f} ms "
            f"({self.handler.over(0.005):.1%} over 5 ms, {self.handler.over(0.025):.1%} over "
            f"25 ms); its etcd read {self.read.mean_ms:.3f} ms (n {self.read.count:.0f})"
        )


def fence_calls(apiserver: str) -> Histogram:
    """kube-apiserver's calls of the fence webhook for updates, in its ``/metrics`` text (not
    the null webhook's, which the same histogram counts under its own name)."""
    return histogram(
        apiserver,
        "apiserver_admission_webhook_admission_duration_seconds",
        name=WEBHOOK_NAME,
        operation="UPDATE",
        type="admit",
    )


async def webhook_times(bench: ApiBench) -> WebhookTimes:
    """Both sides' histograms of the webhook's ``update`` reviews now (cumulative)."""
    async with bench.api.session.get(bench.api.url + "/metrics") as resp:
        apiserver = await resp.text()
    ours = await asyncio.to_thread(_read_text, metrics_url(bench))
    return WebhookTimes(
        fence_calls(apiserver),
        histogram(ours, "fencedlease_admission_latency_seconds", operation="update"),
        histogram(ours, "fencedlease_store_latency_seconds", operation="fence"),
    )


def _read_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text: str = resp.read().decode()
    return text


def metrics_url(bench: ApiBench) -> str:
    env = bench.webhook.env or {}
    return f"http://127.0.0.1:{env['FENCEDLEASE_METRICS_PORT']}/metrics"
