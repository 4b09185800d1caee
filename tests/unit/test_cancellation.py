"""A cancelled task stops, even when its bounded wait ends in the same loop iteration.

Regression (issue 14 item 4): the fence harness's teardown cancelled its ArtifactRecorder task
and waited for it until the 90 s test timeout.  The recorder was in an etcd round trip,
``EtcdStore._rpc``, bounded with ``asyncio.wait_for``: on Python 3.11, when the call completes
in the iteration the cancellation arrives, ``wait_for`` returns the result and drops the
cancellation, so the recorder went on watching forever.  ``asyncio.timeout`` keeps it.  The
interleaving is forced, not hoped for: the call is held on a future, then the future is
resolved and the task cancelled with no await in between.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from fencedlease.store.etcd import EtcdStore


async def test_rpc_keeps_a_cancellation_that_arrives_as_the_call_completes() -> None:
    store = EtcdStore(["http://127.0.0.1:1"], timeout=30)
    # A connected client that is never used: the call is ours.
    store._conn._client = SimpleNamespace(connected=True)  # type: ignore[assignment]
    entered = asyncio.Event()
    answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def call(_: Any) -> str:
        entered.set()
        return await answer

    task = asyncio.create_task(store._rpc("read", call))
    async with asyncio.timeout(10):
        await entered.wait()  # the round trip is in flight
    answer.set_result("response")  # etcd answers ...
    task.cancel()  # ... in the same iteration the caller is cancelled
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert task.cancelled()


def test_the_operator_bounds_no_wait_with_wait_for() -> None:
    """The rule holds everywhere in the operator (the Lease elector's requests were the last)."""
    import ast
    from pathlib import Path

    import fencedlease

    root = Path(fencedlease.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "wait_for":
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == [], f"asyncio.wait_for in {offenders}: use asyncio.timeout"
