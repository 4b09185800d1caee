"""The election's adapter: a ``coordination.k8s.io/v1`` Lease read and written with
``resourceVersion`` preconditions, driving the pure :class:`~.decisions.Elector`.

API errors arrive translated by :mod:`fencedlease.kube` (``NotFound``, ``Conflict``, ...):
a ``Conflict`` (someone else wrote first) is a lost race, anything else (timeouts, 5xx,
connection errors) a failed attempt that leaves the local deadline as it is — the deadline,
not an error, ends a term.

A leader renews with one write and no read: the Lease as its own last write returned it is
what a read would show unless somebody else wrote since, and then the write's
``resourceVersion`` precondition fails (409) and the term ends as after any lost race. Any
other failure forgets that copy, so the next attempt reads the Lease again (client-go's
leader election renews the same way). The Lease travels as plain JSON: decoding it into the
client library's model objects cost more CPU than the two requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import aiohttp
from kubernetes_asyncio import client

from fencedlease import metrics
from fencedlease.election.decisions import Action, Decision, ElectionTiming, Elector, LeaseRecord
from fencedlease.kube import ApiError, Conflict, NotFound, request_json

log = logging.getLogger(__name__)
T = TypeVar("T")

FAILURES = (ApiError, aiohttp.ClientError, OSError, TimeoutError)


def micro_time(when: dt.datetime) -> str:
    """The API's MicroTime format (RFC 3339 with microseconds)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseAPI(Protocol):
    """The three calls the election makes on its Lease (plain JSON bodies). Failures raise
    :mod:`fencedlease.kube`'s typed errors (``NotFound``: no such Lease, ``Conflict``: a
    precondition failed, else ``ApiError``) or a connection error."""

    async def read(self) -> dict[str, Any]: ...

    async def create(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]: ...


