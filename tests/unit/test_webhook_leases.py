"""The webhook's lease policy table (role=webhook) and its review JSON codec."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from fencedlease.authority.types import FencingPolicy, LeaseKey
from fencedlease.models import FencedLeaseSpec
from fencedlease.webhook.leases import (
    ApiLeaseLookup,
    CachedLeaseLookup,
    PolicyTable,
    WatchedLeaseLookup,
    policy_of,
)
from fencedlease.webhook.server import dumps, loads


def lease(name: str, policy: str | None = "StrictlyGreater", ns: str = "ns") -> dict[str, Any]:
    spec: dict[str, Any] = {} if policy is None else {"fencingPolicy": policy}
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def test_policy_of_defaults_to_allow_equal_and_reads_strictly_greater() -> None:
    assert policy_of(lease("a", None)) is FencingPolicy.ALLOW_EQUAL
    assert policy_of(lease("a", "StrictlyGreater")) is FencingPolicy.STRICTLY_GREATER
    assert policy_of({"spec": "nonsense"}) is FencingPolicy.ALLOW_EQUAL
    # A value the CRD would refuse: the strictest reading, never the loosest.
    assert policy_of(lease("a", "Whatever")) is FencingPolicy.STRICTLY_GREATER


def test_the_table_answers_nothing_until_it_is_listed() -> None:
    table = PolicyTable()
    table.apply("ADDED", lease("a"))
    assert table.get(LeaseKey("ns", "a")) is None  # not synced: ask the API server
    table.replace([lease("a")])
    assert table.get(LeaseKey("ns", "a")) is FencingPolicy.STRICTLY_GREATER


def test_the_table_follows_watch_events() -> None:
    table = PolicyTable()
    table.replace([lease("a", "AllowEqual"), lease("gone")])
    table.apply("MODIFIED", lease("a", "StrictlyGreater"))
    table.apply("ADDED", lease("b", None))
    table.apply("DELETED", lease("gone"))
    table.apply("BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    assert table.get(LeaseKey("ns", "a")) is FencingPolicy.STRICTLY_GREATER
    assert table.get(LeaseKey("ns", "b")) is FencingPolicy.ALLOW_EQUAL
    assert table.get(LeaseKey("ns", "gone")) is None


def test_a_lease_being_deleted_is_not_answered_from_the_table() -> None:
    table = PolicyTable()
    table.replace([lease("a")])
    deleting = lease("a")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    table.apply("MODIFIED", deleting)
    assert table.get(LeaseKey("ns", "a")) is None


def test_a_lease_being_deleted_is_no_lease_to_any_lookup() -> None:
    """Issue 31: a lease held by another finalizer after the controller moved its tokens into
    the retention window admitted a write of its newest token to a new artifact."""
    deleting = lease("a")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    table = PolicyTable()
    table.replace([deleting, lease("b")])
    assert table.get(LeaseKey("ns", "a")) is None and table.get(LeaseKey("ns", "b")) is not None

    class Kube:
        async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
            return deleting

    api = ApiLeaseLookup(Kube())  # type: ignore[arg-type]
    assert asyncio.run(api("ns", "a")) is None

    class Cached:
        def get(self, key: LeaseKey) -> object:
            spec = {"leaseDurationSeconds": 30, "holderSelector": {"matchLabels": {"a": "b"}}}
            return SimpleNamespace(spec=FencedLeaseSpec.model_validate(spec), deleting=True)

    assert asyncio.run(CachedLeaseLookup(Cached(), api)("ns", "a")) is None


def test_a_relist_forgets_leases_deleted_while_the_watch_was_down() -> None:
    table = PolicyTable()
    table.replace([lease("a"), lease("b")])
    table.replace([lease("b")])
    assert table.get(LeaseKey("ns", "a")) is None
    assert table.get(LeaseKey("ns", "b")) is FencingPolicy.STRICTLY_GREATER


class Fallback:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, namespace: str, name: str) -> FencingPolicy | None:
        self.calls.append((namespace, name))
        return None


async def test_a_miss_or_an_unsynced_table_asks_the_api_server() -> None:
    fallback = Fallback()
    lookup = WatchedLeaseLookup(None, fallback)  # type: ignore[arg-type]
    assert await lookup("ns", "a") is None  # not synced yet
    lookup.table.replace([lease("a")])
    assert await lookup("ns", "a") is FencingPolicy.STRICTLY_GREATER
    assert await lookup("ns", "new") is None  # a miss is not trusted
    lookup.table.synced = False  # the watch broke: relisting
    assert await lookup("ns", "a") is None
    assert fallback.calls == [("ns", "a"), ("ns", "new"), ("ns", "a")]


def test_loads_judges_hostile_bodies_as_the_standard_library_does() -> None:
    assert loads(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    # A lone surrogate escape: orjson refuses it, json accepts it (the checks say invalid).
    assert loads(json.dumps({"name": "x\ud800"}).encode()) == {"name": "x\ud800"}
    with pytest.raises(RecursionError):
        loads(b"[" * 50_000 + b"]" * 50_000)
    for bad in (b"", b"{", b"\xff\xfe", b"NaN-ish"):
        with pytest.raises(ValueError):
            loads(bad)


def test_dumps_encodes_every_reply() -> None:
    assert json.loads(dumps({"a": "é", "n": 1})) == {"a": "é", "n": 1}
    assert json.loads(dumps({"message": "x\ud800"})) == {"message": "x\ud800"}
