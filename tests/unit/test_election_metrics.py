"""``fencedlease_controller_leader`` follows the write gate: 1 exactly while
:meth:`LeaseElection.is_leader` is true, on a fake coordination API and a fake clock."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.election.decisions import ElectionTiming
from fencedlease.election.kube import LeaseElection
from tests.fakes import FakeClock

TIMING = ElectionTiming(lease_duration=5, renew_deadline=3, retry_period=1, skew=1)


class FakeCoordination:
    """One Lease object with resourceVersion preconditions (what the API server enforces)."""

    def __init__(self) -> None:
        self.lease: SimpleNamespace | None = None
        self.version = 0

    def _store(self, body: dict[str, Any]) -> SimpleNamespace:
        self.version += 1
        spec = body["spec"]
        self.lease = SimpleNamespace(
            metadata=SimpleNamespace(resource_version=str(self.version), labels=None),
            spec=SimpleNamespace(
                holder_identity=spec["holderIdentity"],
                lease_duration_seconds=spec["leaseDurationSeconds"],
                lease_transitions=spec["leaseTransitions"],
            ),
        )
        return self.lease

    async def read_namespaced_lease(self, name: str, namespace: str) -> SimpleNamespace:
        if self.lease is None:
            raise ApiException(status=404, reason="Not Found")
        return self.lease

    async def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> Any:
        return self._store(body)

    async def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any]
    ) -> Any:
        assert self.lease is not None
        assert body["metadata"]["resourceVersion"] == self.lease.metadata.resource_version
        return self._store(body)


def election(clock: FakeClock) -> tuple[LeaseElection, FakeCoordination]:
    e = LeaseElection(
        None,  # type: ignore[arg-type]  # the API client is replaced below
        "ns",
        "fencedlease-controller",
        "r-1",
        TIMING,
        clock=clock,
        wall=lambda: dt.datetime(2026, 7, 1, tzinfo=dt.UTC),
    )
    fake = FakeCoordination()
    e.coordination = fake  # type: ignore[assignment]
    return e, fake


def leader_gauge() -> float:
    value = metrics.CONTROLLER_LEADER._value.get()  # type: ignore[attr-defined]
    return float(value)


def changes(change: str) -> float:
    return float(metrics.LEADERSHIP_CHANGES.labels(change)._value.get())  # type: ignore[attr-defined]


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
    assert fake.lease is not None and fake.lease.spec.holder_identity == ""
