"""A FencedLease's deletion: the controller's finalizer that holds the object, and what is done
before it lets go (release the grant, drop the etcd record, clean the holder Pods' annotations).

A lease holding the finalizer goes only by our own pass, which forgets it; one deleted before
the finalizer landed is found gone by the write that would have added it, and released and
cleaned at once if this term granted it (docs/design.md, "What is Kopf's and what is ours":
no DELETED event is relied on, a watch that was down never reports one). Called by
:meth:`~.reconciler.LeaseReconciler.reconcile`, built by :func:`~.runtime.lease_reconciler`.
"""

from __future__ import annotations

import contextlib

from fencedlease.authority.types import LeaseKey, LeaseState, StoreUnavailable
from fencedlease.controller.grants import Memories
from fencedlease.controller.leases import LEASE_FINALIZER, LeaseCache, LeaseObject
from fencedlease.controller.podwrites import PodWrites
from fencedlease.controller.ports import LeaseStore, LeaseWrites


class Deletions:
    """The finalizer of every FencedLease, and the release that deleting one carries out."""

    def __init__(
        self,
        store: LeaseStore,
        kube: LeaseWrites,
        leases: LeaseCache,
        memory: Memories,
        writes: PodWrites,
    ) -> None:
        self.store = store
        self.kube = kube
        self.leases = leases
        self.memory = memory
        self.writes = writes

    async def missing(self, key: LeaseKey) -> None:
        """Lease ``key`` is not in the cache (deleted): forget it, after releasing a grant
        this term made."""
        if self.memory.live(key) is not None:
            # Deleted with no finalizer of ours (it had not landed, and the write that would
            # have added it conflicted): nothing holds the object, so release the grant and
            # clean its holder now, or its Pod would read `held` until the deadline passed.
            await self.finalize(key)
        self.memory.gone(key)  # and what was said about it

    async def deleting(self, lease: LeaseObject) -> None:
        """``lease`` is being deleted: release it, then let it go (our finalizer removed)."""
        key = lease.key
        if LEASE_FINALIZER in lease.finalizers:
            await self.finalize(key)
            rest = [f for f in lease.finalizers if f != LEASE_FINALIZER]
            version = await self.kube.set_lease_finalizers(
                key.namespace, key.name, lease.resource_version, rest
            )
            if version is not None and not rest:
                # Gone now, by our own write: forget it here, not on its DELETED event, which
                # a watch down at this moment never sees (docs/design.md, "What is Kopf's and
                # what is ours").
                self.leases.remove(key)
        elif self.memory.live(key) is not None:
            # Granted before our finalizer could land (held by someone else's): the API server
            # refuses new finalizers now, so release and clean up at once.
            await self.finalize(key)

    async def ensure_finalizer(self, lease: LeaseObject) -> bool:
        """Deleting the lease must release it and clean the Pods: hold it until we have.

        Written after the pass, so a first grant's etcd transaction and Pod write do not share
        the API server and etcd with it (grant latency); and before the status write, which is
        conditional on the version it makes. A conflict means a newer version is on its way
        (its event pokes us again). A lease deleted before the finalizer landed has none to
        hold it: if this term granted it, release it and clean its Pods now, and forget it
        (``False``: gone)."""
        if LEASE_FINALIZER in lease.finalizers:
            return True
        added = [*lease.finalizers, LEASE_FINALIZER]
        version = await self.kube.set_lease_finalizers(
            lease.namespace, lease.name, lease.resource_version, added
        )
        if version is not None:
            lease.finalizers = tuple(added)
            lease.resource_version = version
            return True
        if await self.kube.get_lease(lease.namespace, lease.name) is not None:
            return True
        if self.memory.live(lease.key) is not None:
            await self.finalize(lease.key)
        self.leases.remove(lease.key)  # its DELETED event may never come (a watch gap)
        return False

    async def finalize(self, key: LeaseKey) -> None:
        """Release lease ``key``, drop its record, clean its Pods' annotations.

        The token grants and the high-water mark stay in etcd: a re-created lease of the same
        name keeps rejecting old tokens.
        """
        view = await self.store.read(key.namespace, key.name)
        if view is not None and view.record.state is LeaseState.HELD:
            # A release that cannot decide (contention) is not retried: the delete below ends
            # the generation anyway, and raises itself when etcd is unreachable.
            with contextlib.suppress(StoreUnavailable):
                await self.store.release(key.namespace, key.name, view.record.lease_id, view.token)
        await self.store.delete(key.namespace, key.name)
        await self.writes.clean(key)
        self.memory.forget_grant(key)
