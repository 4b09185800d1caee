"""Pure status projection of a FencedLease: what the status says after each outcome.

Every function takes the current status and returns a new one (no I/O, the time is passed
in), so the reconciler only sequences store calls and writes, and these rules are unit-tested
on their own.  Conditions follow the Kubernetes API conventions (docs/design.md, "Status"):
``Held``, ``EtcdAvailable``, ``TokensMonotonic`` and ``SpecValid``, summarised by ``Ready``,
each stamped with the ``observedGeneration`` it was computed from.  A pass ends with
:func:`reconciled` or :func:`invalid_spec`, which stamp the generation and derive ``Ready``.

A renewal is published on the holder Pod (its ``valid-until`` annotation), not here: the status
shows the grant and its deadline policy (``acquireTime``, ``leaseDurationSeconds``,
``renewIntervalSeconds``), changes when the grant, holder, phase or a condition changes, and
records a renewal in ``renewTime`` only when :func:`record_renewal` says so (the first of each
controller term, then at most every :data:`STATUS_REFRESH_SECONDS`). docs/operations.md, "What
a renewal writes", says why.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from fencedlease.authority.types import (
    Acquired,
    EndedBy,
    LeaseRecord,
    LeaseState,
    LeaseView,
    Renewed,
    StoreUnavailable,
)
from fencedlease.models import (
    ConditionType,
    FencedLeaseStatus,
    Phase,
    rfc3339,
    set_condition,
    stamp_generation,
)

ConditionValue = Literal["True", "False", "Unknown"]

RENEW_FRACTION = 1 / 3
"""The controller renews a live grant when this fraction of its duration has passed."""

STATUS_REFRESH_SECONDS = 300.0
"""A renewal is recorded in ``status.renewTime`` at most this often (plus the first renewal of
each controller term): the cadence of the kubelet's node status report, whose per-heartbeat
writes moved to a Lease for the same reason."""


def renew_interval(duration: float) -> float:
    """Seconds between renewals of a grant of ``duration`` seconds."""
    return max(0.1, duration * RENEW_FRACTION)


RENEW_SLOT_SECONDS = 0.5
"""Renewal ticks start on this grid of the controller's clock, so that the renewals of many
holder Pods fall due at the same instants and run together (docs/performance.md, "Renewals
in slots")."""


def tick_anchor(now: float, slot: float = RENEW_SLOT_SECONDS) -> float:
    """The anchor of a holder Pod's new renewal ticks: ``now`` rounded down to the slot grid.
    Never after ``now``, so the first renewal on these ticks is at most ``interval`` away."""
    return (now // slot) * slot


def next_renewal(now: float, anchor: float, interval: float) -> float:
    """Seconds from ``now`` to the next renewal of a grant renewed every ``interval`` on the
    ticks ``anchor + k * interval`` of its holder Pod: never later than ``interval`` from
    ``now`` (never later than without the ticks), and the same tick for every lease of one Pod
    with that interval, so their renewals share one Pod write. A lease joining the Pod's
    ticks renews early once; renewing early is always safe (its deadline counts from the
    moment the renewal is sent)."""
    ticks = int((now - anchor) // interval) + 1
    return max(0.0, anchor + ticks * interval - now)


def record_renewal(last_recorded: float | None, now: float) -> bool:
    """Whether a renewal at ``now`` (monotonic) is written to the status: the first one this
    controller term (``last_recorded`` ``None``), then one per :data:`STATUS_REFRESH_SECONDS`."""
    return last_recorded is None or now - last_recorded >= STATUS_REFRESH_SECONDS


def _policy(duration: float) -> dict[str, object]:
    return {
        "lease_duration_seconds": float(duration),
        "renew_interval_seconds": renew_interval(duration),
        "expire_time": None,
    }


# What a pass that could not reach etcd still knows about the current generation: the other
# conditions (Held, TokensMonotonic) keep the generation of the last pass that read etcd.
_KNOWN_WITHOUT_ETCD = (ConditionType.ETCD_AVAILABLE, ConditionType.SPEC_VALID)


def with_condition(
    status: FencedLeaseStatus,
    type_: str,
    value: ConditionValue,
    reason: str,
    message: str,
    now: dt.datetime,
) -> FencedLeaseStatus:
    conditions = set_condition(
        status.conditions, type_, value, reason, message, now, status.observed_generation
    )
    return status.model_copy(update={"conditions": conditions})


def condition_status(status: FencedLeaseStatus, type_: str) -> str | None:
    return next((c.status for c in status.conditions if c.type == type_), None)


def with_grant(
    status: FencedLeaseStatus, lease_id: str, token: int, proof: str
) -> FencedLeaseStatus:
    """The grant read from etcd (or just issued), with the authority's proof of its token."""
    return status.model_copy(
        update={"lease_id": lease_id, "fencing_token": token, "token_proof": proof}
    )


def granted(
    status: FencedLeaseStatus, result: Acquired, proof: str, now: dt.datetime
) -> FencedLeaseStatus:
    status = with_grant(status, result.lease_id, result.token, proof).model_copy(
        update={
            "phase": Phase.HELD,
            "holder": result.holder,
            "acquire_time": rfc3339(result.acquired_at),
            "renew_time": rfc3339(result.acquired_at),
            "transitions": (status.transitions or 0) + 1,
            **_policy(result.duration),
        }
    )
    status = with_condition(status, "Held", "True", "Granted", f"held by Pod {result.holder}", now)
    return with_condition(status, "TokensMonotonic", "True", "AboveFloor", "", now)


def renewed(
    status: FencedLeaseStatus, result: Renewed, now: dt.datetime, *, record: bool = False
) -> FencedLeaseStatus:
    """The grant was renewed.  ``record`` (:func:`record_renewal`): also move ``renewTime``;
    otherwise nothing the status shows changes once the first renewal said ``Renewed``."""
    update = _policy(result.duration)
    if record:
        update["renew_time"] = rfc3339(result.renewed_at)
    status = status.model_copy(update=update)
    return with_condition(status, "Held", "True", "Renewed", f"held by Pod {result.holder}", now)


def held(
    status: FencedLeaseStatus, record: LeaseRecord, token: int, proof: str, now: dt.datetime
) -> FencedLeaseStatus:
    """A live generation exists.  One granted by another replica (or whose status was lost) is
    adopted: its exact grant time is that replica's, the first time we saw it is the best we
    know."""
    update: dict[str, object] = {
        "phase": Phase.HELD,
        "holder": record.holder,
        **_policy(record.duration_seconds),
    }
    if status.lease_id != record.lease_id:
        update["transitions"] = (status.transitions or 0) + (1 if status.lease_id else 0)
        update["acquire_time"] = rfc3339(now)
    return with_grant(status.model_copy(update=update), record.lease_id, token, proof)


def not_renewing(
    status: FencedLeaseStatus, holder: str, why: str, remaining: float, now: dt.datetime
) -> FencedLeaseStatus:
    return with_condition(
        status,
        "Held",
        "True",
        "HolderNotReady",
        f"Pod {holder} is {why}: not renewing; the lease expires in {remaining:.1f}s",
        now,
    )


def no_candidate(pod_scope: str | None) -> str:
    """The ``NoCandidate`` message; with a scoped Pod watch it names the label every
    candidate must also carry (the usual reason a Pod that matches is never chosen)."""
    msg = "no Running and Ready Pod matches spec.holderSelector"
    if pod_scope:
        msg += f" (the controller sees only Pods labelled {pod_scope})"
    return msg


def idle(
    status: FencedLeaseStatus,
    view: LeaseView | None,
    proof: str | None,
    now: dt.datetime,
    pod_scope: str | None = None,
) -> FencedLeaseStatus:
    """No live generation and no candidate: Pending, Released or Expired."""
    if view is not None and proof is not None:
        status = with_grant(status, view.record.lease_id, view.token, proof)
    if view is None:
        phase = Phase.PENDING
        reason, msg = "NoCandidate", no_candidate(pod_scope)
    elif view.record.state is LeaseState.RELEASED and view.record.ended_by in (
        EndedBy.RELEASE,
        EndedBy.FORCE_RELEASE,
    ):
        phase = Phase.RELEASED
        reason, msg = "Released", f"lease {view.record.lease_id} was released"
    else:
        phase = Phase.EXPIRED
        reason, msg = "Expired", f"lease {view.record.lease_id} expired; no candidate"
    status = status.model_copy(
        update={
            "phase": phase,
            "holder": None,
            "lease_duration_seconds": None,
            "renew_interval_seconds": None,
            "expire_time": None,
        }
    )
    return with_condition(status, "Held", "False", reason, msg, now)


def unavailable(
    status: FencedLeaseStatus, result: StoreUnavailable, now: dt.datetime
) -> tuple[FencedLeaseStatus, str | None]:
    """The store could not decide.  Returns the new status and the Event reason to post when
    the condition has just turned False (``None``: already reported)."""
    if result.code == "restore_guard":
        type_, reason = "TokensMonotonic", "RestoreGuard"
    else:
        type_, reason = "EtcdAvailable", "EtcdUnavailable"
    newly = condition_status(status, type_) != "False"
    status = status.model_copy(update={"phase": Phase.UNAVAILABLE})
    status = with_condition(status, type_, "False", reason, result.reason, now)
    return status, (reason if newly else None)


def ready(status: FencedLeaseStatus) -> tuple[ConditionValue, str, str]:
    """The ``Ready`` summary: True only while the lease is held, renewed by a healthy holder,
    with etcd reachable, tokens above the restore floor and a valid spec.  Otherwise the first
    failing condition, in that order of blame, names the reason."""
    by_type = {c.type: c for c in status.conditions}
    for type_ in (
        ConditionType.SPEC_VALID,
        ConditionType.TOKENS_MONOTONIC,
        ConditionType.ETCD_AVAILABLE,
    ):
        cond = by_type.get(type_)
        if cond is not None and cond.status == "False":
            return "False", cond.reason, cond.message
    held_cond = by_type.get(ConditionType.HELD)
    if held_cond is None:
        return "Unknown", "NotObserved", "no pass has seen the lease held or free yet"
    not_renewing = held_cond.reason == "HolderNotReady"
    if held_cond.status != "True" or not_renewing or status.phase is not Phase.HELD:
        return "False", held_cond.reason, held_cond.message
    return (
        "True",
        "Held",
        f"held by Pod {status.holder} with fencing token {status.fencing_token} "
        f"(lease {status.lease_id})",
    )


def summarized(
    status: FencedLeaseStatus, generation: int, now: dt.datetime, only: tuple[str, ...] | None
) -> FencedLeaseStatus:
    """Stamp ``generation`` on the conditions this pass re-evaluated and derive ``Ready``."""
    status = status.model_copy(
        update={
            "observed_generation": generation,
            "conditions": stamp_generation(status.conditions, generation, only),
        }
    )
    value, reason, message = ready(status)
    return with_condition(status, ConditionType.READY, value, reason, message, now)


def reconciled(status: FencedLeaseStatus, generation: int, now: dt.datetime) -> FencedLeaseStatus:
    """The end of a pass over ``generation`` with a valid spec: every condition it decided
    describes that generation, and ``Ready`` sums them up."""
    status = with_condition(status, ConditionType.SPEC_VALID, "True", "Valid", "", now)
    etcd_down = condition_status(status, ConditionType.ETCD_AVAILABLE) == "False"
    return summarized(status, generation, now, _KNOWN_WITHOUT_ETCD if etcd_down else None)


def invalid_spec(
    status: FencedLeaseStatus, generation: int, error: str, now: dt.datetime
) -> FencedLeaseStatus:
    """The spec of ``generation`` cannot be read: nothing else was evaluated against it."""
    status = with_condition(status, ConditionType.SPEC_VALID, "False", "InvalidSpec", error, now)
    return summarized(status, generation, now, (ConditionType.SPEC_VALID,))
