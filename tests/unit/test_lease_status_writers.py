"""A status another writer puts on a lease after ours is seen, and put right.

The controller keeps its own last status write of a lease while the watch has not shown the
lease since (newer than an event still in flight). It used to keep it until leadership
changed: a signed status that someone else wrote afterwards (a replica of the previous release
during ``helm upgrade`` wrote ``phase: Unavailable`` over a held grant in e2e/test_40_day2.py)
stayed hidden behind ours, no pass found anything to write, and the lease showed Unavailable
for good.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fencedlease.authority.proof import TokenProofs
from fencedlease.authority.types import LeaseKey
from fencedlease.controller import handlers
from fencedlease.controller.leases import LeaseCache, LeaseObject
from fencedlease.models import FencedLeaseStatus, Phase

PROOFS = TokenProofs(b"k" * 32)
KEY = LeaseKey("ns", "report")


def signed(phase: str, token: int = 41, lease_id: str = "id-41") -> dict[str, Any]:
    proof = PROOFS.sign(KEY.namespace, KEY.name, lease_id, token)
    return {
        "phase": phase,
        "holder": "w-0",
        "fencingToken": token,
        "leaseId": lease_id,
        "tokenProof": proof,
    }


def body(version: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": KEY.namespace,
            "name": KEY.name,
            "uid": "u",
            "generation": 1,
            "resourceVersion": version,
        },
        "spec": {"leaseDurationSeconds": 60, "holderSelector": {"matchLabels": {"a": "b"}}},
        "status": status,
    }


def obj(version: str, status: dict[str, Any]) -> LeaseObject:
    return LeaseObject.from_body(body(version, status))


OURS = FencedLeaseStatus.model_validate(signed("Held"))


def cache_with_a_lease() -> LeaseCache:
    cache = LeaseCache(PROOFS)
    cache.upsert(obj("4", {}))
    return cache


def test_our_write_is_the_truth_until_the_watch_shows_the_lease_again() -> None:
    cache = cache_with_a_lease()
    cache.written(KEY, OURS)
    assert cache.status(KEY) == OURS  # the watch still shows version 4
    assert cache.upsert(obj("5", signed("Held"))) is False  # our own write coming back
    assert cache.status(KEY) == OURS


def test_a_signed_status_written_after_ours_is_what_the_next_pass_starts_from() -> None:
    cache = cache_with_a_lease()
    cache.written(KEY, OURS)
    cache.upsert(obj("5", signed("Held")))
    assert cache.upsert(obj("6", signed("Unavailable"))) is True  # someone else's, signed
    shown = cache.status(KEY)
    assert shown is not None and shown.phase is Phase.UNAVAILABLE
    assert cache.unverified(KEY) is None  # its proof is good: nothing to report, only to fix


def test_our_write_coming_back_before_we_recorded_it_hides_nothing_after_it() -> None:
    # The interleaving that failed the integration test: the watch delivered our write's
    # event while the PATCH's response was still on its way, then another writer's.
    cache = cache_with_a_lease()
    assert cache.upsert(obj("5", signed("Held"))) is True  # not known to be ours yet
    cache.written(KEY, OURS)
    assert cache.upsert(obj("6", signed("Unavailable"))) is True
    shown = cache.status(KEY)
    assert shown is not None and shown.phase is Phase.UNAVAILABLE


def test_a_status_changed_by_another_writer_pokes_the_lease() -> None:
    cache = cache_with_a_lease()
    pokes: list[LeaseKey] = []
    rt: Any = SimpleNamespace(leases=cache, scheduler=SimpleNamespace(poke=pokes.append))
    cache.written(KEY, OURS)
    handlers.on_lease(rt, {"type": "MODIFIED", "object": body("5", signed("Held"))})
    assert pokes == []  # our own write: the scheduler already has the lease
    handlers.on_lease(rt, {"type": "MODIFIED", "object": body("6", signed("Unavailable"))})
    assert pokes == [KEY]
