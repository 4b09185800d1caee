"""``fencedlease_controller_leader`` follows the write gate: 1 exactly while
:meth:`LeaseElection.is_leader` is true, on a fake coordination API and a fake clock."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from fencedlease import metrics
from fencedlease.election.decisions import ElectionTiming
from fencedlease.election.lease_api import LeaseElection
from fencedlease.kube import Conflict, NotFound
from tests.fakes import FakeClock

TIMING = ElectionTiming(lease_duration=5, renew_deadline=3, retry_period=1, skew=1)


class FakeLeases:
    """One Lease object with resourceVersion preconditions (what the API server enforces),
    counting the calls the election makes."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.calls: list[str] = []
        self.fail_next: Exception | None = None

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error

    async def read(self) -> dict[str, Any]:
        self._call("read")
        if self.lease is None:
            raise NotFound(status=404, reason="Not Found")
        return copy.deepcopy(self.lease)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self._call("create")
        if self.lease is not None:
            raise Conflict(status=409, reason="AlreadyExists")
        return self._store(body)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        self._call("replace")
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise Conflict(status=409, reason="Conflict")
        return self._store(body)

    def overwrite(self, holder: str) -> None:
        """Another replica's write (a new resourceVersion, another holder)."""
        assert self.lease is not None
        self.lease["spec"]["holderIdentity"] = holder
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)


def election(clock: FakeClock) -> tuple[LeaseElection, FakeLeases]:
    e = LeaseElection(
        None,  # type: ignore[arg-type]  # the API is replaced below
        "ns",
        "fencedlease-controller",
        "r-1",
        TIMING,
        clock=clock,
        wall=lambda: dt.datetime(2026, 7, 1, tzinfo=dt.UTC),
    )
    fake = FakeLeases()
    e.leases = fake
    return e, fake


def leader_gauge() -> float:
    value = metrics.CONTROLLER_LEADER._value.get()
    return float(value)


def changes(change: str) -> float:
    return float(metrics.LEADERSHIP_CHANGES.labels(change)._value.get())


async def test_the_leader_gauge_is_one_exactly_while_this_replica_may_write() -> None:
    clock = FakeClock()
    e, fake = election(clock)
    assert leader_gauge() == 0  # a replica starts as a standby
    started, stopped = changes("started"), changes("stopped")

    await e.attempt()  # no Lease yet: create it, a term starts
    e._notice()
    assert e.is_leader() and leader_gauge() == 1
    assert changes("started") == started + 1

    clock.advance(TIMING.renew_deadline + 0.1)  # no renewal: the deadline passes
    e._notice()
    assert not e.is_leader() and leader_gauge() == 0
    assert changes("stopped") == stopped + 1

    # A lost term waits a full duration + skew of an unchanged Lease, then leads again.
    await e.attempt()
    e._notice()
    assert leader_gauge() == 0
    clock.advance(TIMING.lease_duration + TIMING.skew + 0.1)
    await e.attempt()
    e._notice()
    assert e.is_leader() and leader_gauge() == 1

    await e.resign()  # SIGTERM: stop writing, release the Lease
    assert not e.is_leader() and leader_gauge() == 0
    assert fake.lease is not None and fake.lease["spec"]["holderIdentity"] == ""


async def test_a_leader_renews_with_one_write_and_no_read() -> None:
    clock = FakeClock()
    e, fake = election(clock)
    await e.attempt()  # no Lease: read (404), create
    assert fake.calls == ["read", "create"] and e.is_leader()
    for _ in range(3):
        clock.advance(TIMING.retry_period)
        await e.attempt()
    assert fake.calls[2:] == ["replace"] * 3  # the Lease our write returned: no read
    assert e.is_leader() and fake.lease is not None
    assert fake.lease["spec"]["holderIdentity"] == "r-1"


async def test_a_failed_renewal_reads_the_lease_before_the_next_write() -> None:
    """A timed-out write may have committed: its answer is unknown, so the next attempt
    reads the Lease instead of writing on a version that may be stale."""
    clock = FakeClock()
    e, fake = election(clock)
    await e.attempt()
    clock.advance(TIMING.retry_period)
    fake.fail_next = TimeoutError()
    await e.attempt()  # the renewal fails; the term goes on until its deadline
    assert e.is_leader()
    clock.advance(TIMING.retry_period)
    calls = len(fake.calls)
    await e.attempt()
    assert fake.calls[calls:] == ["read", "replace"] and e.is_leader()


async def test_a_read_free_renewal_that_meets_another_write_ends_the_term() -> None:
    """Somebody else wrote the Lease since our last write: the precondition fails (409) and
    this replica stops writing at once, as when a read shows another holder."""
    clock = FakeClock()
    e, fake = election(clock)
    await e.attempt()
    fake.overwrite("r-2")
    clock.advance(TIMING.retry_period)
    await e.attempt()
    assert fake.calls[-1] == "replace" and not e.is_leader()
    assert fake.lease is not None and fake.lease["spec"]["holderIdentity"] == "r-2"
    clock.advance(TIMING.retry_period)
    calls = len(fake.calls)
    await e.attempt()  # a standby now: it reads, sees r-2, and waits
    assert fake.calls[calls:] == ["read"] and not e.is_leader()


async def test_a_lease_body_that_makes_no_sense_is_a_failed_attempt_not_a_crash() -> None:
    """The Lease as the API server answered it is input like any other: a body without
    usable metadata or spec is treated as no Lease (the create then meets the existing one)
    and the loop goes on."""
    clock = FakeClock()
    e, fake = election(clock)
    await e.attempt()
    assert fake.lease is not None
    real = fake.lease
    fake.lease = {"metadata": ["not", "a", "mapping"], "spec": "garbage"}
    e.elector.lost()  # a standby now: it reads
    clock.advance(TIMING.retry_period)
    await e.attempt()
    assert fake.calls[-2:] == ["read", "create"] and not e.is_leader()
    fake.lease = real
