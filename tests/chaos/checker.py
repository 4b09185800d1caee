"""The campaign's checker: pure functions from a :class:`History` to violations and figures.

It decides only from what the history shows and never reports a violation that an honest
interleaving could explain: two writes are ordered only when one was admitted before the other
was sent (real-time order, as in a linearizability check), a write that timed out is never
counted as admitted, and watch states are compared in the order they were seen.

Invariants (``Violation.kind``):

- ``token_not_increasing``: per lease, each grant's token is greater than the previous one's.
- ``token_granted_twice`` / ``lease_id_granted_twice``: no token (tokens are etcd revisions, so
  across all leases) and no lease id is handed out for two different grants.
- ``ungranted_token``: every admitted write's token was granted for the lease it names.
- ``wrong_holder``: ... and to the holder that wrote it.
- ``superseded_admitted``: no write is admitted with a token of a superseded generation: a
  newer grant of its lease was observed before the write was sent (so it had committed
  before the webhook read the lease; docs/tokens.md, "Superseded generations").  The older
  rule only refused a token below one that had already been *written*.
- ``stale_overwrite``: an admitted write's token is below (``StrictlyGreater``: not above) the
  token of a write to the same artifact that was admitted before it was sent.
- ``visible_regressed``: the artifact's visible state never moves to an older token.
- ``write_after_stale``: a holder told ``stale_fence`` under a grant never gets a later write
  under that grant admitted.
- ``admitted_without_webhook``: no write sent and answered inside a ``webhook_down`` window is
  admitted.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

from tests.chaos.history import (
    ArtifactState,
    Event,
    Fault,
    Grant,
    History,
    Vacant,
    WriteFail,
    WriteInvoke,
    WriteOk,
)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    detail: str
    events: tuple[Event, ...] = ()


@dataclass
class Availability:
    """Per lease: share of the run its status showed a grant (:func:`held_share`), and grants
    per minute; per fault window: seconds from its end to the next admitted write (``None``:
    none followed)."""

    held_share: dict[str, float] = field(default_factory=dict)
    grants_per_minute: dict[str, float] = field(default_factory=dict)
    recovery_seconds: list[tuple[Fault, float | None]] = field(default_factory=list)


@dataclass
class Report:
    violations: list[Violation]
    availability: Availability
    admitted: int
    refused: dict[str, int]

    @property
    def safe(self) -> bool:
        return not self.violations


def check(history: History) -> Report:
    writes = {w.op_id: w for w in history.of(WriteInvoke)}
    oks = [ok for ok in history.of(WriteOk) if ok.op_id in writes]
    refused: dict[str, int] = defaultdict(int)
    for fail in history.of(WriteFail):
        refused[fail.code] += 1
    violations = [
        *check_grants(history),
        *check_admitted_tokens(history, writes, oks),
        *check_superseded(history, writes, oks),
        *check_order(history, writes, oks),
        *check_visible(history),
        *check_after_stale(history, writes, oks),
        *check_webhook_down(history, writes, oks),
    ]
    return Report(violations, availability(history, writes, oks), len(oks), dict(refused))


def check_grants(history: History) -> list[Violation]:
    found: list[Violation] = []
    last: dict[str, Grant] = {}
    by_token: dict[int, Grant] = {}
    by_id: dict[str, Grant] = {}
    for grant in history.of(Grant):
        previous = last.get(grant.lease)
        same = previous is not None and (previous.token, previous.lease_id) == (
            grant.token,
            grant.lease_id,
        )
        if same:
            continue  # the same grant observed again (a renewal, another reader)
        if previous is not None and grant.token <= previous.token:
            found.append(
                Violation(
                    "token_not_increasing",
                    f"lease {grant.lease}: token {grant.token} granted after {previous.token}",
                    (previous, grant),
                )
            )
        other = by_token.get(grant.token)
        if other is not None and (other.lease, other.lease_id) != (grant.lease, grant.lease_id):
            found.append(
                Violation(
                    "token_granted_twice",
                    f"token {grant.token} granted for {other.lease}/{other.lease_id} "
                    f"and {grant.lease}/{grant.lease_id}",
                    (other, grant),
                )
            )
        twin = by_id.get(grant.lease_id)
        if twin is not None and twin.token != grant.token:
            found.append(
                Violation(
                    "lease_id_granted_twice",
                    f"lease id {grant.lease_id} granted with tokens {twin.token} and {grant.token}",
                    (twin, grant),
                )
            )
        last[grant.lease] = grant
        by_token.setdefault(grant.token, grant)
        by_id.setdefault(grant.lease_id, grant)
    return found


def check_admitted_tokens(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> list[Violation]:
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for grant in history.of(Grant):
        owners[(grant.lease, grant.token)].add(grant.holder)
    found: list[Violation] = []
    for ok in oks:
        write = writes[ok.op_id]
        holders = owners.get((write.lease, write.token))
        if not holders:
            found.append(
                Violation(
                    "ungranted_token",
                    f"{write.holder}'s write {write.op_id} admitted with token {write.token}, "
                    f"never granted for lease {write.lease}",
                    (write, ok),
                )
            )
        elif write.holder not in holders:
            found.append(
                Violation(
                    "wrong_holder",
                    f"write {write.op_id} by {write.holder} admitted with token {write.token} "
                    f"of lease {write.lease}, granted to {sorted(holders)}",
                    (write, ok),
                )
            )
    return found


def check_superseded(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> list[Violation]:
    """Per lease, the highest token observed granted before each admitted write was sent must
    not be above the write's token (a renewal observes the same token again: no change)."""
    times: dict[str, list[float]] = defaultdict(list)
    newest: dict[str, list[Grant]] = defaultdict(list)  # running maximum by observation time
    for grant in sorted(history.of(Grant), key=lambda g: g.t):
        running = newest[grant.lease]
        running.append(grant if not running or grant.token > running[-1].token else running[-1])
        times[grant.lease].append(grant.t)
    found: list[Violation] = []
    for ok in oks:
        write = writes[ok.op_id]
        before = bisect.bisect_left(times.get(write.lease, []), write.t)  # strictly before
        if before == 0:
            continue
        top = newest[write.lease][before - 1]
        if top.token > write.token:
            found.append(
                Violation(
                    "superseded_admitted",
                    f"write {write.op_id} admitted with token {write.token} of lease "
                    f"{write.lease}, sent after the newer grant {top.token} was observed "
                    f"at {top.t:.3f}",
                    (top, write, ok),
                )
            )
    return found


