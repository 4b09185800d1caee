"""The fenced-object rows of ``make bench`` (docs/fenced-objects.md): the identical write to a
fenced ConfigMap and to an unlabelled one, with the null-webhook floor.

Run by ``bench/run.py`` on the API rows' control plane (:mod:`api_rows`): the fence webhook
process registers the object webhook of a FencePolicy declaring ConfigMaps (the local-mode
path), and the null webhook is registered a second time for ConfigMaps labelled
``bench.fencedlease.io/null`` (the same failure policy, side effects and timeout). Three sets of
ConfigMaps in the bench namespace, each written with the same merge patch (``data`` and the
token annotation):

- **plain**: unlabelled — never sent to any webhook (the object selector);
- **fenced**: labelled ``fencedlease.io/lease`` — every write is a fence check;
- **null**: labelled for the null webhook — kube-apiserver's call and a Python TLS/HTTP server,
  checking nothing: the floor under the fenced row.

Latency: p50/p99 of single writes, the three interleaved in a random order per round.
Throughput: ``writers`` concurrent clients, each on its own object, in windows of each kind in
a random order per round; writes/s and CPU per write summed over kube-apiserver, etcd, both
webhooks and this process.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import api_rows as api  # bench/api_rows.py (the script's directory is on sys.path)
import null_webhook  # bench/null_webhook.py
from benchlib import Percentiles  # bench/benchlib.py

from fencedlease.models import GROUP, OBJECT_LEASE_LABEL, OBJECT_TOKEN_ANNOTATION, VERSION

KINDS = ("plain", "fenced", "null")
POLICY = "bench-configmaps"
NULL_LABEL = "bench.fencedlease.io/null"
NULL_CM_CONFIGURATION = "fencedlease-bench-null-configmaps"
ROWS = {
    "plain": "plain ConfigMap PATCH (unlabelled: no webhook)",
    "fenced": "fenced ConfigMap PATCH (object webhook, real token)",
    "null": "null-webhook ConfigMap PATCH (checks nothing)",
}


def _path(name: str = "") -> str:
    tail = f"/{name}" if name else ""
    return f"/api/v1/namespaces/{api.NAMESPACE}/configmaps{tail}"


def _labels(kind: str) -> dict[str, str]:
    if kind == "fenced":
        return {OBJECT_LEASE_LABEL: api.LEASE}
    if kind == "null":
        return {NULL_LABEL: "true"}
    return {}


async def patch(bench: api.ApiBench, kind: str, name: str, i: int | str) -> None:
    """The identical merge patch for every kind: new data, the token annotation."""
    body = {
        "metadata": {"annotations": {OBJECT_TOKEN_ANNOTATION: str(bench.token)}},
        "data": {"v": str(i)},
    }
    await bench.api.call(
        "PATCH", _path(f"cm-{kind}-{name}"), body, content_type="application/merge-patch+json"
    )


async def prepare(bench: api.ApiBench, deadline_s: float = 60.0) -> None:
    """Declare ConfigMaps fenceable, register the null webhook for its label, create the
    objects; returns once both webhooks are seen to be called."""
    await declare(bench, POLICY, "", "configmaps")
    await register_null(
        bench, NULL_CM_CONFIGURATION, "null-configmaps.fencedlease.io", "", ["configmaps"]
    )
    deadline = time.monotonic() + deadline_s
    await _until_called(bench, "fenced", {}, "invalid", deadline)
    await _until_called(bench, "null", {"probe": null_webhook.PROBE}, "probe denied", deadline)
    for name in ["latency", *(f"w{i}" for i in range(bench.writers))]:
        for kind in KINDS:
            await bench.api.call("POST", _path(), _configmap(bench, kind, name))


async def declare(bench: api.ApiBench, policy: str, api_group: str, resource: str) -> None:
    """A FencePolicy ``policy`` declaring ``resource`` of ``api_group`` fenceable."""
    await bench.api.call(
        "POST",
        f"/apis/{GROUP}/{VERSION}/fencepolicies",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "FencePolicy",
            "metadata": {"name": policy},
            "spec": {"resources": [{"apiGroup": api_group, "resources": [resource]}]},
        },
    )


async def register_null(
    bench: api.ApiBench, configuration: str, hook_name: str, api_group: str, resources: list[str]
) -> None:
    """The null webhook registered a second time, as ``configuration``: for CREATE and UPDATE
    of ``resources`` of ``api_group`` labelled :data:`NULL_LABEL` (the same failure policy,
    side effects and timeout)."""
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    null = await bench.api.call("GET", f"{path}/{api.NULL_CONFIGURATION}")
    (hook,) = null["webhooks"]
    hook = copy.deepcopy(hook)
    hook["name"] = hook_name
    hook["rules"] = [
        {
            "apiGroups": [api_group],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": resources,
            "scope": "Namespaced",
        }
    ]
    hook["objectSelector"] = {"matchLabels": {NULL_LABEL: "true"}}
    await bench.api.call(
        "POST",
        path,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": configuration},
            "webhooks": [hook],
        },
    )


def _configmap(
    bench: api.ApiBench, kind: str, name: str, data: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"cm-{kind}-{name}",
            "namespace": api.NAMESPACE,
            "labels": _labels(kind),
            "annotations": {OBJECT_TOKEN_ANNOTATION: str(bench.token)},
        },
        "data": data if data is not None else {"v": "0"},
    }


async def _until_called(
    bench: api.ApiBench, kind: str, data: dict[str, str], refusal: str, deadline: float
) -> None:
    """Create (dry run) a probe the webhook refuses (a fenced object without its token; the
    null webhook's probe) until it is refused: the API server calls that webhook now."""
    body = _configmap(bench, kind, "probe", data)
    if kind == "fenced":
        body["metadata"]["annotations"] = {}

    async def probe() -> None:
        await bench.api.call("POST", _path() + "?dryRun=All", body)  # nothing stored

    await until_refused(probe, refusal, deadline, f"the {kind} webhook for ConfigMaps")


async def until_refused(
    probe: Callable[[], Awaitable[Any]], refusal: str, deadline: float, what: str
) -> None:
    """``probe()`` (a dry-run write) again until it fails with ``refusal``: the API server
    calls ``what`` now; another error is raised, and so is the ``deadline`` passing."""
    while True:
        try:
            await probe()
        except RuntimeError as error:
            if refusal in str(error):
                return
            raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"kube-apiserver never called {what}")
        await asyncio.sleep(0.2)


