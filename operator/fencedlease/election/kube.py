"""The election's adapter: a ``coordination.k8s.io/v1`` Lease read and written with
``resourceVersion`` preconditions, driving the pure :class:`~.decisions.Elector`.

API errors are translated here, once: 409 (someone else wrote first) is a lost race, anything
else (timeouts, 5xx, connection errors) a failed attempt that leaves the local deadline as it
is — the deadline, not an error, ends a term.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.election.decisions import Action, Decision, ElectionTiming, Elector, LeaseRecord

log = logging.getLogger(__name__)

FAILURES = (ApiException, aiohttp.ClientError, OSError, TimeoutError)


def micro_time(when: dt.datetime) -> str:
    """The API's MicroTime format (RFC 3339 with microseconds)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
        self.coordination = client.CoordinationV1Api(api)
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
        """One read and, when the decision says so, one conditional write."""
        if self._resigned:
            return
        try:
            current = await self._call(
                self.coordination.read_namespaced_lease(self.name, self.namespace)
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("leader election: reading Lease failed: %s %s", exc.status, exc.reason)
                return
            current = None
        except FAILURES as exc:
            log.warning("leader election: reading Lease failed: %s", exc or type(exc).__name__)
            return
        now = self.clock()
        decision = self.elector.decide(_record(current), now)
        if decision.action is Action.WAIT:
            return
        started = self.clock()
        try:
            await self._write(decision, current)
        except ApiException as exc:
            if exc.status in (404, 409):
                self.elector.conflicted()
                return
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
        self._notice()
        current = await self._call(
            self.coordination.read_namespaced_lease(self.name, self.namespace)
        )
        if current.spec is None or current.spec.holder_identity != self.identity:
            return
        body = self._body(current, holder="", transitions=current.spec.lease_transitions or 0)
        body["spec"]["leaseDurationSeconds"] = 1
        await self._call(self._replace(body))
        log.info("leader election: released Lease %s/%s", self.namespace, self.name)

    # -------------------------------------------------------------------- helpers

    async def _call(self, call: Any) -> Any:
        """One API call, bounded so that a hung request cannot outlive the term it renews."""
        return await asyncio.wait_for(call, self.timing.renew_deadline / 2)

    async def _write(self, decision: Decision, current: client.V1Lease | None) -> None:
        if decision.action is Action.CREATE:
            self._acquired_wall = self.wall()
            body = self._body(None, holder=self.identity, transitions=decision.transitions)
            create = self.coordination.create_namespaced_lease
            await self._call(create(self.namespace, body))  # type: ignore[arg-type]
            return
        assert current is not None
        if decision.action is Action.ACQUIRE:
            self._acquired_wall = self.wall()
            transitions = decision.transitions
        else:
            transitions = (current.spec.lease_transitions if current.spec else 0) or 0
        body = self._body(current, holder=self.identity, transitions=transitions)
        await self._call(self._replace(body))

    def _replace(self, body: dict[str, Any]) -> Any:
        # A plain body: the API's MicroTime needs microseconds, which the models drop.
        replace = self.coordination.replace_namespaced_lease
        return replace(self.name, self.namespace, body)  # type: ignore[arg-type]

    def _body(
        self, current: client.V1Lease | None, *, holder: str, transitions: int
    ) -> dict[str, Any]:
        now = micro_time(self.wall())
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None and current.metadata is not None:
            metadata["resourceVersion"] = current.metadata.resource_version  # the precondition
            metadata["labels"] = current.metadata.labels
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


def _record(lease: client.V1Lease | None) -> LeaseRecord | None:
    if lease is None or lease.metadata is None:
        return None
    spec = lease.spec
    return LeaseRecord(
        resource_version=str(lease.metadata.resource_version),
        holder=spec.holder_identity if spec is not None else None,
        lease_duration=(
            float(spec.lease_duration_seconds)
            if spec is not None and spec.lease_duration_seconds
            else None
        ),
        transitions=(spec.lease_transitions or 0) if spec is not None else 0,
    )
