"""The pure status projection (controller/projection.py): conditions per the API conventions.

Each pass ends with ``reconciled`` or ``invalid_spec``: the conditions it decided carry the
generation they describe, and ``Ready`` sums them up with the reason of the first failure.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fencedlease.authority.types import Acquired, Renewed, StoreUnavailable
from fencedlease.controller import projection
from fencedlease.controller.leases import LeaseObject
from fencedlease.models import (
    MAX_CONDITION_MESSAGE,
    Condition,
    FencedLeaseStatus,
    Phase,
    set_condition,
)
from tests.unit.test_reconciler import NS, World

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def cond(status: FencedLeaseStatus, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


def generations(status: FencedLeaseStatus) -> dict[str, int | None]:
    return {c.type: c.observed_generation for c in status.conditions}


def acquired(holder: str = "w-a", token: int = 41) -> Acquired:
    return Acquired(
        lease_id="L1",
        token=token,
        holder=holder,
        duration=15,
        deadline_monotonic=15,
        valid_until=at(14),
        acquired_at=at(0),
    )


def held_pass(generation: int = 3) -> FencedLeaseStatus:
    """A first pass that granted the lease to w-a, spec generation ``generation``."""
    status = projection.with_condition(
        FencedLeaseStatus(), "EtcdAvailable", "True", "Connected", "", at(0)
    )
    status = projection.granted(status, acquired(), "proof", at(0))
    return projection.reconciled(status, generation, at(0))


def test_a_held_lease_is_ready_and_every_condition_describes_its_generation() -> None:
    status = held_pass(generation=3)
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("True", "Held")
    assert "w-a" in ready.message and "41" in ready.message
    assert status.observed_generation == 3
    assert generations(status) == {
        "EtcdAvailable": 3,
        "Held": 3,
        "TokensMonotonic": 3,
        "SpecValid": 3,
        "Ready": 3,
    }
    dumped = status.to_patch()
    assert {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"} == (
        set(dumped["conditions"][0])
    )


def test_a_spec_change_restamps_the_conditions_and_keeps_their_transition_times() -> None:
    first = held_pass(generation=3)
    status = projection.with_condition(first, "EtcdAvailable", "True", "Connected", "", at(5))
    status = projection.reconciled(status, 4, at(5))  # a pass over generation 4, nothing renewed
    assert set(generations(status).values()) == {4}
    assert status.observed_generation == 4
    for c in status.conditions:
        assert c.last_transition_time == cond(first, c.type).last_transition_time
    renewed = Renewed(
        lease_id="L1",
        token=41,
        holder="w-a",
        duration=15,
        deadline_monotonic=20,
        valid_until=at(19),
        renewed_at=at(5),
        renewals=1,
    )
    status = projection.reconciled(projection.renewed(status, renewed, at(5)), 4, at(5))
    assert cond(status, "Held").reason == "Renewed"
    assert cond(status, "Ready").status == "True"


def test_a_holder_that_is_not_ready_keeps_held_but_is_not_ready() -> None:
    status = projection.not_renewing(held_pass(), "w-a", "not Ready", 7.5, at(6))
    status = projection.reconciled(status, 3, at(6))
    assert cond(status, "Held").status == "True"
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", "HolderNotReady")
    assert "7.5s" in ready.message
    assert ready.last_transition_time == "2026-01-01T12:00:06Z"  # True -> False moved it


def test_no_candidate_is_not_ready_with_the_held_reason() -> None:
    status = projection.idle(FencedLeaseStatus(), None, None, at(0))
    status = projection.reconciled(status, 1, at(0))
    assert status.phase is Phase.PENDING
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", "NoCandidate")
    assert ready.observed_generation == 1
    assert "labelled" not in ready.message


def test_no_candidate_names_the_label_a_scoped_pod_watch_needs() -> None:
    """With ``pod_selector`` a Pod that matches the lease but lacks the label is invisible:
    the message says so, since that is the usual reason nothing is chosen."""
    scope = "fencedlease.io/candidate=true"
    status = projection.idle(FencedLeaseStatus(), None, None, at(0), scope)
    held = cond(status, "Held")
    assert held.reason == "NoCandidate"
    assert held.message == (
        "no Running and Ready Pod matches spec.holderSelector "
        "(the controller sees only Pods labelled fencedlease.io/candidate=true)"
    )


def test_etcd_down_is_not_ready_and_leaves_what_it_could_not_check_at_its_generation() -> None:
    status = held_pass(generation=3)
    status, event = projection.unavailable(
        status, StoreUnavailable("etcd_error", "etcd: connection refused"), at(8)
    )
    status = projection.reconciled(status, 4, at(8))
    assert event == "EtcdUnavailable"
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        "EtcdUnavailable",
        "etcd: connection refused",
    )
    # Held and TokensMonotonic were not re-evaluated against generation 4: they still say 3.
    assert generations(status) == {
        "EtcdAvailable": 4,
        "Held": 3,
        "TokensMonotonic": 3,
        "SpecValid": 4,
        "Ready": 4,
    }
    assert status.observed_generation == 4


def test_the_restore_guard_is_the_reason_even_with_etcd_reachable() -> None:
    status = projection.with_condition(
        FencedLeaseStatus(), "EtcdAvailable", "True", "Connected", "", at(0)
    )
    status, _ = projection.unavailable(
        status, StoreUnavailable("restore_guard", "revision 7 is not above token 41"), at(0)
    )
    status = projection.reconciled(status, 2, at(0))
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", "RestoreGuard")
    assert set(generations(status).values()) == {2}


def test_an_invalid_spec_wins_and_stamps_only_what_it_evaluated() -> None:
    status = held_pass(generation=3)
    status = projection.invalid_spec(status, 5, "spec.leaseDurationSeconds: too big", at(9))
    assert status.observed_generation == 5
    ready = cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", "InvalidSpec")
    assert ready.message == "spec.leaseDurationSeconds: too big"
    assert generations(status) == {
        "EtcdAvailable": 3,
        "Held": 3,
        "TokensMonotonic": 3,
        "SpecValid": 5,
        "Ready": 5,
    }
    # Also above an etcd outage: the spec is the user's to fix first.
    status, _ = projection.unavailable(status, StoreUnavailable("etcd_error", "down"), at(10))
    assert projection.ready(status)[1] == "InvalidSpec"


def test_ready_is_unknown_before_any_pass_saw_the_lease_held_or_free() -> None:
    # e.g. the first pass lost the grant race to another replica (Busy): no Held yet.
    status = projection.with_condition(
        FencedLeaseStatus(), "EtcdAvailable", "True", "Connected", "", at(0)
    )
    status = projection.reconciled(status, 1, at(0))
    assert (cond(status, "Ready").status, cond(status, "Ready").reason) == (
        "Unknown",
        "NotObserved",
    )


def test_an_overlong_message_is_cut_to_the_schema_bound() -> None:
    (c,) = set_condition([], "EtcdAvailable", "False", "EtcdUnavailable", "x" * 40000, T0, 1)
    assert len(c.message) == MAX_CONDITION_MESSAGE


# ------------------------------------------------- through the reconciler (in-memory store)


async def test_every_reconciler_pass_ends_with_ready_at_the_lease_generation() -> None:
    def dict_cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
        return next(c for c in status["conditions"] if c["type"] == type_)

    w = World()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    ready = dict_cond(w.status, "Ready")
    assert (ready["status"], ready["observedGeneration"]) == ("True", 1)

    # A spec change (generation 2), and etcd goes away during the next pass.
    w.spec = {**w.spec, "leaseDurationSeconds": 20}
    body = {
        "metadata": {"namespace": NS, "name": "report", "uid": "lease-uid", "generation": 2},
        "spec": w.spec,
        "status": w.status,
    }
    w.leases.upsert(LeaseObject.from_body(body))
    w.store.fail = True
    await w.run()
    ready = dict_cond(w.status, "Ready")
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "False",
        "EtcdUnavailable",
        2,
    )
    assert dict_cond(w.status, "Held")["observedGeneration"] == 1  # not re-checked
    assert w.status["observedGeneration"] == 2

    w.store.fail = False
    await w.run()
    assert {c["observedGeneration"] for c in w.status["conditions"]} == {2}
    assert dict_cond(w.status, "Ready")["status"] == "True"


def test_tick_anchors_fall_on_the_slot_grid_never_after_now() -> None:
    """A holder Pod's ticks start on the controller's slot grid: grants within one slot share
    their renewal instants (whatever Pod holds them), and the first renewal on the new ticks
    is never later than one interval after the grant."""
    slot = projection.RENEW_SLOT_SECONDS
    for now in (1000.0, 1000.1, 1000.49, 1000.5, 1234.567):
        anchor = projection.tick_anchor(now)
        assert anchor <= now < anchor + slot
        assert (anchor / slot).is_integer()
        assert 0 < projection.next_renewal(now, anchor, 10.0) <= 10.0
    assert projection.tick_anchor(1000.1) == projection.tick_anchor(1000.45) == 1000.0
    assert projection.tick_anchor(1000.6) == 1000.5


def test_renewals_fall_on_the_holder_pods_ticks_never_later_than_the_interval() -> None:
    assert projection.next_renewal(100.0, 100.0, 10.0) == 10.0  # the first lease sets the ticks
    assert projection.next_renewal(103.0, 100.0, 10.0) == 7.0  # a later grant joins them early
    assert projection.next_renewal(110.2, 100.0, 10.0) == pytest.approx(9.8)  # late: same ticks
    for now in (100.0, 101.5, 109.99, 250.0):
        assert 0 < projection.next_renewal(now, 100.0, 10.0) <= 10.0
    assert projection.record_renewal(None, 5.0)
    assert not projection.record_renewal(5.0, 5.0 + projection.STATUS_REFRESH_SECONDS - 1)
    assert projection.record_renewal(5.0, 5.0 + projection.STATUS_REFRESH_SECONDS)