@dataclass
class Measured(Percentiles):
    """Latency samples and throughput windows of one kind."""

    samples: list[float] = field(default_factory=list)
    windows: list[api.Window] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return sum(w.writes for w in self.windows) / sum(w.seconds for w in self.windows)

    @property
    def cpu_ms(self) -> float:
        cpu = sum(sum(w.cpu.values()) for w in self.windows)
        return cpu / sum(w.writes for w in self.windows) * 1e3


Write = Callable[[api.ApiBench, str, str, int], Awaitable[None]]
"""``write(bench, kind, name, i)``: one write of ``kind``'s object ``name``."""


async def window(
    bench: api.ApiBench, kind: str, seconds: float, seq: list[int], write: Write | None = None
) -> api.Window:
    """``bench.writers`` clients write as fast as they can, each its own object
    (``write``: :func:`patch` unless told)."""
    write = write or patch
    stop_at = [time.perf_counter() + 0.5]  # ramp (unmeasured): every connection open
    count = [0]

    async def writer(w: int) -> None:
        while time.perf_counter() < stop_at[0]:
            seq[0] += 1
            await write(bench, kind, f"w{w}", seq[0])
            count[0] += 1

    await asyncio.gather(*(writer(w) for w in range(bench.writers)))
    count[0] = 0
    before, t0 = bench.cpu(), time.perf_counter()
    stop_at[0] = t0 + seconds
    await asyncio.gather(*(writer(w) for w in range(bench.writers)))
    took, after = time.perf_counter() - t0, bench.cpu()
    return api.Window(kind, took, count[0], {k: after[k] - before[k] for k in before})


