"""Pure fence check: may a write carrying ``token`` pass a domain's high-water mark?

This is the article's resource-side rule ``accepted_fence <= :fence`` (``AllowEqual``) or
``accepted_fence < :fence`` (``StrictlyGreater``), plus the two checks that make a token more
than a number: it must really have been issued (``unknown_token`` for forged or future
values) and issued for *this* fencing domain (``lease_mismatch``).

Where the check can also see the domain's lease key (:class:`Generation`, read in the same
transaction as the grant and the mark: the admission webhook), a token of a superseded
generation is ``stale_fence`` from the moment the next grant commits, and a token whose record
was pruned is ``stale_fence`` when it is provably older than the mark or the current
generation (:func:`supersession`); ``unknown_token`` is left for what cannot be placed.
``AllowEqual``/``StrictlyGreater`` then decide for the current generation, against the mark.
"""

from __future__ import annotations

from collections.abc import Sequence

from fencedlease.authority.types import (
    FenceCode,
    FenceResult,
    FencingPolicy,
    Generation,
    HighWaterMark,
    LeaseKey,
    TokenGrant,
)

MAX_OPERATION_IDS = 256
"""Operation ids remembered at the current high-water-mark token (oldest dropped first)."""


def check(
    hwm_token: int | None,
    hwm_operation_ids: Sequence[str],
    token: int,
    policy: FencingPolicy,
    operation_id: str | None = None,
) -> FenceCode:
    """Order check only: ``applied``, ``duplicate`` or ``stale_fence``.

    ``hwm_token`` is ``None`` when nothing was accepted yet in the domain.  Under
    ``AllowEqual`` a same-token write whose ``operation_id`` was already applied at that token
    is a ``duplicate`` (a retry or a reordered copy must not apply twice).
    """
    if hwm_token is None:
        return FenceCode.APPLIED
    if token < hwm_token:
        return FenceCode.STALE_FENCE
    if token > hwm_token:
        return FenceCode.APPLIED
    if policy is FencingPolicy.STRICTLY_GREATER:
        return FenceCode.STALE_FENCE
    if operation_id is not None and operation_id in hwm_operation_ids:
        return FenceCode.DUPLICATE
    return FenceCode.APPLIED


def check_grant(
    grant: TokenGrant | None,
    domain: LeaseKey,
    holder: str | None = None,
    holder_uid: str | None = None,
) -> FenceCode | None:
    """Was the token issued for ``domain`` (and to Pod ``holder`` with UID ``holder_uid``,
    when given)? ``None`` if so.

    A grant belongs to a Pod, not to a Pod name: a Pod re-created under the holder's name
    (a StatefulSet does exactly this) has another UID and is refused.  A grant recorded
    with a UID is refused to a writer that cannot show one.
    """
    if grant is None:
        return FenceCode.UNKNOWN_TOKEN
    if grant.key != domain:
        return FenceCode.LEASE_MISMATCH
    if holder is not None:
        if grant.holder != holder:
            return FenceCode.HOLDER_MISMATCH
        if grant.holder_uid is not None and grant.holder_uid != holder_uid:
            return FenceCode.HOLDER_MISMATCH
    return None


def supersession(
    grant_code: FenceCode | None,
    token: int,
    hwm_token: int | None,
    generation: Generation,
) -> FenceCode | None:
    """The refusal that the domain's current generation adds to the grant check, or ``None``.

    ``grant_code`` is :func:`check_grant`'s answer.  A token issued for this domain is
    ``stale_fence`` once a newer grant committed (``token`` below the generation's) or once
    the lease key is gone (the lease was deleted: its tokens belong to no live generation, and
    a lease re-created under the same name starts with a newer key).  A token without a record
    (pruned by retention) is ``stale_fence`` when it is below the mark or the current
    generation: provably older than something already accepted or granted.  Everything else
    keeps ``grant_code``."""
    if grant_code is FenceCode.UNKNOWN_TOKEN:
        bounds = [b for b in (hwm_token, generation.token) if b is not None]
        return FenceCode.STALE_FENCE if bounds and token < max(bounds) else grant_code
    if grant_code is not None:
        return grant_code
    if generation.token is None or token < generation.token:
        return FenceCode.STALE_FENCE
    return None


def committed(hwm: HighWaterMark | None, token: int) -> HighWaterMark | None:
    """The mark after a write with ``token`` was *committed* (seen stored by the API server),
    or ``None`` when the mark already covers it.  Never moves backwards."""
    if hwm is not None and token <= hwm.token:
        return None
    return HighWaterMark(token)


def advance(
    hwm: HighWaterMark | None,
    token: int,
    operation_id: str | None,
    max_operation_ids: int = MAX_OPERATION_IDS,
) -> HighWaterMark | None:
    """The mark after applying ``token``, or ``None`` when nothing needs writing.

    Never moves backwards: callers only advance after :func:`check` said ``applied``.
    """
    if hwm is None or token > hwm.token:
        return HighWaterMark(token, (operation_id,) if operation_id else ())
    if token < hwm.token:
        raise ValueError(f"refusing to move the high-water mark back from {hwm.token} to {token}")
    if operation_id is None or operation_id in hwm.operation_ids:
        return None
    ops = (*hwm.operation_ids, operation_id)[-max_operation_ids:]
    return HighWaterMark(token, ops)