class KubeLeaseAPI:
    """:class:`LeaseAPI` on the API server."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.api = api
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.path = f"{self.collection}/{name}"

    async def read(self) -> dict[str, Any]:
        return await request_json(self.api, "GET", self.path)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return await request_json(self.api, "POST", self.collection, body)

    async def replace(self, body: dict[str, Any]) -> dict[str, Any]:
        return await request_json(self.api, "PUT", self.path, body)


class LeaseElection:
    """Campaign for, hold and release one Lease; :meth:`is_leader` is the write gate."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        timing: ElectionTiming,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.leases: LeaseAPI = KubeLeaseAPI(api, namespace, name)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.elector = Elector(identity, timing)
        self.clock = clock
        self.wall = wall
        self.changed = asyncio.Event()  # set whenever leadership starts or ends
        self._leading = False
        self._acquired_wall: dt.datetime | None = None
        self._resigned = False
        self._ours: dict[str, Any] | None = None
        """The Lease as our last successful write returned it (``None``: read it first)."""
        self._on_start: list[Callable[[], None]] = []
        metrics.CONTROLLER_LEADER.set(0)

    def is_leader(self) -> bool:
        """True while this replica's renewal deadline (local monotonic clock) is ahead."""
        return self.elector.is_leader(self.clock())

    def on_started_leading(self, callback: Callable[[], None]) -> None:
        self._on_start.append(callback)

    # ----------------------------------------------------------------------- the loop

    async def run(self) -> None:
        """Campaign and renew until cancelled; then release the Lease if we still lead."""
        try:
            while True:
                await self.attempt()
                self._notice()
                wait = self.elector.next_attempt(self.clock())
                deadline = self.elector.deadline()
                if deadline is not None:  # wake at the deadline too: say that we stopped
                    wait = min(wait, max(0.0, deadline - self.clock()) + 0.001)
                await asyncio.sleep(wait)
                self._notice()
        finally:
            with contextlib.suppress(*FAILURES):
                await self.release()

    async def attempt(self) -> None:
        """One conditional write while leading (on the Lease our last write returned), else
        one read and, when the decision says so, one conditional write."""
        if self._resigned:
            return
        current = self._ours if self.elector.is_leader(self.clock()) else None
        self._ours = None  # spent: only a successful write below gives a new one
        if current is None:
            try:
                current = await self._call(self.leases.read())
            except NotFound:
                current = None
            except ApiError as exc:
                log.warning("leader election: reading Lease failed: %s %s", exc.status, exc.reason)
                return
            except FAILURES as exc:
                log.warning("leader election: reading Lease failed: %s", exc or type(exc).__name__)
                return
        now = self.clock()
        decision = self.elector.decide(_record(current), now)
        if decision.action is Action.WAIT:
            return
        started = self.clock()
        try:
            written = await self._write(decision, current)
        except (NotFound, Conflict):
            self.elector.conflicted()
            return
        except ApiError as exc:
            log.warning(
                "leader election: %s failed: %s %s", decision.action.value, exc.status, exc.reason
            )
            return
        except FAILURES as exc:
            log.warning(
                "leader election: %s failed: %s", decision.action.value, exc or type(exc).__name__
            )
            return
        self.elector.written(started)
        self._ours = written

    async def resign(self) -> None:
        """The process is stopping: never campaign again, and release the Lease if we lead."""
        self._resigned = True
        with contextlib.suppress(*FAILURES):
            await self.release()

    async def release(self) -> None:
        """Stop writing first, then clear the holder so a standby takes over at once."""
        if not self.elector.is_leader(self.clock()):
            return
        self.elector.lost()
        self._ours = None
        self._notice()
        current = await self._call(self.leases.read())
        if _spec(current).get("holderIdentity") != self.identity:
            return
        body = self._body(current, holder="", transitions=_transitions(current))
        body["spec"]["leaseDurationSeconds"] = 1
        await self._call(self.leases.replace(body))
        log.info("leader election: released Lease %s/%s", self.namespace, self.name)

    # -------------------------------------------------------------------- helpers

    async def _call(self, call: Awaitable[T]) -> T:
        """One API call, bounded so that a hung request cannot outlive the term it renews."""
        async with asyncio.timeout(self.timing.renew_deadline / 2):
            return await call

    async def _write(self, decision: Decision, current: dict[str, Any] | None) -> dict[str, Any]:
        """The write ``decision`` asks for; the Lease as the API server answered it."""
        if decision.action is Action.CREATE:
            self._acquired_wall = self.wall()
            body = self._body(None, holder=self.identity, transitions=decision.transitions)
            return await self._call(self.leases.create(body))
        assert current is not None
        if decision.action is Action.ACQUIRE:
            self._acquired_wall = self.wall()
            transitions = decision.transitions
        else:
            transitions = _transitions(current)
        body = self._body(current, holder=self.identity, transitions=transitions)
        return await self._call(self.leases.replace(body))

    def _body(
        self, current: dict[str, Any] | None, *, holder: str, transitions: int
    ) -> dict[str, Any]:
        now = micro_time(self.wall())
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            found = current.get("metadata")
            found = found if isinstance(found, dict) else {}
            metadata["resourceVersion"] = found.get("resourceVersion")  # the precondition
            metadata["labels"] = found.get("labels")
        else:
            metadata["labels"] = {"app.kubernetes.io/name": "fencedlease"}
        acquired = self._acquired_wall or self.wall()
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": max(1, round(self.timing.lease_duration)),
                "acquireTime": micro_time(acquired),
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def _notice(self) -> None:
        leading = self.is_leader()
        if leading == self._leading:
            return
        self._leading = leading
        self.changed.set()
        metrics.CONTROLLER_LEADER.set(1 if leading else 0)
        metrics.LEADERSHIP_CHANGES.labels("started" if leading else "stopped").inc()
        if leading:
            log.info(
                "leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name
            )
            for callback in self._on_start:
                callback()
        else:
            log.warning(
                "leader election: %s stopped leading (Lease %s/%s): no more writes",
                self.identity,
                self.namespace,
                self.name,
            )


def _spec(lease: dict[str, Any]) -> dict[str, Any]:
    spec = lease.get("spec")
    return spec if isinstance(spec, dict) else {}


def _transitions(lease: dict[str, Any]) -> int:
    value = _spec(lease).get("leaseTransitions")
    return value if isinstance(value, int) else 0


def _record(lease: dict[str, Any] | None) -> LeaseRecord | None:
    """What the decisions need of a Lease's JSON body (``None``: it does not exist)."""
    if lease is None:
        return None
    metadata = lease.get("metadata")
    if not isinstance(metadata, dict):
        return None
    spec = _spec(lease)
    holder = spec.get("holderIdentity")
    duration = spec.get("leaseDurationSeconds")
    return LeaseRecord(
        resource_version=str(metadata.get("resourceVersion") or ""),
        holder=holder if isinstance(holder, str) else None,
        lease_duration=float(duration) if isinstance(duration, int) and duration > 0 else None,
        transitions=_transitions(lease),
    )