async def measure(
    bench: api.ApiBench, rounds: int, warmup: int, windows: int, seconds: float, seed: int
) -> dict[str, Measured]:
    await prepare(bench)
    return await rounds_of(bench, patch, rounds, warmup, windows, seconds, seed)


async def rounds_of(
    bench: api.ApiBench,
    write: Write,
    rounds: int,
    warmup: int,
    windows: int,
    seconds: float,
    seed: int,
    first: int = 0,
) -> dict[str, Measured]:
    """Each of :data:`KINDS` measured with ``write``: ``warmup + rounds`` latency rounds (the
    write ``first + i`` of each ``latency`` object, the kinds in a random order per round),
    then ``windows`` throughput :func:`window` s of each kind, again in a random order."""
    rng = random.Random(seed)
    found = {kind: Measured() for kind in KINDS}
    order = list(KINDS)
    for i in range(warmup + rounds):
        rng.shuffle(order)
        for kind in order:
            t0 = time.perf_counter()
            await write(bench, kind, "latency", first + i)
            if i >= warmup:
                found[kind].samples.append(time.perf_counter() - t0)
    seq = [20_000_000]
    for _ in range(windows):
        rng.shuffle(order)
        for kind in order:
            found[kind].windows.append(await window(bench, kind, seconds, seq, write))
    return found


HEADER = (
    "what",
    "p50 ms",
    "p99 ms",
    "p50 / plain",
    "p99 / plain",
    "writes/s",
    "vs plain",
    "CPU ms / write",
)


def table(found: dict[str, Measured], rows: dict[str, str] | None = None) -> list[tuple[str, ...]]:
    plain = found["plain"]
    return [
        (
            (rows or ROWS)[kind],
            f"{m.p50 * 1e3:.2f}",
            f"{m.p(0.99) * 1e3:.2f}",
            f"{m.p50 / plain.p50:.2f}x",
            f"{m.p(0.99) / plain.p(0.99):.2f}x",
            f"{m.rate:.0f}",
            f"{m.rate / plain.rate:.2f}x",
            f"{m.cpu_ms:.2f}",
        )
        for kind, m in found.items()
    ]


def markdown(found: dict[str, Measured], writers: int, rounds: int, windows: int) -> list[str]:
    return report(
        found,
        "### Fenced objects: a ConfigMap write through the object webhook",
        f"{rounds} latency rounds interleaved in random order; throughput: {windows} windows of "
        f"each kind, {writers} writers, each on its own ConfigMap (writes/s and CPU summed over "
        "kube-apiserver, etcd, both webhooks and the client).",
        "The fence's own share",
    )


def report(
    found: dict[str, Measured],
    heading: str,
    how: str,
    share: str,
    rows: dict[str, str] | None = None,
) -> list[str]:
    """The markdown of a set of rows: ``heading``, how they were measured, the
    :func:`table` and ``share``'s cost above the null-webhook floor."""
    fenced, null, plain = found["fenced"], found["null"], found["plain"]
    return [
        "",
        heading,
        "",
        how,
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
        *("| " + " | ".join(cells) + " |" for cells in table(found, rows)),
        "",
        f"{share} above the null-webhook floor: p50 "
        f"{(fenced.p50 - null.p50) * 1e3:+.2f} ms, writes/s {fenced.rate / null.rate:.2f}x of "
        f"the floor; the floor itself costs {(null.p50 - plain.p50) * 1e3:+.2f} ms p50 and "
        f"{null.rate / plain.rate:.2f}x the plain writes/s.",
    ]