def message(
    code: FenceCode,
    token: int,
    hwm_token: int | None,
    domain: LeaseKey,
    *,
    grant: TokenGrant | None = None,
    holder: str | None = None,
    operation_id: str | None = None,
    holder_uid: str | None = None,
    generation: Generation | None = None,
) -> str:
    """Human message that starts with the code (the webhook's denial reason)."""
    mark = "none" if hwm_token is None else str(hwm_token)
    lease = f"lease {domain}"
    if code is FenceCode.STALE_FENCE and generation is not None:
        superseded = _superseded(token, hwm_token, domain, grant, generation)
        if superseded is not None:
            return superseded
    match code:
        case FenceCode.APPLIED:
            return f"applied: token {token} accepted (high-water mark {mark}) for {lease}"
        case FenceCode.DUPLICATE:
            return (
                f"duplicate: operation {operation_id} was already applied with token {token} "
                f"(high-water mark {mark}) for {lease}"
            )
        case FenceCode.STALE_FENCE:
            relation = "below" if hwm_token is not None and token < hwm_token else "not above"
            return f"stale_fence: token {token} is {relation} the high-water mark {mark} of {lease}"
        case FenceCode.UNKNOWN_TOKEN:
            return (
                f"unknown_token: token {token} was never issued by this authority "
                f"(high-water mark {mark} of {lease})"
            )
        case FenceCode.LEASE_MISMATCH:
            other = f"{grant.key}" if grant else "another lease"
            return (
                f"lease_mismatch: token {token} was issued for lease {other}, not {domain} "
                f"(high-water mark {mark})"
            )
        case FenceCode.HOLDER_MISMATCH:
            owner = _pod(grant.holder, grant.holder_uid) if grant else "another holder"
            writer = _pod(holder, holder_uid) if holder else "this writer"
            return (
                f"holder_mismatch: token {token} of {lease} was issued to Pod {owner}, "
                f"not {writer} (high-water mark {mark})"
            )
    raise AssertionError(code)  # pragma: no cover


def _superseded(
    token: int,
    hwm_token: int | None,
    domain: LeaseKey,
    grant: TokenGrant | None,
    generation: Generation,
) -> str | None:
    """The message of a ``stale_fence`` that :func:`supersession` decided (``None``: the
    plain mark comparison decided it, or says it as well: the token is below the mark)."""
    mark = "none" if hwm_token is None else str(hwm_token)
    if hwm_token is not None and token < hwm_token:
        return None
    if grant is None:
        bound = max(b for b in (hwm_token, generation.token) if b is not None)
        return (
            f"stale_fence: token {token} is below token {bound} of lease {domain} "
            f"(high-water mark {mark}); its grant record was pruned by retention"
        )
    if generation.token is None:
        return (
            f"stale_fence: token {token} belongs to a deleted generation of lease {domain}: "
            f"the lease was deleted since it was issued (high-water mark {mark})"
        )
    if token < generation.token:
        return (
            f"stale_fence: token {token} was superseded by the newer grant {generation.token} "
            f"of lease {domain} (high-water mark {mark})"
        )
    return None


def _pod(name: str | None, uid: str | None) -> str:
    return f"{name} (uid {uid})" if uid else str(name)


def evaluate(
    domain: LeaseKey,
    grant: TokenGrant | None,
    hwm: HighWaterMark | None,
    token: int,
    policy: FencingPolicy,
    *,
    operation_id: str | None = None,
    holder: str | None = None,
    holder_uid: str | None = None,
    generation: Generation | None = None,
) -> tuple[FenceResult, HighWaterMark | None]:
    """Full decision: the result and the mark to write (``None``: write nothing).

    ``generation``: the domain's lease key as read with the grant and the mark (the
    superseded-generation rule, :func:`supersession`); ``None`` where it was not read."""
    hwm_token = hwm.token if hwm else None
    code = check_grant(grant, domain, holder, holder_uid)
    if generation is not None:
        code = supersession(code, token, hwm_token, generation)
    if code is None:
        code = check(hwm_token, hwm.operation_ids if hwm else (), token, policy, operation_id)
    new_hwm = advance(hwm, token, operation_id) if code is FenceCode.APPLIED else None
    after = new_hwm.token if new_hwm else hwm_token
    text = message(
        code,
        token,
        hwm_token,
        domain,
        grant=grant,
        holder=holder,
        operation_id=operation_id,
        holder_uid=holder_uid,
        generation=generation,
    )
    result = FenceResult(
        code=code,
        token=token,
        high_water_mark=after,
        lease=str(domain),
        message=text,
        lease_id=grant.lease_id if grant else None,
        holder=grant.holder if grant else None,
    )
    return result, new_hwm
