"""Pure fence check: order rule, grant checks, bounded operation ids, messages."""

from __future__ import annotations

import pytest

from fencedlease.authority import fence
from fencedlease.authority.types import (
    FenceCode,
    FencingPolicy,
    Generation,
    HighWaterMark,
    LeaseKey,
    TokenGrant,
)

ALLOW = FencingPolicy.ALLOW_EQUAL
STRICT = FencingPolicy.STRICTLY_GREATER
JULY = LeaseKey("default", "report-july")


@pytest.mark.parametrize(
    ("hwm", "ops", "token", "policy", "op", "expected"),
    [
        (None, (), 1, ALLOW, None, FenceCode.APPLIED),
        (None, (), 1, STRICT, None, FenceCode.APPLIED),
        (42, (), 41, ALLOW, None, FenceCode.STALE_FENCE),
        (42, (), 41, STRICT, None, FenceCode.STALE_FENCE),
        (42, (), 43, ALLOW, None, FenceCode.APPLIED),
        (42, (), 43, STRICT, "x", FenceCode.APPLIED),
        (42, (), 42, ALLOW, None, FenceCode.APPLIED),
        (42, ("x",), 42, ALLOW, "y", FenceCode.APPLIED),
        (42, ("x",), 42, ALLOW, "x", FenceCode.DUPLICATE),
        (42, ("x",), 43, ALLOW, "x", FenceCode.APPLIED),
        (42, (), 42, STRICT, "x", FenceCode.STALE_FENCE),
    ],
)
def test_check(
    hwm: int | None,
    ops: tuple[str, ...],
    token: int,
    policy: FencingPolicy,
    op: str | None,
    expected: FenceCode,
) -> None:
    assert fence.check(hwm, ops, token, policy, op) is expected


def test_fence_codes_are_the_contract() -> None:
    assert [c.value for c in FenceCode] == [
        "applied",
        "duplicate",
        "stale_fence",
        "unknown_token",
        "lease_mismatch",
        "holder_mismatch",
    ]
    assert [p.value for p in FencingPolicy] == ["AllowEqual", "StrictlyGreater"]


def test_advance_resets_ops_on_new_token_and_bounds_them() -> None:
    hwm = fence.advance(None, 41, "a")
    assert hwm == HighWaterMark(41, ("a",))
    hwm = fence.advance(hwm, 41, "b")
    assert hwm == HighWaterMark(41, ("a", "b"))
    assert fence.advance(hwm, 41, "a") is None  # already recorded
    assert fence.advance(hwm, 41, None) is None  # nothing to remember
    assert fence.advance(hwm, 42, None) == HighWaterMark(42, ())
    many = HighWaterMark(7, tuple(str(i) for i in range(5)))
    bounded = fence.advance(many, 7, "new", max_operation_ids=5)
    assert bounded is not None and bounded.operation_ids == ("1", "2", "3", "4", "new")
    with pytest.raises(ValueError):
        fence.advance(HighWaterMark(42), 41, None)


def test_hwm_json_round_trip() -> None:
    hwm = HighWaterMark(42, ("a", "b"))
    assert HighWaterMark.from_json(hwm.to_json()) == hwm


GRANT_41 = TokenGrant("default", "report-july", "a7", "pod-a")


def test_evaluate_stale_message_names_token_hwm_and_lease() -> None:
    result, new = fence.evaluate(JULY, GRANT_41, HighWaterMark(42), 41, ALLOW)
    assert result.code is FenceCode.STALE_FENCE and new is None
    assert result.message == (
        "stale_fence: token 41 is below the high-water mark 42 of lease default/report-july"
    )
    assert result.high_water_mark == 42 and result.lease == "default/report-july"
    assert not result.allowed


def test_evaluate_grant_checks_come_first() -> None:
    unknown, _ = fence.evaluate(JULY, None, None, 99, ALLOW)
    assert unknown.code is FenceCode.UNKNOWN_TOKEN
    other = TokenGrant("default", "report-june", "z1", "pod-z")
    mismatch, _ = fence.evaluate(JULY, other, None, 41, ALLOW)
    assert mismatch.code is FenceCode.LEASE_MISMATCH
    assert "default/report-june" in mismatch.message
    wrong_holder, new = fence.evaluate(JULY, GRANT_41, None, 41, ALLOW, holder="pod-b")
    assert wrong_holder.code is FenceCode.HOLDER_MISMATCH and new is None
    ok, new = fence.evaluate(JULY, GRANT_41, None, 41, ALLOW, holder="pod-a", operation_id="o1")
    assert ok.code is FenceCode.APPLIED and new == HighWaterMark(41, ("o1",))
    assert ok.high_water_mark == 41 and ok.lease_id == "a7" and ok.holder == "pod-a"


