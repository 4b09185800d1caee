"""``fencedlease local demo`` (``make demo``): the article's race and the fence, in one command.

On a local control plane of its own (``local up`` in a temporary state directory, stopped and
removed at the end) it plays the story of docs/fenced-publish.md and prints it as a timeline:

1. ``writer-a`` becomes Ready and is granted ``report-july`` with token N;
2. it prepares its report, then freezes (a stop-the-world pause) with its publish queued;
3. its readiness probe, served by the frozen process, fails: the Pod turns NotReady;
4. the lease moves to ``writer-b`` with a greater token M; B publishes its report;
5. A thaws and sends its queued write with token N: the fence webhook refuses it,
   ``stale_fence: token N is below the high-water mark M``; the artifact keeps B's report.

No kubelet runs on the control plane alone, so the demo plays its part: it marks the Pods
Ready and NotReady through their status, as a kubelet would after a probe.  Both writers
publish with the local admin's identity (an allowed writer of ``local up``), through the
client SDK's :class:`~fencedlease.client.Publisher`, each with the grant it read.

:class:`Story` runs against any cluster with the operator and its webhook
(tests/integration/test_demo.py runs it against the test control plane); :func:`run_demo`
starts and stops the local one around it.  The exit status is 0 only when the stale write was
refused and the artifact kept the new holder's report.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fencedlease.client import (
    FencedLeaseError,
    Grant,
    KubeClient,
    KubeConfig,
    PodGrant,
    Publisher,
    PublishResult,
)

LEASE = "report-july"
ARTIFACT = "report-july"
WRITER_A, WRITER_B = "writer-a", "writer-b"
APP = "report-writer"
REPORT_A, REPORT_B = "reports/july/a7.tmp", "reports/july/b9.tmp"
LEASE_SECONDS = 5
GROUP = "/apis/fencedlease.io/v1alpha1"


@dataclass(frozen=True, slots=True)
class Step:
    """One line of the timeline: seconds since the story began, who, what."""

    at: float
    actor: str
    text: str

    def line(self) -> str:
        return f"{self.at:6.1f}s  {self.actor:<9} {self.text}"


@dataclass(slots=True)
class Timeline:
    """What happened, for the printout and the exit status."""

    steps: list[Step] = field(default_factory=list)
    token_a: int | None = None
    token_b: int | None = None
    b_result: str = ""
    """The code of B's publish (``applied``)."""
    a_result: str = ""
    """The code of A's late publish (``stale_fence`` when the fence did its job)."""
    refusal: str = ""
    """The fence's message for A's write, from ``stale_fence:`` on."""
    kept_ref: str | None = None
    kept_token: int | None = None

    @property
    def fenced(self) -> bool:
        """The stale write was refused and the artifact kept the new holder's report."""
        return (
            self.token_a is not None
            and self.token_b is not None
            and self.token_a < self.token_b
            and self.b_result == "applied"
            and self.a_result == "stale_fence"
            and self.kept_ref == REPORT_B
            and self.kept_token == self.token_b
        )


class DemoError(RuntimeError):
    """A step of the story did not happen in time (the message says which)."""


