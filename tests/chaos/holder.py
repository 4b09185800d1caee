"""One holder of the fault campaign: a process acting as its own Pod (run by the campaign).

The article's loop, as docs/fenced-publish.md says it: read the grant from the Pod's
annotations, stage an immutable object (a file named by the operation id), publish a
FencedArtifact carrying the token and the operation id through :class:`Publisher`, and react to
the result — ``stale_fence`` (or any definitive refusal) ends all work under that grant, never
retried; ``unavailable`` is tried again later. Under ``StrictlyGreater`` a grant allows one
write, so the holder writes once per grant; under ``AllowEqual`` it keeps writing.

Like a worker that reads its token when a job starts, a holder reads its grants, then runs a
job of several steps (``--job-steps``: stage, then publish, under ``AllowEqual``; one step under
``StrictlyGreater``) without reading them again or re-checking its deadline: the check would not
be safe anyway (a pause can come right after it). A job is counted in steps, not seconds, so a
SIGSTOP that lands inside a job is followed by writes under the grant read before it: every
pause of the nemesis falls at the worst point, between the read and the write.

Every observation and every write attempt is appended to ``--history`` as JSON lines (flushed
line by line, so a holder stopped with SIGSTOP or killed loses nothing already answered).

``--control``: the same loop against the plain control resource (same schema, no webhook, no
CEL rule): every write is taken.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from fencedlease.client import (
    Applied,
    Duplicate,
    KubeClient,
    KubeConfig,
    Publisher,
    Rejected,
    RetryPolicy,
    StaleFence,
    Unavailable,
)
from fencedlease.client.api import pod_path
from fencedlease.client.errors import TransportError
from fencedlease.client.grant import grant_from_annotations
from tests.chaos.history import Event, Grant, WriteFail, WriteInvoke, WriteOk, WriteTimeout

CONTROL_GROUP = "chaos.fencedlease.io"
CONTROL_PLURAL = "plainartifacts"


def artifact_name(lease: str) -> str:
    return f"{lease}-out"


class Recorder:
    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def add(self, event: Event) -> None:
        self.out.write(json.dumps({"type": type(event).__name__, **asdict(event)}) + "\n")
        self.out.flush()


class Holder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.name: str = args.name
        self.namespace: str = args.namespace
        self.leases: dict[str, str] = dict(p.split(":", 1) for p in args.leases.split(","))
        self.control: bool = args.control
        self.stage = Path(args.stage)
        self.stage.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(args.seed)
        config = KubeConfig(
            server=args.server,
            namespace=args.namespace,
            token_file=args.token_file,
            ca_file=args.ca_file,
            timeout=args.timeout,
        )
        self.kube = KubeClient(config)
        # Short retries (a conflict with the controller's own writes to the artifact is common);
        # a holder that still cannot get an answer gives up and re-reads its grant.
        self.publisher = Publisher(
            self.kube, retry=RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.2)
        )
        self.history = Recorder(Path(args.history).open("a"))  # noqa: SIM115 - for the process
        self.seen: set[tuple[str, str]] = set()  # (lease, lease id) observed
        self.done: set[tuple[str, str]] = set()  # grants under which we must not write again
        self.seq = 0
        self.stopping = False
        self.job_steps: int = max(1, args.job_steps)
        self.pace: float = max(0.0, args.pace)

    def grants(self) -> dict[str, tuple[int, str]]:
        """Our current grants, lease → (token, lease id), from our Pod's annotations."""
        try:
            reply = self.kube.request("GET", pod_path(self.namespace, self.name))
        except TransportError:
            return {}
        if not reply.ok:
            return {}
        annotations = (reply.json().get("metadata") or {}).get("annotations") or {}
        held: dict[str, tuple[int, str]] = {}
        for lease in self.leases:
            try:
                grant = grant_from_annotations(annotations, lease, source="pod")
            except Exception:
                continue
            if grant is None or not grant.held:
                continue
            held[lease] = (grant.token, grant.lease_id)
            if (lease, grant.lease_id) not in self.seen:
                self.seen.add((lease, grant.lease_id))
                self.history.add(Grant(time.time(), lease, self.name, grant.token, grant.lease_id))
        return held

    def write(self, lease: str, token: int, lease_id: str) -> None:
        self.seq += 1
        op_id = f"{self.name}-{self.seq}-{uuid.uuid4().hex[:6]}"
        staged = self.stage / op_id  # prepare: harmless, immutable, named by the operation
        staged.write_text(f"{lease} {token} {op_id}\n")
        artifact = artifact_name(lease)
        self.history.add(
            WriteInvoke(time.time(), op_id, lease, self.name, token, lease_id, artifact)
        )
        if self.control:
            outcome = self._control_write(artifact, lease, token, op_id)
        else:
            outcome = self._fenced_write(artifact, lease, token, op_id)
        if outcome is None:
            self.history.add(WriteOk(time.time(), op_id))
            if self.leases[lease] == "StrictlyGreater":
                self.done.add((lease, lease_id))  # one write per grant
        elif outcome == "timeout":
            self.history.add(WriteTimeout(time.time(), op_id))
        else:
            self.history.add(WriteFail(time.time(), op_id, outcome))
            if outcome != "unavailable":
                self.done.add((lease, lease_id))  # definitive: stop work under this grant
                staged.unlink(missing_ok=True)  # discard the staged object

    def _fenced_write(self, artifact: str, lease: str, token: int, op_id: str) -> str | None:
        result = self.publisher.publish(
            artifact, object_ref=f"stage/{op_id}", lease=lease, token=token, operation_id=op_id
        )
        match result:
            case Applied() | Duplicate():
                return None
            case StaleFence():
                return "stale_fence"
            case Rejected(code=code):
                return code
            case Unavailable():
                return "timeout"  # retried and gave up: it may or may not have been committed
        return "timeout"

    def _control_write(self, artifact: str, lease: str, token: int, op_id: str) -> str | None:
        """The Publisher's own requests (read, then create or replace at the version read,
        read again on a conflict) against a resource that does not check tokens."""
        base = f"/apis/{CONTROL_GROUP}/v1alpha1/namespaces/{self.namespace}/{CONTROL_PLURAL}"
        spec = {
            "leaseRef": {"name": lease},
            "fencingToken": token,
            "objectRef": f"stage/{op_id}",
            "operationId": op_id,
        }
        outcome = "timeout"
        for attempt in range(4):  # the Publisher's RetryPolicy(attempts=4)
            if attempt:
                time.sleep(0.05)
            try:
                current = self.kube.request("GET", f"{base}/{artifact}")
                if current.status_code == 404:
                    body: dict[str, Any] = {
                        "apiVersion": f"{CONTROL_GROUP}/v1alpha1",
                        "kind": "PlainArtifact",
                        "metadata": {"name": artifact, "namespace": self.namespace},
                        "spec": spec,
                    }
                    answer = self.kube.request("POST", base, body=body)
                else:
                    obj = current.json()
                    obj["spec"] = spec
                    answer = self.kube.request("PUT", f"{base}/{artifact}", body=obj)
            except TransportError:
                outcome = "timeout"
                continue
            if answer.ok:
                return None
            if answer.status_code not in (409, 429, 500, 502, 503, 504):
                return "timeout"
            outcome = "unavailable"
        return outcome

    def run(self) -> None:
        while not self.stopping:
            held = {k: v for k, v in self.grants().items() if (k, v[1]) not in self.done}
            if not held:
                time.sleep(0.1)  # nothing to do under what we know: look again soon
                continue
            for _ in range(self.rng.randint(2, self.job_steps)):
                for lease, (token, lease_id) in sorted(held.items()):
                    if (lease, lease_id) in self.done or self.stopping:
                        continue
                    time.sleep(self.pace + self.rng.uniform(0.0, 0.02))  # the job's own work
                    self.write(lease, token, lease_id)
                if all((lease, lease_id) in self.done for lease, (_, lease_id) in held.items()):
                    break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos-holder")
    parser.add_argument("--name", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--leases", required=True, help="name:Policy,name:Policy")
    parser.add_argument("--history", required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--control", action="store_true")
    parser.add_argument(
        "--ca-file", default=None, help="the API server's CA (an https --server, e2e/)"
    )
    parser.add_argument(
        "--pace", type=float, default=0.0, help="seconds added before each write (a steady load)"
    )
    parser.add_argument(
        "--job-steps",
        type=int,
        default=20,
        help="most writes of one job under the grants read at its start (at random 2..N)",
    )
    holder = Holder(parser.parse_args(argv))

    def stop(*_: object) -> None:
        holder.stopping = True

    signal.signal(signal.SIGTERM, stop)
    holder.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
