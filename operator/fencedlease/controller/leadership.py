"""The controller's write gate: only the elected replica writes (``docs/operations.md``,
"Controller failover").

Every write the controller makes — a grant, renewal or release in etcd, a Pod annotation, a
lease status or finalizer, an artifact status or finalizer, an Event — goes through
:func:`gated_store` or :func:`gated_writes`, which ask :class:`Leadership` right before the
call. A standby keeps its caches warm from the watches and writes nothing; a replica whose
renewal deadline passed (by its own monotonic clock, e.g. after SIGSTOP) gets
:class:`NotLeader` from its next write and abandons the pass.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from fencedlease.controller.ports import (
    ArtifactWrites,
    ClaimWrites,
    CommitStore,
    LeaseStore,
    LeaseWrites,
    ReleaseWrites,
)


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


class AlwaysLeader:
    """Leader election disabled (one replica by contract, e.g. ``local up``)."""

    def is_leader(self) -> bool:
        return True


class NotLeader(Exception):
    """This replica may not write now; the pass that tried is abandoned."""


class ControllerStore(LeaseStore, CommitStore, Protocol):
    """The grant authority as the whole controller uses it."""


class ControllerWrites(LeaseWrites, ArtifactWrites, ReleaseWrites, ClaimWrites, Protocol):
    """The Kubernetes writes of the whole controller."""


class _Gate:
    """``target`` with each of its methods behind the gate, but the ``reads``: one generic
    forwarder instead of a hand-written copy of every port's signature, so a write added to
    a port is gated without a line here (a method not named a read is a write)."""

    def __init__(self, target: object, leadership: Leadership, reads: frozenset[str]) -> None:
        self._target = target
        self._leadership = leadership
        self._reads = reads

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._target, name)
        if name in self._reads or not callable(found):
            return found
        target, leadership = self._target, self._leadership

        async def gated(*args: Any, **kwargs: Any) -> Any:
            if not leadership.is_leader():
                raise NotLeader
            # looked up at each call: the adapter's method as it is now
            return await getattr(target, name)(*args, **kwargs)

        setattr(self, name, gated)  # made once per method: __getattr__ sees only misses
        return gated


STORE_READS = frozenset({"read"})
"""The store's calls that keep nothing: they pass on a standby."""
KUBE_READS = frozenset({"read_pod", "get_lease"})
"""The Kubernetes calls that keep nothing: they pass on a standby."""


def gated_store(store: ControllerStore, leadership: Leadership) -> ControllerStore:
    """The store, every write behind the gate (reads pass: they keep nothing)."""
    return cast(ControllerStore, _Gate(store, leadership, STORE_READS))


def gated_writes(kube: ControllerWrites, leadership: Leadership) -> ControllerWrites:
    """The Kubernetes writes, each behind the gate (reads pass)."""
    return cast(ControllerWrites, _Gate(kube, leadership, KUBE_READS))
