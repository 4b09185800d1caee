"""The status rows of ``make bench`` (issue 43, docs/fenced-objects.md "Status writes"): the
identical status PATCH of a Deployment, fenced and not, with the null-webhook floor.

Run by ``bench/run.py`` on the API rows' control plane (:mod:`api_rows`), after the ConfigMap
rows (:mod:`object_rows`); alone: ``.venv/bin/python bench/status_rows.py``. A FencePolicy
declares Deployments, so the webhook process registers ``deployments/status`` in its object
webhook (the local-mode path); the null webhook is registered a second time for
``deployments/status`` of Deployments labelled ``bench.fencedlease.io/null``. Three sets of
Deployments (no controller-manager runs: nothing else writes them), each written with the same
status merge patch (``status.observedGeneration``), **by the lease holder's Pod** (the
identity the webhook decides a status write by: impersonated with its Pod-bound extras, in all
three rows alike, so the API server's impersonation cost is in the baseline too):

- **plain**: unlabelled — never sent to any webhook (the object selector);
- **fenced**: labelled ``fencedlease.io/lease`` — the status check: the lease's policy (the
  webhook's cache), its current grant and the stored token's in one etcd read;
- **null**: labelled for the null webhook — the floor (a webhook call checking nothing).

Latency: p50/p99 of single writes, the three interleaved in a random order per round, ratios
against the plain status PATCH of the same run. Throughput: ``writers`` concurrent clients,
each on its own Deployment, windows of each kind in a random order per round.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import api_rows as api  # bench/api_rows.py (the script's directory is on sys.path)
import null_webhook  # bench/null_webhook.py
import object_rows  # bench/object_rows.py
from object_rows import Measured

from fencedlease.models import OBJECT_LEASE_LABEL, OBJECT_TOKEN_ANNOTATION

KINDS = object_rows.KINDS
POLICY = "bench-deployments"
NULL_LABEL = object_rows.NULL_LABEL
NULL_CONFIGURATION = "fencedlease-bench-null-deployments"
ROWS = {
    "plain": "plain Deployment status PATCH (unlabelled: no webhook)",
    "fenced": "fenced Deployment status PATCH (the holder's Pod: status check)",
    "null": "null-webhook Deployment status PATCH (checks nothing)",
}
_EXTRA = "Impersonate-Extra-authentication.kubernetes.io%2F"


def as_pod(pod: str, uid: str) -> dict[str, str]:
    """Impersonation headers: Pod ``pod`` of the bench namespace (its Pod-bound extras)."""
    return {
        "Impersonate-User": f"system:serviceaccount:{api.NAMESPACE}:bench",
        "Impersonate-Group": "system:masters",  # RBAC lets the write reach admission
        _EXTRA + "pod-name": pod,
        _EXTRA + "pod-uid": uid,
    }


HOLDER = as_pod("bench-pod", "uid-bench")
"""The Pod the bench's grant was issued to (``api_rows.start``)."""


def _path(name: str = "") -> str:
    tail = f"/{name}" if name else ""
    return f"/apis/apps/v1/namespaces/{api.NAMESPACE}/deployments{tail}"


def _deployment(bench: api.ApiBench, kind: str, name: str) -> dict[str, Any]:
    labels = {"plain": {}, "fenced": {OBJECT_LEASE_LABEL: api.LEASE}, "null": {NULL_LABEL: "true"}}
    pods = {"app": f"bench-{kind}-{name}"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"dep-{kind}-{name}",
            "namespace": api.NAMESPACE,
            "labels": labels[kind],
            "annotations": {OBJECT_TOKEN_ANNOTATION: str(bench.token)},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": pods},
            "template": {
                "metadata": {"labels": pods},
                "spec": {"containers": [{"name": "c", "image": "pause:3.9"}]},
            },
        },
    }


async def status_patch(bench: api.ApiBench, kind: str, name: str, i: int) -> None:
    """The identical status merge patch for every kind, by the holder's Pod."""
    await bench.api.call(
        "PATCH",
        _path(f"dep-{kind}-{name}") + "/status",
        {"status": {"observedGeneration": i}},
        content_type="application/merge-patch+json",
        headers=HOLDER,
    )


async def prepare(bench: api.ApiBench, deadline_s: float = 60.0) -> None:
    """Declare Deployments fenceable, register the null webhook for its label's status
    writes, create the objects; returns once both webhooks are seen to be called."""
    await object_rows.declare(bench, POLICY, "apps", "deployments")
    await object_rows.register_null(
        bench,
        NULL_CONFIGURATION,
        "null-deployments.fencedlease.io",
        "apps",
        ["deployments", "deployments/status"],  # CREATE: its probe
    )
    for name in ["latency", *(f"w{i}" for i in range(bench.writers))]:
        for kind in KINDS:
            await bench.api.call("POST", _path(), _deployment(bench, kind, name))
    deadline = time.monotonic() + deadline_s
    await _until_refused(bench, "fenced", "holder_mismatch", deadline)
    await _until_refused(bench, "null", "probe denied", deadline)


async def _until_refused(bench: api.ApiBench, kind: str, refusal: str, deadline: float) -> None:
    """Dry-run writes the webhook refuses until it refuses one: the API server calls it now
    (fenced: a status write by another Pod; null: its probe)."""

    async def probe() -> None:
        if kind == "fenced":
            await bench.api.call(
                "PATCH",
                _path("dep-fenced-latency") + "/status?dryRun=All",
                {"status": {"observedGeneration": 1}},
                content_type="application/merge-patch+json",
                headers=as_pod("bench-stranger", "uid-stranger"),
            )
        else:
            body = _deployment(bench, kind, "probe")
            body["metadata"]["annotations"][null_webhook.PROBE_ANNOTATION] = null_webhook.PROBE
            await bench.api.call("POST", _path() + "?dryRun=All", body)

    await object_rows.until_refused(probe, refusal, deadline, f"the {kind} webhook for Deployments")


async def measure(
    bench: api.ApiBench, rounds: int, warmup: int, windows: int, seconds: float, seed: int
) -> dict[str, Measured]:
    await prepare(bench)
    return await object_rows.rounds_of(
        bench, status_patch, rounds, warmup, windows, seconds, seed, first=1
    )


def markdown(found: dict[str, Measured], writers: int, rounds: int, windows: int) -> list[str]:
    return object_rows.report(
        found,
        "### Fenced objects: a Deployment status write through the object webhook",
        f"{rounds} latency rounds interleaved in random order; throughput: {windows} windows of "
        f"each kind, {writers} writers, each on its own Deployment; every write by the holder's "
        "Pod (impersonated, all rows alike; writes/s and CPU summed over kube-apiserver, etcd, "
        "both webhooks and the client).",
        "The status check",
        ROWS,
    )


async def main() -> int:
    """The status rows alone (their own control plane): ``bench/status_rows.py [ROUNDS]``."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    writers, windows, seconds = 50, 4, 2.5
    with tempfile.TemporaryDirectory() as tmp:
        bench = await api.start(Path(tmp) / "api", writers, lambda m: print(m, flush=True))
        try:
            found = await measure(bench, rounds, 30, windows, seconds, 15)
        finally:
            await bench.stop()
    print("\n".join(markdown(found, writers, rounds, windows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
