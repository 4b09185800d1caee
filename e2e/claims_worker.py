"""The worker of e2e/test_30_examples.py's claims scenario, run in a Pod on the operator image
(its code in a ConfigMap): per-item work with claims (docs/client.md, "Claims").

Worker ``WORKER_INDEX`` of ``WORKERS`` takes its share of ``ITEMS`` items, then sweeps: while
any item has no artifact, it claims the missing ones (shuffled). For each item: claim it under
template ``TEMPLATE``; if no artifact ``out-<item>`` exists, publish it under the item lease's
token; withdraw the claim. Only Ready Pods are granted: ``/healthz`` on :8080 is served by this
process, so a frozen worker goes NotReady and its item lease lapses.

``HOLD_ITEM``: after claiming that item the worker prints ``HOLDING <item> token <t>`` and waits
until ``/tmp/release`` exists (the test freezes the container meanwhile, then thaws it and
creates the file); then it writes the item with the token it had (the late write) and records
what the fence answered. On exit it prints one line ``RESULT <json>``: the items it applied
with their tokens, its claim latencies (ms, claim request until the grant was read) and its
start and end time.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fencedlease.client import (
    Applied,
    Claimed,
    Claimer,
    ClaimPending,
    KubeClient,
    Publisher,
    RetryPolicy,
)

RELEASE_FILE = Path("/tmp/release")


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a probe that gave up while the process was frozen (broken pipe)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def artifacts_path(ns: str, name: str | None = None) -> str:
    base = f"/apis/fencedlease.io/v1alpha1/namespaces/{ns}/fencedartifacts"
    return f"{base}/{name}" if name else base


class Worker:
    def __init__(self, kube: KubeClient, template: str, hold: str | None) -> None:
        self.kube = kube
        self.ns = kube.namespace
        self.pod = os.environ["POD_NAME"]
        self.template = template
        self.hold = hold
        self.claimer = Claimer(kube)
        self.publisher = Publisher(kube, retry=RetryPolicy(attempts=6, base_delay=0.05))
        self.report: dict[str, Any] = {
            "pod": self.pod,
            "applied": {},
            "skipped": 0,
            "busy": 0,
            "pending": 0,
            "claims_ms": [],
            "late": None,
        }

    def publish(self, item: str, claimed: Claimed) -> str:
        result = self.publisher.publish(
            f"out-{item}",
            object_ref=f"{item}@{self.pod}",
            lease=claimed.lease,
            token=claimed.token,
            operation_id=item,
        )
        if isinstance(result, Applied):
            self.report["applied"][item] = claimed.token
        return result.code

    def late_write(self, item: str, claimed: Claimed) -> None:
        print(f"HOLDING {item} token {claimed.token}", flush=True)
        deadline = time.monotonic() + 600
        while not RELEASE_FILE.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        code = self.publish(item, claimed)
        self.report["late"] = {"item": item, "token": claimed.token, "code": code}
        print(f"late write of {item} with token {claimed.token}: {code}", flush=True)

    def published(self, item: str) -> bool:
        return self.kube.request("GET", artifacts_path(self.ns, f"out-{item}")).status_code != 404

    def process(self, item: str) -> None:
        if item != self.hold and self.published(item):
            self.report["skipped"] += 1  # done by another worker's sweep: no claim needed
            return
        started = time.perf_counter()
        claimed = self.claimer.claim(self.template, item, wait=10)
        if not isinstance(claimed, Claimed):
            if isinstance(claimed, ClaimPending):
                self.claimer.done(self.template, item)
            key = claimed.code if claimed.code in self.report else "pending"
            self.report[key] += 1
            return
        self.report["claims_ms"].append(round((time.perf_counter() - started) * 1000, 1))
        if item == self.hold:
            self.hold = None
            self.late_write(item, claimed)
        elif not self.published(item):
            code = self.publish(item, claimed)
            if code != "applied":
                print(f"{item}: publish with token {claimed.token}: {code}", flush=True)
        else:
            self.report["skipped"] += 1  # a previous holder published it
        self.claimer.done(self.template, item)

    def missing(self, items: list[str]) -> list[str]:
        listed = self.kube.get(artifacts_path(self.ns)).get("items") or []
        have = {a["metadata"]["name"] for a in listed}
        left = [i for i in items if f"out-{i}" not in have]
        random.Random(self.pod).shuffle(left)
        return left

    def run(self, items: list[str], mine: list[str]) -> None:
        self.report["start"] = time.time()
        for item in mine:
            self.process(item)
        deadline = time.monotonic() + 600
        while left := self.missing(items):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(left)} items still without an artifact")
            for item in left:
                self.process(item)
            time.sleep(0.5)
        self.report["end"] = time.time()


def main() -> int:
    server = _Quiet(("", 8080), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index, workers = int(os.environ["WORKER_INDEX"]), int(os.environ["WORKERS"])
    items = [f"item-{i:04d}" for i in range(int(os.environ["ITEMS"]))]
    with KubeClient() as kube:
        worker = Worker(kube, os.environ["TEMPLATE"], os.environ.get("HOLD_ITEM") or None)
        try:
            worker.run(items, items[index::workers])
        except Exception as exc:
            print(f"FAILED: {type(exc).__name__}: {exc}", flush=True)
            return 1
    print("RESULT " + json.dumps(worker.report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
