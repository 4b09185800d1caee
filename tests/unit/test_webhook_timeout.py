"""The webhook's fence check follows the configured admission timeoutSeconds.

A fixed 4 s budget outlived a configured 1-3 s timeout: the API server gave up first and the
writer saw a bare timeout instead of ``unavailable`` with its reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pydantic
import pytest

from fencedlease.authority.types import FenceRead
from fencedlease.registration.selfregistration import desired_configuration
from fencedlease.settings import Settings
from fencedlease.webhook.checker import FenceChecker, check_budget
from fencedlease.webhook.server import AdmissionServer

from .reviews import answer, art, review


@pytest.mark.parametrize(
    ("timeout", "budget"), [(1, 0.5), (2, 1.5), (3, 2.4), (5, 4.0), (10, 8.0), (30, 24.0)]
)
def test_the_budget_leaves_room_for_the_round_trip(timeout: int, budget: float) -> None:
    assert check_budget(timeout) == pytest.approx(budget)
    assert check_budget(timeout) < timeout


def test_the_timeout_setting_is_the_apis_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCEDLEASE_WEBHOOK_TIMEOUT_SECONDS", "2")
    assert Settings.from_env().webhook_timeout_seconds == 2
    for bad in ("0", "31"):
        monkeypatch.setenv("FENCEDLEASE_WEBHOOK_TIMEOUT_SECONDS", bad)
        with pytest.raises(pydantic.ValidationError, match="webhook_timeout_seconds"):
            Settings.from_env()


def test_server_and_local_registration_use_the_setting(tmp_path: Path) -> None:
    settings = Settings(webhook_cert_dir=tmp_path, webhook_timeout_seconds=3)

    async def lookup(namespace: str, name: str) -> str | None:
        return "AllowEqual"

    server = AdmissionServer(settings, BlockedStore(), lookup)
    assert server.checker.timeout == pytest.approx(2.4)
    hooks = desired_configuration(settings, 9443, "Q0E=")["webhooks"]
    assert [hook["timeoutSeconds"] for hook in hooks] == [3, 3, 3]


class BlockedStore:
    """An etcd that never answers (the read waits on an event nobody sets)."""

    def __init__(self) -> None:
        self.never = asyncio.Event()
        self.called = asyncio.Event()

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
        self.called.set()
        await self.never.wait()
        raise AssertionError("unreachable")  # pragma: no cover

    async def epoch(self) -> str:
        return "epoch"


async def test_a_stuck_store_is_answered_unavailable_within_the_budget() -> None:
    store = BlockedStore()

    async def lookup(namespace: str, name: str) -> str | None:
        return "AllowEqual"

    budget = check_budget(1) / 10  # keep the test fast; the rule is the same
    fence = FenceChecker(store, lookup, None, timeout=budget)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):  # bounded: a regression fails, never hangs
        reply = await fence.review(review("CREATE", art(7)))
    elapsed = loop.time() - started
    assert store.called.is_set()
    allowed, message = answer(reply)
    assert not allowed
    assert message.startswith("unavailable") and f"{budget}s" in message
    assert elapsed < 1.0