def _pods(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def _custom(namespace: str, plural: str, name: str = "") -> str:
    return f"{GROUP}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def _code(result: PublishResult) -> str:
    return str(result.code)


class Story:
    """The article's story against a running operator and webhook, in ``namespace``.

    ``out`` receives each timeline line as it happens; ``timeout`` bounds each wait.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        out: Callable[[str], None] = print,
        *,
        timeout: float = 60.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.out = out
        self.timeout = timeout
        self.timeline = Timeline()
        self._t0 = time.monotonic()

    def note(self, actor: str, text: str) -> None:
        step = Step(time.monotonic() - self._t0, actor, text)
        self.timeline.steps.append(step)
        self.out(step.line())

    def run(self) -> Timeline:
        self._t0 = time.monotonic()
        self._setup()
        grant_a = self._first_grant()
        self._freeze_and_hand_over(grant_a)
        self._late_write(grant_a)
        return self.timeline

    # ---------------------------------------------------------------------- the steps

    def _setup(self) -> None:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        self._create("/api/v1/namespaces", namespace, exists_ok=True)
        lease = {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencedLease",
            "metadata": {"name": LEASE, "namespace": self.namespace},
            "spec": {
                "leaseDurationSeconds": LEASE_SECONDS,
                "fencingPolicy": "AllowEqual",
                "holderSelector": {"matchLabels": {"app": APP}},
            },
        }
        self._create(_custom(self.namespace, "fencedleases"), lease)
        self.note(
            "setup",
            f"FencedLease {self.namespace}/{LEASE} ({LEASE_SECONDS} s), "
            f"holders: Ready Pods labelled app={APP}",
        )
        self._start_pod(WRITER_A)

    def _first_grant(self) -> Grant:
        grant = self._wait_grant(WRITER_A, above=0)
        self.timeline.token_a = grant.token
        self.note(WRITER_A, f"granted {LEASE}: token {grant.token}")
        self.note(WRITER_A, f"prepares {REPORT_A} (immutable, nobody sees it yet)")
        return grant

    def _freeze_and_hand_over(self, grant_a: Grant) -> None:
        self.note(
            WRITER_A,
            f"FREEZES (a stop-the-world pause) with its publish queued; "
            f"it still believes it holds token {grant_a.token}",
        )
        self._start_pod(WRITER_B)
        self._set_ready(WRITER_A, ready=False)
        self.note(
            "kubelet", f"{WRITER_A}'s readiness probe fails (its process is frozen): NotReady"
        )
        self.note(
            "operator",
            f"stops renewing {WRITER_A}'s grant (NotReady): it runs out within {LEASE_SECONDS} s",
        )
        grant_b = self._wait_grant(WRITER_B, above=grant_a.token)
        self.timeline.token_b = grant_b.token
        self.note(WRITER_B, f"the lease moved: granted token {grant_b.token} (> {grant_a.token})")
        result = self._publish(REPORT_B, grant_b)
        self.timeline.b_result = _code(result)
        self.note(
            WRITER_B,
            f"publishes {ARTIFACT} -> {REPORT_B} with token {grant_b.token}: {_code(result)}",
        )

    def _late_write(self, grant_a: Grant) -> None:
        self.note(
            WRITER_A,
            f"THAWS and sends its queued write: {ARTIFACT} -> {REPORT_A}, token {grant_a.token}",
        )
        result = self._publish(REPORT_A, grant_a)
        self.timeline.a_result = _code(result)
        message = str(getattr(result, "message", ""))
        start = message.find("stale_fence:")
        self.timeline.refusal = message[start:] if start >= 0 else message
        if self.timeline.a_result == "stale_fence":
            self.note("fence", f"REFUSED: {self.timeline.refusal}")
        else:
            self.note("fence", f"NOT refused ({self.timeline.a_result}): {message}")
        artifact = self.kube.get(_custom(self.namespace, "fencedartifacts", ARTIFACT))
        spec = artifact.get("spec") or {}
        self.timeline.kept_ref = spec.get("objectRef")
        token = spec.get("fencingToken")
        self.timeline.kept_token = token if isinstance(token, int) else None
        self.note(
            "artifact",
            f"{ARTIFACT} -> {self.timeline.kept_ref} (token {self.timeline.kept_token})",
        )

    # ---------------------------------------------------------------------- API calls

    def _create(self, path: str, body: dict[str, Any], *, exists_ok: bool = False) -> None:
        reply = self.kube.request("POST", path, body=body)
        if not (exists_ok and reply.status_code == 409):
            reply.raise_for_status()

    def _start_pod(self, name: str) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {"app": APP}},
            # Never pulled: no kubelet runs here (on a node the image is the operator's).
            "spec": {"containers": [{"name": "worker", "image": "report-writer.invalid/demo"}]},
        }
        self._create(_pods(self.namespace), pod)
        self._set_ready(name, ready=True)
        self.note("kubelet", f"{name} is Running and Ready: a candidate holder")

    def _set_ready(self, name: str, *, ready: bool) -> None:
        status = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        self.kube.request(
            "PATCH",
            _pods(self.namespace, name) + "/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        ).raise_for_status()

    def _wait_grant(self, pod: str, *, above: int) -> Grant:
        """The grant the operator wrote on ``pod``, held, with a token above ``above``."""
        source = PodGrant(LEASE, pod=pod, namespace=self.namespace, client=self.kube)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            grant = source.read()
            if grant is not None and grant.held and grant.token > above:
                return grant
            time.sleep(0.2)
        raise DemoError(f"{pod} was not granted {LEASE} within {self.timeout:.0f}s")

    def _publish(self, object_ref: str, grant: Grant) -> PublishResult:
        return Publisher(self.kube).publish(
            ARTIFACT, object_ref=object_ref, grant=grant, namespace=self.namespace
        )


# -------------------------------------------------------------------------- the command


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def run_demo(state_dir: Path | None = None) -> int:
    """Start a local control plane, tell the story, stop it: 0 when the fence refused."""
    from fencedlease.local.up import local_down, local_up

    temporary = state_dir is None
    where = Path(tempfile.mkdtemp(prefix="fencedlease-demo-")) if state_dir is None else state_dir
    started = time.monotonic()
    _say(f"starting a local control plane in {where} (etcd, kube-apiserver, operator, webhook)")
    quiet = io.StringIO()
    # Both writers publish as the local admin: allowed whatever the caller's environment says.
    os.environ["FENCEDLEASE_ALLOWED_WRITERS"] = "group:system:masters"
    try:
        with contextlib.redirect_stdout(quiet):
            up = local_up(where, detach=True, verbose=False)
        if up != 0:
            _say("the local control plane did not start (its log is above)")
            return 1
        _say(f"ready in {time.monotonic() - started:.0f}s; the story:")
        print(flush=True)
        config = KubeConfig.from_kubeconfig(where / "kubeconfig")
        with KubeClient(config) as kube:
            # A state directory of the caller's may hold an earlier run's objects.
            namespace = "fencedlease-demo"
            if not temporary:
                namespace += f"-{uuid.uuid4().hex[:6]}"
            timeline = Story(kube, namespace, lambda s: print(s, flush=True)).run()
        print(flush=True)
        return _verdict(timeline)
    except (DemoError, FencedLeaseError) as exc:
        _say(f"error: {exc} (logs: {where / 'logs'})")
        return 1
    finally:
        _say("stopping the local control plane")
        with contextlib.redirect_stdout(quiet):
            local_down(where)
        if temporary:
            shutil.rmtree(where, ignore_errors=True)
        _say(f"done in {time.monotonic() - started:.0f}s")


def _verdict(timeline: Timeline) -> int:
    if timeline.fenced:
        _say(
            f"the frozen holder's write with token {timeline.token_a} was refused; the "
            f"report of token {timeline.token_b} stays. That is the fence."
        )
        return 0
    print(
        f"[demo] FAILED: expected stale_fence and {REPORT_B} kept; got {timeline.a_result!r}, "
        f"{timeline.kept_ref!r} (token {timeline.kept_token})",
        file=sys.stderr,
    )
    return 1
