"""Fixtures of the integration tests (the control plane itself is in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fencedlease.local.cluster import LocalCluster

from .fence_harness import FenceHarness, start_harness, stop_harness


@pytest.fixture(scope="module")
async def fence(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[FenceHarness]:
    """An in-process fence webhook for the module (see :mod:`.fence_harness`)."""
    harness = await start_harness(cluster, tmp_path_factory.mktemp("webhook-tls"))
    try:
        yield harness
    finally:
        await stop_harness(harness)
