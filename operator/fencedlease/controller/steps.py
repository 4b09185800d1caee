"""Which etcd step a lease's pass takes next: one pure transition function (as h11's
``_state.py`` keeps a connection's transitions in one place).

A pass (:meth:`~.reconciler.LeaseReconciler.reconcile`) drives the grant in etcd with the
cheapest step that can settle it:

* :attr:`Step.RENEW` — this term's live grant is due and its holder is still eligible:
  renew it without a read (the steady state: one etcd transaction, one Pod write);
* :attr:`Step.GRANT_UNREAD` — nothing says the lease was ever granted: grant it without a
  read (the acquire compares on "no record"; grant latency);
* :attr:`Step.DECIDE` — read etcd and decide: keep or let lapse a live generation, hand
  over, grant, or report idle. It always settles the pass.

A step that cannot settle says why (:class:`Unsettled`) and the pass asks :func:`next_step`
again, with what it now knows (:class:`Facts`), until :attr:`Step.DECIDE` settles it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Step(enum.Enum):
    RENEW = "renew"
    GRANT_UNREAD = "grant-unread"
    DECIDE = "decide"


class Unsettled(enum.Enum):
    """Why a step did not settle the pass."""

    REFUSED = "the store refused the renewal (not held as we knew it)"
    NOT_A_GRANT = "unread, the decision would not be a grant"
    BUSY = "unread, etcd holds a record we did not know of"


@dataclass(frozen=True, slots=True)
class Facts:
    """What a pass knows of its lease before its next etcd step (values only).

    ``due``: when this term's live grant's renewal falls due (``None``: no live grant of this
    term); ``superseded``: a signed status shows a newer token than that grant's;
    ``holder_eligible``: its holder Pod (same UID) is still an eligible candidate;
    ``ending_asked``: a force release or a holder's release is pending; ``never_granted``:
    nothing says the lease was ever granted (no status grant, nothing of ours, no force
    release, no release, no signed token, no Pod annotated for it)."""

    due: float | None
    superseded: bool
    holder_eligible: bool
    ending_asked: bool
    never_granted: bool


WAKE_SLACK = 0.005
"""The leases scheduler runs every key due within this of its wake in that wake: the renewals
of one slot (:func:`~.projection.tick_anchor`) fall due microseconds to milliseconds apart,
each delay computed from its own pass's clock reading, and run together."""
DUE_SLACK = 2 * WAKE_SLACK
"""A renewal this close to its due time counts as due (the scheduler's float arithmetic and
its :data:`WAKE_SLACK`): it renews without a read, not a pass early."""


def renewable(facts: Facts, now: float) -> bool:
    """Can the live grant be renewed without a read, now? (pure)"""
    return (
        facts.due is not None
        and not facts.ending_asked
        and now >= facts.due - DUE_SLACK
        and not facts.superseded
        and facts.holder_eligible
    )


def next_step(tried: Step | None, facts: Facts, now: float) -> Step:
    """The pass's next etcd step, after ``tried`` did not settle it (``None``: its first).
    Pure: every transition of a pass's etcd part is here."""
    if tried is None and renewable(facts, now):
        return Step.RENEW
    if tried in (None, Step.RENEW) and facts.never_granted:
        return Step.GRANT_UNREAD
    if tried is Step.DECIDE:
        raise ValueError("a decision on a read always settles the pass")
    return Step.DECIDE
