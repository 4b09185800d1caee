"""The store's fence paths as the webhook and the controller use them: one read
(``grant_and_mark``) decided by the pure rule, and ``record_commit`` for committed writes;
an etcd that requires client certificates (:func:`tls_etcd`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fencedlease import pki
from fencedlease.authority import fence as fencing
from fencedlease.authority.types import (
    FenceCode,
    FenceResult,
    FencingPolicy,
    LeaseKey,
    TokenGrant,
)
from fencedlease.local.binaries import binary_path
from fencedlease.local.cluster import LocalCluster, ManagedProcess, free_port
from fencedlease.store.etcd import EtcdStore

NS = "default"


async def check(
    store: EtcdStore,
    name: str,
    token: int,
    policy: FencingPolicy = FencingPolicy.ALLOW_EQUAL,
    *,
    holder: str | None = None,
    namespace: str = NS,
) -> FenceResult:
    """The webhook's verdict on a spec write of ``token`` to an artifact of lease ``name``."""
    read = await store.grant_and_mark(namespace, name, token)
    result, _ = fencing.evaluate(
        LeaseKey(namespace, name),
        read.grant,
        read.mark,
        token,
        policy,
        holder=holder,
        generation=read.generation,
    )
    return result


async def publish(store: EtcdStore, name: str, token: int, **kwargs: object) -> FenceCode:
    """:func:`check`, then what the controller does once such a write is stored."""
    result = await check(store, name, token, **kwargs)  # type: ignore[arg-type]
    if result.code is FenceCode.APPLIED:
        assert (await store.record_commit(NS, name, token)).verified
    return result.code


async def granted(store: EtcdStore, token: int) -> TokenGrant | None:
    """What ``token`` was issued for, in any lease (``None``: no record, no grant version)."""
    return (await store.grant_and_mark(NS, "any", token)).grant


def cached_leases(store: EtcdStore) -> int:
    """Leases the store holds anything about in memory (its caches' largest key set)."""
    return len(store._known.keys() | store._observations.keys() | store._lease_keys.keys())


def mark_of(cluster: LocalCluster, namespace: str, lease_name: str) -> int | None:
    """The lease's high-water mark in the cluster's etcd (from a synchronous test)."""

    async def read() -> int | None:
        async with EtcdStore([cluster.etcd_endpoint]) as store:
            mark = await store.high_water_mark(namespace, lease_name)
        return mark.token if mark else None

    return asyncio.run(read())


def tls_etcd(
    tmp_path: Path, client_name: str
) -> tuple[ManagedProcess, str, pki.KeyPair, pki.KeyPair]:
    """A started etcd requiring client certificates (mutual TLS, like the chart's external
    etcd): the process, its endpoint, its CA and a client certificate for ``client_name``."""
    ca = pki.ensure_ca(tmp_path / "pki")
    server = pki.ensure_cert(ca, tmp_path / "pki", "server", "etcd", hosts=("127.0.0.1",))
    client = pki.ensure_cert(ca, tmp_path / "pki", "client", client_name, client=True)
    endpoint = f"https://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    process = ManagedProcess(
        "etcd-tls",
        [
            str(binary_path("etcd")),
            "--name=default",
            f"--data-dir={tmp_path / 'data'}",
            f"--listen-client-urls={endpoint}",
            f"--advertise-client-urls={endpoint}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            f"--cert-file={server.cert}",
            f"--key-file={server.key}",
            f"--trusted-ca-file={ca.cert}",
            "--client-cert-auth",
            "--log-level=warn",
        ],
        tmp_path / "etcd.log",
    )
    process.start()
    return process, endpoint, ca, client
