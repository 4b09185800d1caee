"""A lease pass's etcd steps (controller/steps.py): every transition in one pure function,
with the time handed in."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fencedlease.controller.steps import DUE_SLACK, Facts, Step, next_step, renewable

LIVE = Facts(
    due=100.0, superseded=False, holder_eligible=True, ending_asked=False, never_granted=False
)
"""This term's live grant, due at 100, its holder eligible."""
NEW = Facts(
    due=None, superseded=False, holder_eligible=False, ending_asked=False, never_granted=True
)
"""A lease nothing says was ever granted."""


def test_a_due_live_grant_renews_without_a_read() -> None:
    assert next_step(None, LIVE, now=100.0) is Step.RENEW
    assert next_step(None, LIVE, now=100.0 - DUE_SLACK) is Step.RENEW  # the scheduler's slack
    assert next_step(None, LIVE, now=100.0 - 2 * DUE_SLACK) is Step.DECIDE  # early: read


@pytest.mark.parametrize(
    "change",
    [
        {"due": None},  # no live grant of this term
        {"superseded": True},  # a signed status shows a newer token
        {"holder_eligible": False},  # its holder left, is not Ready, or was re-created
        {"ending_asked": True},  # a force release or a holder's release is pending
    ],
)
def test_anything_else_about_the_grant_is_decided_on_a_read(change: dict[str, object]) -> None:
    facts = replace(LIVE, **change)  # type: ignore[arg-type]
    assert not renewable(facts, now=200.0)
    assert next_step(None, facts, now=200.0) is Step.DECIDE


def test_a_lease_never_granted_is_granted_without_a_read_then_decided_on_one() -> None:
    assert next_step(None, NEW, now=0.0) is Step.GRANT_UNREAD
    # unread, etcd held a record we did not know of, or the decision was not a grant
    assert next_step(Step.GRANT_UNREAD, NEW, now=0.0) is Step.DECIDE


def test_a_refused_renewal_falls_to_the_unread_grant_or_a_read() -> None:
    assert next_step(Step.RENEW, replace(LIVE, due=None), now=100.0) is Step.DECIDE
    # the refusal forgot the grant; nothing else says it was granted (no status, no token)
    assert next_step(Step.RENEW, NEW, now=100.0) is Step.GRANT_UNREAD
    # a step already tried is not taken again, even if the facts still allow it
    assert next_step(Step.RENEW, LIVE, now=100.0) is Step.DECIDE


def test_a_decision_on_a_read_is_final() -> None:
    with pytest.raises(ValueError, match="always settles"):
        next_step(Step.DECIDE, LIVE, now=100.0)
