"""Pure status projection of a FencedLease: what the status says after each outcome.

Every function takes the current status and returns a new one (no I/O, the time is passed
in), so the reconciler only sequences store calls and writes, and these rules are unit-tested
on their own.  Conditions follow the Kubernetes API conventions: ``Held``, ``EtcdAvailable``,
``TokensMonotonic`` and ``SpecValid``, each stamped with ``observedGeneration``.
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
    Unavailable,
)
from fencedlease.models import FencedLeaseStatus, Phase, rfc3339, set_condition

ConditionValue = Literal["True", "False", "Unknown"]


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
            "expire_time": rfc3339(result.valid_until),
            "transitions": (status.transitions or 0) + 1,
        }
    )
    status = with_condition(status, "Held", "True", "Granted", f"held by Pod {result.holder}", now)
    return with_condition(status, "TokensMonotonic", "True", "AboveFloor", "", now)


def renewed(status: FencedLeaseStatus, result: Renewed, now: dt.datetime) -> FencedLeaseStatus:
    status = status.model_copy(
        update={
            "renew_time": rfc3339(result.renewed_at),
            "expire_time": rfc3339(result.valid_until),
        }
    )
    return with_condition(status, "Held", "True", "Renewed", f"held by Pod {result.holder}", now)


def held(
    status: FencedLeaseStatus, record: LeaseRecord, token: int, proof: str, now: dt.datetime
) -> FencedLeaseStatus:
    """A live generation exists.  One granted by another replica (or whose status was lost) is
    adopted: its exact grant time is that replica's, the first time we saw it is the best we
    know."""
    update: dict[str, object] = {"phase": Phase.HELD, "holder": record.holder}
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


def idle(
    status: FencedLeaseStatus, view: LeaseView | None, proof: str | None, now: dt.datetime
) -> FencedLeaseStatus:
    """No live generation and no candidate: Pending, Released or Expired."""
    if view is not None and proof is not None:
        status = with_grant(status, view.record.lease_id, view.token, proof)
    if view is None:
        phase = Phase.PENDING
        reason, msg = "NoCandidate", "no Running and Ready Pod matches spec.holderSelector"
    elif view.record.state is LeaseState.RELEASED and view.record.ended_by in (
        EndedBy.RELEASE,
        EndedBy.FORCE_RELEASE,
    ):
        phase = Phase.RELEASED
        reason, msg = "Released", f"lease {view.record.lease_id} was released"
    else:
        phase = Phase.EXPIRED
        reason, msg = "Expired", f"lease {view.record.lease_id} expired; no candidate"
    status = status.model_copy(update={"phase": phase, "holder": None})
    return with_condition(status, "Held", "False", reason, msg, now)


def unavailable(
    status: FencedLeaseStatus, result: Unavailable, now: dt.datetime
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


def reconciled(status: FencedLeaseStatus, generation: int, now: dt.datetime) -> FencedLeaseStatus:
    """Stamp the generation this pass acted on; the spec was valid."""
    status = status.model_copy(update={"observed_generation": generation})
    return with_condition(status, "SpecValid", "True", "Valid", "", now)


def invalid_spec(
    status: FencedLeaseStatus, generation: int, error: str, now: dt.datetime
) -> FencedLeaseStatus:
    status = status.model_copy(update={"observed_generation": generation})
    return with_condition(status, "SpecValid", "False", "InvalidSpec", error, now)
