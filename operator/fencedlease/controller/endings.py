"""Generations ended before their time: by an administrator (a force release), or because an
etcd restored from an older snapshot brought back one this lease had already passed."""

from __future__ import annotations

from fencedlease import metrics
from fencedlease.authority.types import (
    LeaseView,
    NotHeld,
    Released,
)
from fencedlease.controller.leases import LeaseObject
from fencedlease.controller.ports import LeaseStore, LeaseWrites
from fencedlease.controller.reports import LeaseEvents
from fencedlease.models import ANNOTATION_FORCE_RELEASE


class Endings:
    """Ends generations in etcd through ``store``, tells through ``events``."""

    def __init__(self, store: LeaseStore, kube: LeaseWrites, events: LeaseEvents) -> None:
        self.store = store
        self.kube = kube
        self.events = events

    async def restored_generation(
        self, lease: LeaseObject, view: LeaseView, newest: int
    ) -> LeaseView | None:
        """A held generation in etcd older than one this lease already granted (its signed
        status showed a greater token) is what an etcd restored from an older snapshot holds:
        that generation ended long ago.  It is never renewed nor shown as Held again (its
        holder would be told to work under a token the resource already passed); it is ended
        in etcd, and the next grant goes through the restore guard like any other. ``newest``:
        the highest token the lease's signed status showed. The view to decide on next."""
        key = lease.key
        if view.token >= newest:
            return view
        ended = await self.store.force_release(key.namespace, key.name, view.record.lease_id)
        if isinstance(ended, Released):  # else our read predates a newer grant: nothing ended
            await self.events.post(
                lease,
                "Warning",
                "RestoredGeneration",
                f"etcd holds lease {view.record.lease_id} (token {view.token}) of Pod "
                f"{view.record.holder}, older than token {newest} this lease already granted: "
                "etcd was restored from an older snapshot; that generation is ended, not renewed",
            )
        return await self.store.read(key.namespace, key.name)

    async def force_release(
        self, lease: LeaseObject, view: LeaseView | None, lease_id: str
    ) -> tuple[LeaseView | None, str | None]:
        """An administrator asked to release generation ``lease_id`` (the lease's
        force-release annotation, removed here): the view to decide on next, and the holder
        the release took the lease from (not chosen again if another Pod can hold it)."""
        key = lease.key
        result = await self.store.force_release(key.namespace, key.name, lease_id)
        excluded = None
        match result:
            case Released():
                metrics.FORCE_RELEASES.labels("released").inc()
                holder = view.record.holder if view is not None else "?"
                excluded = holder  # counted as a holder loss when its Pod is marked lost
                await self.events.post(
                    lease,
                    "Warning",
                    "ForceReleased",
                    f"lease {lease_id} of Pod {holder} force-released by an administrator; "
                    "the old holder is not stopped, only fenced by the newer token",
                )
                view = await self.store.read(key.namespace, key.name)
            case NotHeld():
                metrics.FORCE_RELEASES.labels("ignored").inc()
                await self.events.post(
                    lease,
                    "Warning",
                    "ForceReleaseIgnored",
                    f"force release of lease {lease_id} ignored: {result.reason}",
                )
        version = await self.kube.patch_lease_annotations(
            key.namespace, key.name, {ANNOTATION_FORCE_RELEASE: None}
        )
        lease.annotations.pop(ANNOTATION_FORCE_RELEASE, None)
        if version is not None:
            lease.resource_version = version  # our own change: the status write follows it
        return view, excluded
