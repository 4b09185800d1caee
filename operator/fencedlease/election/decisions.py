"""The election's decisions, pure: what to do next and whether this replica may write now.

client-go's leader election, with one rule made stricter. Times are readings of the local
monotonic clock (never a wall clock, never the Lease's timestamps):

* the leader renews every ``retry_period``; a renewal (or acquisition) that *started* at ``t``
  and succeeded lets it write until ``t + renew_deadline``. Past that instant :meth:`Elector.
  is_leader` is false, whatever the Lease says and whether or not a timer fired, so a replica
  that was paused (SIGSTOP, a long GC, a frozen VM) and resumes stops writing by itself;
* a standby takes over only after it has seen the Lease's ``resourceVersion`` unchanged for the
  record's ``leaseDurationSeconds`` plus the clock-skew bound. It first saw that version after
  the leader's write committed, which is after the write started, so the former leader's
  deadline (``start + renew_deadline``, with ``renew_deadline < lease_duration``) has passed
  before a new leader can exist;
* stricter than client-go: a replica that is not leading treats a record naming itself like
  any other (it waits a full duration). A replica that lost leadership, or a restarted process
  reusing an identity, never resumes a term on a view that went stale meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    lease_duration: float  # the Lease's leaseDurationSeconds
    renew_deadline: float  # a leader stops writing this long after its last renewal started
    retry_period: float  # renew / poll interval
    skew: float = 1.0  # bound on clock-rate differences between replicas over one duration

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period}, {self.renew_deadline}, {self.lease_duration})"
            )
        if self.skew < 0:
            raise ValueError("the clock-skew bound cannot be negative")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the election needs of the Lease object (``None`` for the Lease: it does not exist)."""

    resource_version: str
    holder: str | None  # spec.holderIdentity; None or "" when released
    lease_duration: float | None  # spec.leaseDurationSeconds of the holder
    transitions: int = 0


class Action(Enum):
    CREATE = "create"  # no Lease yet: create it naming us
    ACQUIRE = "acquire"  # replace the Lease (resourceVersion precondition) naming us
    RENEW = "renew"  # we lead: replace it (resourceVersion precondition), same holder
    WAIT = "wait"  # someone else leads (or may still): observe again later


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    transitions: int = 0  # the leaseTransitions to write (ACQUIRE/CREATE)


class Elector:
    """One replica's view of the election. Feed it what the adapter observes; ask it what to do."""

    def __init__(self, identity: str, timing: ElectionTiming) -> None:
        self.identity = identity
        self.timing = timing
        self._deadline: float | None = None  # we may write until then (None: not leading)
        self._seen: tuple[str, float] | None = None  # (resourceVersion, first seen at)

    # ------------------------------------------------------------------- the gate

    def is_leader(self, now: float) -> bool:
        """May this replica write now? False from the deadline on, by the local clock alone."""
        return self._deadline is not None and now < self._deadline

    def deadline(self) -> float | None:
        return self._deadline

    # ---------------------------------------------------------------- observations

    def decide(self, record: LeaseRecord | None, now: float) -> Decision:
        """What to do about the Lease as just read at ``now``."""
        if record is None:
            self._seen = None
            return Decision(Action.CREATE)
        if self._seen is None or self._seen[0] != record.resource_version:
            self._seen = (record.resource_version, now)
        if self.is_leader(now):
            if record.holder == self.identity:
                return Decision(Action.RENEW)
            self.lost()  # someone else wrote the Lease: it is theirs
        elif self._deadline is not None:
            self.lost()  # our deadline passed: from now on we are a standby like any other
        if not record.holder:  # released by a leader that stopped writing first
            return Decision(Action.ACQUIRE, record.transitions + 1)
        if now >= self.takeover_at(record):
            return Decision(Action.ACQUIRE, record.transitions + 1)
        return Decision(Action.WAIT)

    def takeover_at(self, record: LeaseRecord) -> float:
        """When a standby may take the Lease over if its version stays as seen."""
        assert self._seen is not None
        duration = max(record.lease_duration or 0.0, self.timing.lease_duration)
        return self._seen[1] + duration + self.timing.skew

    # -------------------------------------------------------------------- outcomes

    def written(self, started: float) -> None:
        """Our create/acquire/renew write, started at ``started``, succeeded."""
        self._deadline = started + self.timing.renew_deadline
        self._seen = None  # our own write has a new version; we do not know it

    def conflicted(self) -> None:
        """Our write met a newer version (or an existing Lease): somebody else moved first."""
        self.lost()

    def lost(self) -> None:
        self._deadline = None

    def next_attempt(self, now: float) -> float:
        """Seconds until the adapter should read the Lease again."""
        if self._deadline is not None and now < self._deadline:
            return min(self.timing.retry_period, max(0.0, self._deadline - now))
        return self.timing.retry_period
