"""Pure admission logic and the checker with an in-memory store (no API server, no etcd)."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from fencedlease import pki
from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.types import FencingPolicy as ModelPolicy
from fencedlease.registration.selfregistration import desired_configuration, difference
from fencedlease.settings import Settings
from fencedlease.webhook import admission, reviews
from fencedlease.webhook.server import AdmissionServer

from .reviews import (
    NS,
    answer,
    art,
    checker,
    commit,
    grant,
    review,
)


async def test_stale_unknown_mismatch_and_order_with_stored_object() -> None:
    store = AsyncMemoryStore()
    a, b = grant(store, "pod-a"), grant(store, "pod-b")
    other = grant(store, "pod-c", lease="other")
    c = checker(store)
    assert answer(await c.review(review("CREATE", art(b))))[0]
    commit(store, b)
    ok, msg = answer(await c.review(review("CREATE", art(a))))  # re-create after delete
    assert not ok and msg.startswith(f"stale_fence: token {a} is below the high-water mark {b}")
    ok, msg = answer(await c.review(review("CREATE", art(999))))
    assert not ok and msg.startswith("unknown_token: token 999")
    ok, msg = answer(await c.review(review("CREATE", art(other))))
    assert not ok and msg.startswith("lease_mismatch")
    # a stored token never issued for the lease orders nothing (written past the fence) ...
    assert answer(await c.review(review("UPDATE", art(b, "x", rv="2"), art(b + 50, rv="2"))))[0]
    # ... an issued one counts even if etcd's mark were lower (not recorded yet)
    d = grant(store, "pod-d")
    ok, msg = answer(await c.review(review("UPDATE", art(b, "x", rv="2"), art(d, rv="2"))))
    assert not ok and msg.startswith(f"stale_fence: token {b} is below the high-water mark {d}")


async def test_duplicates_retries_and_metadata_only_updates() -> None:
    store = AsyncMemoryStore()
    t = grant(store)
    c = checker(store)
    old = art(t, "p1", op="op-1", rv="5")
    ok, msg = answer(await c.review(review("UPDATE", art(t, "p1", op="op-1", rv="5"), old)))
    assert not ok and msg.startswith("duplicate: operation op-1 was already applied")
    assert answer(await c.review(review("UPDATE", art(t, "p2", op="op-2", rv="5"), old)))[0]
    labelled = art(t, "p1", op="op-1", rv="5")
    labelled["metadata"]["labels"] = {"a": "b"}
    assert answer(await c.review(review("UPDATE", labelled, old)))[0]


async def test_strictly_greater_and_dry_run_and_precondition() -> None:
    store = AsyncMemoryStore()
    t = grant(store)
    c = checker(store, policy=ModelPolicy.STRICTLY_GREATER.value)
    assert answer(await c.review(review("CREATE", art(t), dry_run=True)))[0]
    assert store.auth.high_water_mark(NS, "l") is None  # dry run: no advance
    assert answer(await c.review(review("UPDATE", art(t, "y", rv="1"), art(t, rv="2"))))[0] is False
    assert store.auth.high_water_mark(NS, "l") is None  # stale rv: the API server refuses it
    assert answer(await c.review(review("CREATE", art(t))))[0]
    assert store.auth.high_water_mark(NS, "l") is None  # admission never moves the mark
    commit(store, t)
    mark = store.auth.high_water_mark(NS, "l")
    assert mark is not None and mark.token == t
    ok, msg = answer(await c.review(review("UPDATE", art(t, "z", rv="3"), art(t, rv="3"))))
    assert not ok and msg.startswith(f"stale_fence: token {t} is not above")


async def test_status_rule_and_holder_binding() -> None:
    store = AsyncMemoryStore()
    t = grant(store, "pod-a")
    c = checker(store, allow_non_pod=False)
    old = art(t, rv="4")
    ok, _ = answer(await c.review(review("UPDATE", art(t, rv="4", accepted=t), old, sub="status")))
    assert ok
    ok, msg = answer(
        await c.review(review("UPDATE", art(t, rv="4", accepted=t - 1), old, sub="status"))
    )
    assert not ok and msg.startswith("stale_fence: status.acceptedFence")
    pod = {
        "username": f"system:serviceaccount:{NS}:sa",
        "extra": {reviews.POD_NAME_EXTRA: ["pod-b"]},
    }
    ok, msg = answer(await c.review(review("CREATE", art(t), user=pod)))
    assert not ok and msg.startswith("holder_mismatch") and "pod-a, not pod-b" in msg
    ok, msg = answer(await c.review(review("CREATE", art(t))))
    assert not ok and msg.startswith("holder_mismatch") and "allowed writers" in msg
    pod["extra"] = {reviews.POD_NAME_EXTRA: ["pod-a"]}
    assert answer(await c.review(review("CREATE", art(t), user=pod)))[0]


async def test_unavailable_store_and_missing_lease_deny() -> None:
    store = AsyncMemoryStore()
    t = grant(store)
    store.fail = True
    ok, msg = answer(await checker(store).review(review("CREATE", art(t))))
    assert not ok and msg.startswith("unavailable: etcd_error")
    store.fail = False
    ok, msg = answer(await checker(store, policy=None).review(review("CREATE", art(t))))
    assert not ok and msg.startswith("lease_mismatch") and "does not exist" in msg
    reply = await checker(store).review({"kind": "Nope"})
    assert reply["response"]["allowed"] is False


def test_invalid_specs() -> None:
    bad = admission.parse_review(review("CREATE", art(0)))
    assert isinstance(bad, reviews.Verdict) and not bad.allowed
    assert "spec.fencingToken" in bad.message


def test_local_registration_routes_each_review_kind_to_its_own_path() -> None:
    want = desired_configuration(Settings(webhook_cert_dir=Path("/x")), 9443, "Q0E=")
    routed = {
        hook["name"]: (hook["clientConfig"]["url"], [r["resources"] for r in hook["rules"]])
        for hook in want["webhooks"]
    }
    assert routed == {
        "fence.fencedlease.io": (
            "https://127.0.0.1:9443/fence",
            [["fencedartifacts", "fencedartifacts/status"]],
        ),
        "release.fencedlease.io": ("https://127.0.0.1:9443/fence-release", [["fencedreleases"]]),
        "claim.fencedlease.io": ("https://127.0.0.1:9443/fence-claim", [["fencedclaims"]]),
    }


def test_registration_difference() -> None:
    settings = Settings(webhook_cert_dir=Path("/x"))
    want = desired_configuration(settings, 9443, "Q0E=")
    assert difference(None, want) == "deleted"
    assert difference(want, want) is None
    hook = want["webhooks"][0]
    assert hook["failurePolicy"] == "Fail" and hook["reinvocationPolicy"] == "Never"
    assert hook["sideEffects"] == "NoneOnDryRun" and hook["matchPolicy"] == "Equivalent"
    changed = {**want, "webhooks": [{**hook, "failurePolicy": "Ignore"}, *want["webhooks"][1:]]}
    assert (
        difference(changed, want)
        == "altered: webhooks[fence.fencedlease.io].failurePolicy was changed"
    )


async def test_server_serves_tls_and_reloads_renewed_certificates(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, webhook_cert_dir=certs, webhook_registration="url"
    )
    server = AdmissionServer(
        settings, AsyncMemoryStore(), lambda ns, n: "AllowEqual", reload_interval=3600
    )
    await server.start()
    try:

        async def healthz(ca: Path) -> str:
            ctx = ssl.create_default_context(cafile=str(ca))
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"https://127.0.0.1:{server.port}/healthz", ssl=ctx) as resp,
            ):
                return await resp.text()

        assert await healthz(certs / "ca.crt") == "ok"
        # Renew: a new CA and serving pair in place of the old files.
        fresh = tmp_path / "fresh"
        ca = pki.ensure_ca(fresh, "ca", "renewed-ca")
        pair = pki.ensure_cert(ca, fresh, "tls", "127.0.0.1", hosts=("127.0.0.1",))
        (certs / "tls.crt").write_bytes(pair.cert_pem())
        (certs / "tls.key").write_bytes(pair.key_pem())
        assert server.reload_certificates()
        assert await healthz(fresh / "ca.crt") == "ok"
        with pytest.raises(aiohttp.ClientConnectorError):
            await healthz(certs / "ca.crt")
    finally:
        await server.stop()
