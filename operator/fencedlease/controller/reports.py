"""The Events the lease reconciler posts on a FencedLease (each logged too), and the ones it
says once: an invalid spec once per generation, an unverified status once per forgery
(docs/operations.md, "Events")."""

from __future__ import annotations

import logging

from fencedlease import metrics
from fencedlease.controller.grants import Memories
from fencedlease.controller.leases import LeaseObject, Unverified
from fencedlease.controller.ports import EventWrites
from fencedlease.events import lease_ref

log = logging.getLogger(__name__)


class LeaseEvents:
    """Events on FencedLeases through ``kube``; what was said once is kept in ``memory``."""

    def __init__(self, kube: EventWrites, memory: Memories) -> None:
        self.kube = kube
        self.memory = memory

    async def post(self, lease: LeaseObject, type_: str, reason: str, message: str) -> None:
        """Log it and post it as a Kubernetes Event on ``lease``."""
        level = logging.INFO if type_ == "Normal" else logging.WARNING
        log.log(level, "%s/%s: %s: %s", lease.namespace, lease.name, reason, message)
        await self.kube.event(
            lease_ref(lease.namespace, lease.name, lease.uid), type_, reason, message
        )

    async def invalid_spec(self, lease: LeaseObject, error: str) -> None:
        """Once per generation."""
        if self.memory.report_spec_error(lease.key, lease.generation):
            await self.post(lease, "Warning", "InvalidSpec", error)

    async def unverified(self, lease: LeaseObject, found: Unverified | None) -> None:
        """A status token without the authority's proof, or a status that does not parse
        (``found``; ``None``: neither): said once per forgery, never trusted (the pass
        writes the status from etcd)."""
        if not self.memory.report_unverified(lease.key, found):
            return
        assert found is not None
        metrics.UNVERIFIED_TOKENS.labels("lease_status").inc()
        await self.post(lease, "Warning", "UnverifiedToken", unverified_message(found))


def unverified_message(found: Unverified) -> str:
    if found.error is None:
        return (
            f"status.fencingToken {found.token} does not carry this operator's proof "
            "(written by someone else, signed with another key, or by a version without "
            "proofs): the restore guard ignores it and this pass writes the signed grant "
            "from etcd"
        )
    shown = "" if found.token is None else f" (it shows fencingToken {found.token})"
    return (
        f"the status does not parse{shown}: {found.error}; none of it is trusted (written by "
        "someone else, or let in by an older CRD) and this pass writes the signed grant "
        "from etcd"
    )