def check_order(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> list[Violation]:
    """Real-time order per artifact: for each admitted write, the highest token admitted
    (answered) before it was sent must not be above it (nor equal under StrictlyGreater)."""
    per_artifact: dict[str, list[tuple[float, WriteInvoke, WriteOk]]] = defaultdict(list)
    for ok in oks:
        write = writes[ok.op_id]
        per_artifact[write.artifact].append((ok.t, write, ok))
    found: list[Violation] = []
    for artifact, admitted in per_artifact.items():
        admitted.sort(key=lambda item: item[0])
        times = [t for t, _, _ in admitted]
        best: list[tuple[WriteInvoke, WriteOk]] = []  # running maximum by answer time
        for _, write, ok in admitted:
            if not best or write.token > best[-1][0].token:
                best.append((write, ok))
            else:
                best.append(best[-1])
        for _, write, ok in admitted:
            before = bisect.bisect_left(times, write.t)  # answered strictly before sent
            if before == 0:
                continue
            top, top_ok = best[before - 1]
            strict = history.policies.get(write.lease) == "StrictlyGreater"
            if write.token < top.token or (strict and write.token == top.token):
                relation = "below" if write.token < top.token else "equal to"
                found.append(
                    Violation(
                        "stale_overwrite",
                        f"{artifact}: write {write.op_id} with token {write.token} admitted "
                        f"{relation} token {top.token} (write {top.op_id}, admitted first)",
                        (top, top_ok, write, ok),
                    )
                )
    return found


def check_visible(history: History) -> list[Violation]:
    seen: dict[str, ArtifactState] = {}
    found: list[Violation] = []
    for state in history.of(ArtifactState):
        previous = seen.get(state.artifact)
        if previous is not None and state.token < previous.token:
            found.append(
                Violation(
                    "visible_regressed",
                    f"{state.artifact}: visible state went from token {previous.token} "
                    f"({previous.pointer}) back to {state.token} ({state.pointer})",
                    (previous, state),
                )
            )
        if previous is None or state.token >= previous.token:
            seen[state.artifact] = state
    return found


def check_after_stale(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> list[Violation]:
    told: dict[tuple[str, str], WriteFail] = {}
    for fail in history.of(WriteFail):
        write = writes.get(fail.op_id)
        if fail.code == "stale_fence" and write is not None:
            key = (write.holder, write.lease_id)
            if key not in told or fail.t < told[key].t:
                told[key] = fail
    found: list[Violation] = []
    for ok in oks:
        write = writes[ok.op_id]
        stale = told.get((write.holder, write.lease_id))
        if stale is not None and write.t > stale.t:
            found.append(
                Violation(
                    "write_after_stale",
                    f"{write.holder} was told stale_fence at {stale.t:.3f} under grant "
                    f"{write.lease_id}, then write {write.op_id} was admitted",
                    (stale, write, ok),
                )
            )
    return found


def check_webhook_down(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> list[Violation]:
    windows = [f for f in history.of(Fault) if f.kind == "webhook_down"]
    found: list[Violation] = []
    for ok in oks:
        write = writes[ok.op_id]
        for window in windows:
            if window.t <= write.t and ok.t <= window.end:
                found.append(
                    Violation(
                        "admitted_without_webhook",
                        f"write {write.op_id} sent and admitted while no webhook could be "
                        f"reached ({window.t:.3f}..{window.end:.3f})",
                        (window, write, ok),
                    )
                )
    return found


def held_share(events: list[Grant | Vacant], start: float, end: float) -> float:
    """The share of ``[start, end]`` one lease's status showed a grant: from the first sight of
    a grant to the next status that shows a newer grant or none (:class:`Vacant`).

    The status is written when a grant starts or ends, not on each renewal (docs/operations.md,
    "What a renewal writes"), so a grant seen once may be held for many durations: counting a
    duration from each sight would under-count. A sight of an older token than one already seen
    (a holder reading its Pod late) is not a new grant."""
    held, since, newest = 0.0, None, -1
    for event in sorted(events, key=lambda e: e.t):
        t = min(max(event.t, start), end)
        if isinstance(event, Vacant):
            if since is not None:
                held, since = held + (t - since), None
        elif event.token > newest or (since is None and event.token == newest):
            if since is not None:
                held += t - since
            since, newest = t, max(newest, event.token)
    if since is not None:
        held += end - since
    return held / max(end - start, 1e-9)


def availability(
    history: History, writes: dict[str, WriteInvoke], oks: list[WriteOk]
) -> Availability:
    times = [e.t for e in history.events]
    result = Availability()
    if not times:
        return result
    start, end = min(times), max(times)
    span = max(end - start, 1e-9)
    seen: dict[str, list[Grant | Vacant]] = defaultdict(list)
    for event in history.events:
        if isinstance(event, Grant | Vacant):
            seen[event.lease].append(event)
    for lease, events in seen.items():
        grants = [e for e in events if isinstance(e, Grant)]
        if not grants:
            continue
        result.held_share[lease] = held_share(events, start, end)
        result.grants_per_minute[lease] = len({g.token for g in grants}) / (span / 60.0)
    answered = sorted(ok.t for ok in oks)
    for fault in history.of(Fault):
        after = bisect.bisect_right(answered, fault.end)
        recovery = answered[after] - fault.end if after < len(answered) else None
        result.recovery_seconds.append((fault, recovery))
    return result
