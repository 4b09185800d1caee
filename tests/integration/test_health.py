"""Health that means something, through the real control plane: an operator (controller and
webhook in one process, registered with the real kube-apiserver) whose own etcd goes away
turns not ready, then not live with the etcd reason once the bound passed, and comes back
when etcd does; and a controller whose every worker hangs in a write to an API server that
accepts connections and answers nothing fails liveness with the scheduler's reason once work
has been due past the bound, and is live again once the API server answers
(docs/operations.md, "Health")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from fencedlease.controller.runtime import LEASE_WORKERS
from fencedlease.local.cluster import EtcdServer, LocalCluster, free_port

from .k8s import apply, lease, ready_pods, running_fence, running_operator, wait_for, wait_held

LIVENESS_BOUND = 4.0
PROBE_EVERY = 0.5


def probe(port: int, path: str) -> tuple[int, dict[str, Any] | None]:
    """``(status, JSON reasons or None)`` of ``GET path``; status 0 if nothing answered."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except OSError:
        return 0, None


def status_of(port: int, path: str) -> int:
    """The HTTP status of ``GET path`` (0: nothing answered), whatever the body."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def verbose_health(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz?verbose", timeout=2) as resp:
            found: dict[str, Any] = json.loads(resp.read())
            return found
    except urllib.error.HTTPError as error:
        failing: dict[str, Any] = json.loads(error.read())
        return failing


def _signal(etcd: EtcdServer, sig: signal.Signals) -> None:
    assert etcd.process is not None and etcd.process.proc is not None
    os.kill(etcd.process.proc.pid, sig)


def _break(etcd: EtcdServer, fault: str) -> None:
    if fault == "stopped":  # connections refused
        etcd.stop()
    else:  # frozen: connections accepted, nothing answered (only the gRPC deadline ends calls)
        _signal(etcd, signal.SIGSTOP)


def _heal(etcd: EtcdServer, fault: str) -> None:
    if fault == "stopped":
        etcd.start()  # same data and ports
    else:
        _signal(etcd, signal.SIGCONT)


@pytest.mark.parametrize("fault", ["stopped", "frozen"])
def test_etcd_lost_fails_readiness_then_liveness_and_both_recover(
    cluster: LocalCluster, namespace: str, tmp_path: Path, fault: str
) -> None:
    etcd = EtcdServer(tmp_path / "etcd", tmp_path / "etcd.log")
    etcd.start()
    health, kopf_liveness = free_port(), free_port()
    env = {
        "FENCEDLEASE_KOPF_LIVENESS_PORT": str(kopf_liveness),
        "FENCEDLEASE_ETCD_TIMEOUT_SECONDS": "1",
        "FENCEDLEASE_HEALTH_ETCD_PROBE_SECONDS": str(PROBE_EVERY),
        "FENCEDLEASE_HEALTH_ETCD_READINESS_SECONDS": "1",
        "FENCEDLEASE_HEALTH_ETCD_LIVENESS_SECONDS": str(LIVENESS_BOUND),
    }
    try:
        with running_fence(
            cluster, tmp_path, namespace, env=env, etcd_endpoint=etcd.endpoint, health_port=health
        ) as (proc, _):
            verbose = wait_for(
                lambda: (
                    (r := verbose_health(health))["watches"].keys()
                    >= {"pods", "fencedartifacts", "fencedreleases", "fencedclaims"}
                    and r
                ),
                timeout=30,
                what="our watches to be observed (the FencedLeases are Kopf's)",
            )
            # Kopf's liveness endpoint answers from the same facts (our probe handler)
            wait_for(
                lambda: status_of(kopf_liveness, "/healthz") == 200,
                timeout=30,
                what="Kopf's liveness endpoint",
            )
            assert verbose["status"] == "ok" and verbose["webhookServing"] is True, verbose
            assert set(verbose["schedulers"]) == {"leases", "artifacts"}, verbose
            # Idle, but the probe keeps reading etcd: live and ready for several bounds.
            deadline = time.monotonic() + 2 * LIVENESS_BOUND
            while time.monotonic() < deadline:
                assert probe(health, "/healthz") == (200, None), proc.log_tail(40)
                assert probe(health, "/readyz") == (200, None), proc.log_tail(40)
                time.sleep(PROBE_EVERY)

            _break(etcd, fault)
            stopped = time.monotonic()
            _, body = wait_for(
                lambda: (r := probe(health, "/readyz"))[0] == 503 and r,
                timeout=15,
                what="/readyz to fail without etcd",
            )
            assert body is not None and body["reasons"][0].startswith("etcd:"), body
            _, body = wait_for(
                lambda: (r := probe(health, "/healthz"))[0] == 500 and r,
                timeout=LIVENESS_BOUND + 15,
                what="/healthz to fail with the etcd reason",
            )
            failed_after = time.monotonic() - stopped
            assert body is not None and body["status"] == "failing", body
            # Kopf's endpoint too (it caches a probe's answer for 10 s): 500
            wait_for(
                lambda: status_of(kopf_liveness, "/healthz") == 500,
                timeout=30,
                what="Kopf's liveness endpoint to fail with ours",
            )
            (reason,) = body["reasons"]
            assert reason.startswith("etcd: no successful round trip for"), reason
            assert f"bound {LIVENESS_BOUND:g}s" in reason, reason
            # not before the bound: the last success was at most a probe period before the stop
            assert failed_after >= LIVENESS_BOUND - 2 * PROBE_EVERY, failed_after
            assert proc.alive()

            _heal(etcd, fault)
            wait_for(
                lambda: probe(health, "/healthz") == (200, None),
                timeout=60,
                what="/healthz to recover with etcd",
            )
            wait_for(
                lambda: probe(health, "/readyz") == (200, None),
                timeout=30,
                what="/readyz to recover with etcd",
            )
            wait_for(
                lambda: status_of(kopf_liveness, "/healthz") == 200,
                timeout=30,
                what="Kopf's liveness endpoint to recover",
            )
    finally:
        if fault == "frozen" and etcd.process is not None and etcd.process.alive():
            _signal(etcd, signal.SIGCONT)
        etcd.stop()


class Blackhole:
    """A TCP relay in front of the kube-apiserver that can stop relaying: connections stay
    open and nothing is answered (an API server that hangs, the case a timeout never ends)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._relays: set[asyncio.Task[Any]] = set()
        self._server = asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _serve(self) -> asyncio.Server:
        self._flowing.set()
        return await asyncio.start_server(self._relay, "127.0.0.1", 0)

    async def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    await self._flowing.wait()  # frozen: held, not lost
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def freeze(self) -> None:
        self.loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        self.loop.call_soon_threadsafe(self._flowing.set)

    def close(self) -> None:
        self.thaw()
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


