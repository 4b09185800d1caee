"""The Kopf handlers of ``fencedlease/kopfapp.py`` without a cluster: Kopf's settings, the
credentials handed to Kopf, the liveness probe from our health facts, the FencedLease events
to the controller's cache, and a failed startup reported as the user's mistake it is."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from fencedlease import health, kopfapp
from fencedlease.app import Probes
from fencedlease.authority.types import LeaseKey
from fencedlease.settings import Settings, StartupError

from .test_pod_watch import controller

handlers: Any = kopfapp
"""The module, untyped: Kopf types its decorated handlers as callbacks it calls with every
keyword; these tests pass only those the handlers read."""


def test_kopf_runs_standalone_and_posts_no_events() -> None:
    settings = kopf.OperatorSettings()
    kopfapp.tune(settings)
    assert settings.peering.standalone is True
    assert settings.posting.enabled is False


class Config:
    """What :func:`kopfapp.login` reads of kubernetes_asyncio's ``Configuration``."""

    host = "https://127.0.0.1:6443"
    ssl_ca_cert = "/ca.crt"
    verify_ssl = True
    cert_file = None
    key_file = None
    proxy = None

    def __init__(self, bearer: str | None) -> None:
        self.bearer = bearer
        self.asked = 0

    async def get_api_key_with_prefix(self, identifier: str) -> str | None:
        assert identifier == "BearerToken"
        self.asked += 1  # each login reads it again (a rotated token is refreshed there)
        return self.bearer


def memo_with(**process: Any) -> kopf.Memo:
    return kopf.Memo(process=SimpleNamespace(**process))


@pytest.mark.parametrize("bearer", ["Bearer abc", None])
async def test_kopf_logs_in_with_our_clients_credentials(bearer: str | None) -> None:
    config = Config(bearer)
    memo = memo_with(kube=SimpleNamespace(api=SimpleNamespace(configuration=config)))
    info = await handlers.login(memo=memo, logger=None)
    assert info is not None and config.asked == 1
    assert info.server == "https://127.0.0.1:6443" and info.ca_path == "/ca.crt"
    assert info.insecure is False
    assert info.token == ("abc" if bearer else None)


def probes(clock: list[float]) -> Probes:
    found = Probes(
        health.Bounds(etcd_liveness=10.0),
        asyncio.Event(),
        health.EtcdContact(since=0.0),
        clock=lambda: clock[0],
    )
    return found


def test_kopfs_liveness_probe_answers_from_our_health_facts() -> None:
    clock = [1.0]
    found = probes(clock)
    memo = memo_with(probes=found)
    answer = handlers.liveness(memo=memo)
    assert answer["status"] == "ok" and "etcd" in answer
    found.etcd.failed(2.0, "refused")  # failing since the start, past the bound: not live
    clock[0] = 30.0
    with pytest.raises(kopf.PermanentError, match="etcd: no successful round trip"):
        handlers.liveness(memo=memo)


class Scheduler:
    def __init__(self) -> None:
        self.keys: list[LeaseKey] = []

    def poke(self, key: LeaseKey) -> None:
        self.keys.append(key)

    def forget(self, key: LeaseKey) -> None:
        pass


async def test_a_fenced_lease_event_goes_to_the_controllers_cache() -> None:
    rt = controller()
    rt.scheduler = Scheduler()
    body = {
        "metadata": {"namespace": "ns", "name": "jobs", "uid": "u", "generation": 1},
        "spec": {
            "leaseDurationSeconds": 10,
            "fencingPolicy": "AllowEqual",
            "holderSelector": {"matchLabels": {"app": "w"}},
        },
    }
    memo = memo_with(controller=rt)
    await handlers.fenced_lease(event={"type": None, "object": body}, memo=memo)
    assert rt.leases.get(LeaseKey("ns", "jobs")) is not None
    assert rt.scheduler.keys == [LeaseKey("ns", "jobs")]  # a pass for the new lease
    await handlers.fenced_lease(event={"type": "DELETED", "object": body}, memo=memo)
    assert rt.leases.get(LeaseKey("ns", "jobs")) is None


async def test_a_startup_that_fails_on_the_users_mistake_raises_that_mistake(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Kopf wraps what a startup handler raises; ``fencedlease run`` reports our own error
    (one line, no traceback: ``cli.cmd_run``)."""

    async def refused(*_: Any, **__: Any) -> Any:
        raise StartupError("the token proof key in /nowhere is shorter than 16 bytes")

    monkeypatch.setattr(handlers.app, "start", refused)
    settings = Settings.from_env({"role": "controller"})
    async with asyncio.timeout(30):
        with pytest.raises(StartupError, match="shorter than 16 bytes"):
            await kopfapp.run_operator(settings, stop_flag=asyncio.Event())