@pytest.mark.parametrize("code", list(FenceCode))
def test_every_message_starts_with_its_code(code: FenceCode) -> None:
    text = fence.message(code, 41, 42, JULY, grant=GRANT_41, holder="pod-b", operation_id="o")
    assert text.startswith(f"{code.value}: ")
    assert "41" in text and "42" in text


# ------------------------------------------------ superseded generations (docs/tokens.md)

GRANT = TokenGrant("default", "report-july", "id", "pod-a")


def _code(
    token: int,
    generation: int | None,
    mark: int | None = None,
    grant: TokenGrant | None = GRANT,
    policy: FencingPolicy = ALLOW,
) -> FenceCode:
    hwm = HighWaterMark(mark) if mark is not None else None
    result, _ = fence.evaluate(JULY, grant, hwm, token, policy, generation=Generation(generation))
    return result.code


def test_a_newer_grant_supersedes_at_once() -> None:
    """Issue 36: token 217 written, force-release, grant 247 to the next holder: a write with
    217 was still admitted because nothing had written 247 yet."""
    assert _code(217, generation=247, mark=217) is FenceCode.STALE_FENCE
    result, _ = fence.evaluate(
        JULY, GRANT, HighWaterMark(217), 217, ALLOW, generation=Generation(247)
    )
    assert result.message.startswith("stale_fence: token 217 was superseded by the newer grant")
    # Without the generation (the article's rule, for fences that cannot see the grant): applied.
    assert fence.evaluate(JULY, GRANT, HighWaterMark(217), 217, ALLOW)[0].code is (
        FenceCode.APPLIED
    )


def test_the_current_generation_keeps_its_policy() -> None:
    assert _code(247, generation=247, mark=217) is FenceCode.APPLIED
    assert _code(247, generation=247, mark=247) is FenceCode.APPLIED
    assert _code(247, generation=247, mark=247, policy=STRICT) is FenceCode.STALE_FENCE
    assert _code(247, generation=247, mark=250) is FenceCode.STALE_FENCE  # the mark still counts


def test_a_deleted_lease_fences_nothing_new() -> None:
    """Issue 31: after the lease key is gone (deleted: its records sit in the retention
    window), its newest token was admitted above the mark."""
    assert _code(247, generation=None, mark=217) is FenceCode.STALE_FENCE
    assert _code(247, generation=None, mark=None) is FenceCode.STALE_FENCE
    result, _ = fence.evaluate(JULY, GRANT, None, 247, ALLOW, generation=Generation(None))
    assert "belongs to a deleted generation of lease default/report-july" in result.message


def test_a_pruned_token_is_stale_when_it_can_be_placed() -> None:
    """Issue 36: a token without a record (pruned) below the mark or the current generation is
    provably older: stale_fence; only what cannot be placed stays unknown_token."""
    assert _code(100, generation=247, mark=217, grant=None) is FenceCode.STALE_FENCE
    assert _code(230, generation=247, mark=217, grant=None) is FenceCode.STALE_FENCE
    assert _code(300, generation=247, mark=217, grant=None) is FenceCode.UNKNOWN_TOKEN
    assert _code(100, generation=None, mark=None, grant=None) is FenceCode.UNKNOWN_TOKEN
    # Without the generation only the grant decides (a status write): unknown_token.
    assert fence.evaluate(JULY, None, HighWaterMark(217), 100, ALLOW)[0].code is (
        FenceCode.UNKNOWN_TOKEN
    )


def test_grant_checks_come_before_supersession() -> None:
    other = TokenGrant("default", "report-august", "id", "pod-a")
    assert _code(100, generation=247, grant=other) is FenceCode.LEASE_MISMATCH
    result, _ = fence.evaluate(
        JULY, GRANT, None, 100, ALLOW, holder="pod-b", generation=Generation(247)
    )
    assert result.code is FenceCode.HOLDER_MISMATCH