def kubeconfig_through(cluster: LocalCluster, port: int, path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


def api_port(cluster: LocalCluster) -> int:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    return int(str(config["clusters"][0]["cluster"]["server"]).rsplit(":", 1)[1])


# Six ticks of the test's leases: on a loaded runner (load 10+, the test suite beside a node)
# the operator can be starved of CPU for a few seconds, which must not read as a stall; a
# hung API server stalls the scheduler for good, so the larger bound only delays the verdict.
STALL_BOUND = 6.0
RENEW_TICK = 1.0  # the renew interval of the test's 3 s leases
LEASES = (
    LEASE_WORKERS + 8
)  # more than the lease scheduler's workers: work stays due while they hang


def test_a_scheduler_stuck_behind_a_hung_api_server_fails_liveness_and_recovers(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """Every worker hangs in an API write that never returns (the API server accepts and
    answers nothing); renewals fall due with no run starting or finishing: /healthz fails with
    the scheduler's reason after the bound, and passes once the API server answers again."""
    ready_pods(cluster, namespace, "w-1")
    for i in range(LEASES):
        apply(cluster, lease(f"l-{i}", namespace, duration=3))
    blackhole = Blackhole(api_port(cluster))
    health = free_port()
    env = {
        "FENCEDLEASE_LEADER_ELECTION": "false",
        "FENCEDLEASE_HEALTH_SCHEDULER_STALL_SECONDS": str(STALL_BOUND),
    }
    try:
        with running_operator(
            cluster,
            tmp_path,
            "--role",
            "controller",
            "--namespace",
            namespace,
            name="controller",
            env=env,
            kubeconfig=kubeconfig_through(cluster, blackhole.port, tmp_path / "kubeconfig"),
            health_port=health,
        ) as proc:
            for i in range(LEASES):
                wait_held(cluster, f"l-{i}", namespace)
            # Renewing every second, live for several bounds.
            deadline = time.monotonic() + 2 * STALL_BOUND
            while time.monotonic() < deadline:
                assert probe(health, "/healthz") == (200, None), proc.log_tail(40)
                time.sleep(PROBE_EVERY)

            blackhole.freeze()
            frozen = time.monotonic()
            _, body = wait_for(
                lambda: (r := probe(health, "/healthz"))[0] == 500 and r,
                timeout=STALL_BOUND + 20,
                what="/healthz to fail with the scheduler's reason",
            )
            assert body is not None, body
            reasons = [r for r in body["reasons"] if r.startswith("scheduler leases:")]
            assert reasons and f"(bound {STALL_BOUND:g}s)" in reasons[0], body
            # The bound runs from the last run started or finished: renewals run in bursts on
            # their one-second tick (3 s leases), so that can precede the freeze by a tick.
            assert time.monotonic() - frozen >= STALL_BOUND - RENEW_TICK, body
            verbose = verbose_health(health)
            assert verbose["schedulers"]["leases"]["dueFor"] is not None, verbose

            blackhole.thaw()
            wait_for(
                lambda: probe(health, "/healthz") == (200, None),
                timeout=60,
                what="/healthz to recover once the API server answers",
            )
            assert proc.alive()
    finally:
        blackhole.close()


def _fence_answers(port: int) -> int:
    """The HTTP status the webhook's /fence gives a body that is not JSON (0: no answer)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/fence", data=b"not json", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def test_a_webhook_told_to_stop_drains_not_ready_then_exits(
    cluster: LocalCluster, namespace: str, tmp_path: Path
) -> None:
    """SIGTERM to a webhook-only process: /readyz turns 503 with the reason at once, reviews
    are still answered while it drains (the Service drops the Pod first), then it exits 0.
    Before, SIGTERM's default action ended it mid-review."""
    health, port, drain = free_port(), free_port(), 3.0
    env = {
        "FENCEDLEASE_WEBHOOK_DRAIN_SECONDS": str(drain),
        "FENCEDLEASE_WEBHOOK_CONFIGURATION_NAME": f"{namespace}-drain.fencedlease.io",
    }
    args = ["--role", "webhook", "--namespace", namespace, "--webhook-registration", "url"]
    args += ["--webhook-port", str(port), "--webhook-cert-dir", str(tmp_path / "pki")]
    try:
        with running_operator(cluster, tmp_path, *args, env=env, health_port=health) as proc:
            assert proc.proc is not None
            assert _fence_answers(port) == 400  # answering: 'body is not JSON'
            # A webhook-only process runs on uvloop (docs/performance.md, "The fenced write:
            # nearly free"); the drain's signal handling below is uvloop's then.
            assert "event loop uvloop" in proc.log_tail(200), proc.log_tail(200)
            proc.proc.send_signal(signal.SIGTERM)
            _, reasons = wait_for(
                lambda: (r := probe(health, "/readyz"))[0] == 503 and r,
                timeout=5,
                what="/readyz 503 after SIGTERM",
            )
            assert reasons is not None and "stopping" in json.dumps(reasons), reasons
            assert proc.alive(), proc.log_tail(40)
            assert _fence_answers(port) == 400, "reviews must be answered while draining"
            assert proc.proc.wait(timeout=drain + 15) == 0, proc.log_tail(40)
            assert "stopping: not ready" in proc.log_tail(40)
    finally:
        cluster.kubectl(
            "delete",
            "mutatingwebhookconfiguration",
            f"{namespace}-drain.fencedlease.io",
            "--ignore-not-found",
        )
