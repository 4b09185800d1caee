"""The API client's aiohttp session skips ``trust_env`` lookups only where they can find
nothing (no proxy variables, no netrc file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from fencedlease import kube

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "NETRC")


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


async def test_a_bare_environment_turns_the_lookups_off(bare_environment: None) -> None:
    async with client.ApiClient() as api:
        assert api.rest_client.pool_manager._trust_env  # kubernetes_asyncio's default
        kube.KubeApi(api)
        assert not api.rest_client.pool_manager._trust_env


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "NETRC"])
async def test_a_proxy_or_netrc_setting_keeps_them(
    bare_environment: None, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "http://proxy.example:3128")
    async with client.ApiClient() as api:
        kube.KubeApi(api)
        assert api.rest_client.pool_manager._trust_env


async def test_a_netrc_file_keeps_them(bare_environment: None, tmp_path: Path) -> None:
    (tmp_path / ".netrc").write_text("machine example.com login a password b\n")
    async with client.ApiClient() as api:
        assert not kube.skip_environment_lookups(api)
        assert api.rest_client.pool_manager._trust_env
