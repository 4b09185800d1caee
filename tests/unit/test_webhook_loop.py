"""The event loop of a webhook-only process (``webhook_event_loop``): uvloop by default, asyncio
when asked or when uvloop is missing; every other role stays on asyncio (docs/performance.md,
"The fenced write: nearly free")."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from fencedlease.app import loop_factory
from fencedlease.settings import EventLoop, Role, Settings
from fencedlease.webhook.wiring import event_loop_factory

uvloop = pytest.importorskip("uvloop")


def test_a_webhook_only_process_runs_on_uvloop_by_default() -> None:
    settings = Settings(role=Role.WEBHOOK)
    assert settings.webhook_event_loop is EventLoop.UVLOOP
    factory = loop_factory(settings)
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(_loop_module()) == "uvloop"


@pytest.mark.parametrize("role", [Role.ALL, Role.CONTROLLER])
def test_processes_with_a_controller_stay_on_asyncio(role: Role) -> None:
    assert loop_factory(Settings(role=role, webhook_event_loop=EventLoop.UVLOOP)) is None


def test_asyncio_when_asked() -> None:
    settings = Settings(role=Role.WEBHOOK, webhook_event_loop=EventLoop.ASYNCIO)
    assert loop_factory(settings) is None


def test_the_setting_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEDLEASE_WEBHOOK_EVENT_LOOP", "asyncio")
    assert Settings.from_env().webhook_event_loop is EventLoop.ASYNCIO


def test_without_uvloop_installed_asyncio_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the import system: ImportError
    with caplog.at_level(logging.WARNING, logger="fencedlease.webhook.wiring"):
        assert event_loop_factory(EventLoop.UVLOOP) is None
    assert "uvloop is not installed" in caplog.text


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
