"""The lease reconciler's writes to Pods: the downward-API annotations each Pod reads of
its leases (docs/downward-api.md), each write conditional, one at a time per Pod, and the
renewed deadlines of one Pod's leases batched into one write.

A Pod can hold many leases; each renewal publishes its deadline on the holder Pod
(``valid-until``). :meth:`PodWrites.patch` makes one write safe (a version read before the
leadership gate, the Pod's UID kept, this process's writes to one Pod taking turns);
:meth:`PodWrites.patch_shared` lets the renewals of one Pod's leases that come due together
share one such write (docs/design.md, "Where each rule lives").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from fencedlease import metrics
from fencedlease.authority.types import LeaseKey
from fencedlease.controller import projection
from fencedlease.controller.grants import LiveGrant
from fencedlease.controller.pods import PodCache, PodInfo
from fencedlease.controller.ports import PodAnnotationWrites
from fencedlease.models import pod_annotation_keys, rfc3339

log = logging.getLogger(__name__)

POD_WRITE_ATTEMPTS = 3
"""Conditional Pod annotation attempts per write (each after a fresh read)."""

GATHER_FRACTION = 0.1
"""A Pod's deadline write waits for the renewals of its other leases still in etcd at most
this fraction of the renew interval (and at most :data:`GATHER_LIMIT`), so one stuck etcd
call does not hold back the deadlines of the Pod's other leases. Of a write that carries
renewals of different intervals the shortest counts, from the write's opening."""
GATHER_LIMIT = 1.0

PodKey = tuple[str, str]
"""(namespace, name) of a Pod."""


@dataclass
class _DeadlineBatch:
    """Renewed deadlines of leases held by one Pod, waiting for one write to it; closed (no
    more joins) once that write holds the Pod's turn."""

    uid: str
    annotations: dict[str, str | None]
    done: asyncio.Future[bool]
    opened: float
    """When the batch opened (the clock): every bound on its wait runs from it."""
    until: float
    """The latest end of its wait (the clock): the opening plus the smallest ``wait`` of the
    renewals in it, so none is held back past its own bound."""
    joined: int = 0
    gathered: asyncio.Future[None] | None = None
    """Set while the write waits for renewals of the same Pod still in etcd."""
    timer: asyncio.Timeout | None = None
    """That wait's timeout, while it runs: a joiner with a smaller bound moves it earlier."""


class PodWrites:
    """Annotation writes to Pods, through ``kube`` (gated by leadership), kept in ``pods``."""

    def __init__(
        self,
        kube: PodAnnotationWrites,
        pods: PodCache,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.pods = pods
        self.clock = clock
        self._batches: dict[PodKey, _DeadlineBatch] = {}
        self._in_etcd: dict[PodKey, int] = {}
        """Read-free renewals in their etcd call, by holder Pod: a deadline write to that Pod
        waits for them (:meth:`patch_shared`)."""
        self._locks: weakref.WeakValueDictionary[PodKey, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        """One lock per Pod being written (gone once no write holds it)."""

    # ------------------------------------------------------- what a Pod reads of a lease

    async def announce(
        self, key: LeaseKey, pod: PodInfo, token: int, lease_id: str, valid_until: str
    ) -> None:
        """Pod ``pod`` holds lease ``key``: its four annotations."""
        keys = pod_annotation_keys(key.name)
        await self.patch(
            pod,
            {
                keys["token"]: str(token),
                keys["lease_id"]: lease_id,
                keys["valid_until"]: valid_until,
                keys["state"]: "held",
            },
        )

    async def publish_deadline(self, key: LeaseKey, pod: PodInfo, live: LiveGrant) -> None:
        """A renewal's one API write: the holder Pod's ``valid-until`` alone when the Pod
        already shows this grant (token, lease id, ``held``; shared with the renewals of its
        other leases, :meth:`patch_shared`), else all four annotations."""
        keys = pod_annotation_keys(key.name)
        shown = self.pods.get(pod.namespace, pod.name) or pod
        if (
            shown.annotations.get(keys["lease_id"]) == live.lease_id
            and shown.annotations.get(keys["token"]) == str(live.token)
            and shown.annotations.get(keys["state"]) == "held"
        ):
            await self.patch_shared(
                pod,
                {keys["valid_until"]: rfc3339(live.valid_until)},
                wait=min(GATHER_LIMIT, projection.renew_interval(live.duration) * GATHER_FRACTION),
            )
        else:
            await self.announce(key, pod, live.token, live.lease_id, rfc3339(live.valid_until))

    async def mark_lost(
        self, key: LeaseKey, keep: tuple[str, str] | None, reason: str = "handed_over"
    ) -> None:
        """Every Pod that reads ``held`` for lease ``key`` but is not the live holder
        (``keep``: its name and lease id) → ``lost``.

        The token and lease id stay: a former holder may still read what it had.
        """
        keys = pod_annotation_keys(key.name)
        for pod in self.pods.annotated(key.namespace, key.name):
            if pod.annotations.get(keys["state"]) != "held":
                continue
            if keep is not None and (pod.name, pod.annotations.get(keys["lease_id"])) == keep:
                continue
            if await self.patch(pod, {keys["state"]: "lost"}):
                metrics.HOLDER_LOSSES.labels(reason).inc()

    async def clean(self, key: LeaseKey) -> None:
        """Lease ``key`` is gone: no Pod reads anything of it any more."""
        keys = pod_annotation_keys(key.name)
        for pod in self.pods.annotated(key.namespace, key.name):
            await self.patch(pod, dict.fromkeys(keys.values()))

    # ------------------------------------------------------------------- batching

    @contextlib.contextmanager
    def renewing(self, pod: PodKey) -> Iterator[None]:
        """A read-free renewal of a lease held by ``pod`` is in its etcd call: a deadline
        write to the Pod opened meanwhile waits for it (:meth:`patch_shared`). Once none is
        left in one, the Pod's waiting write goes out. The caller joins (or opens) the Pod's
        write without awaiting anything else after leaving."""
        self._in_etcd[pod] = self._in_etcd.get(pod, 0) + 1
        try:
            yield
        finally:
            self._left_etcd(pod)

    def _left_etcd(self, pod: PodKey) -> None:
        left = self._in_etcd[pod] - 1
        if left:
            self._in_etcd[pod] = left
            return
        del self._in_etcd[pod]
        batch = self._batches.get(pod)
        if batch is not None and batch.gathered is not None and not batch.gathered.done():
            batch.gathered.set_result(None)

    async def patch_shared(
        self, pod: PodInfo, annotations: dict[str, str | None], *, wait: float = 0.0
    ) -> bool:
        """Renewed deadlines of leases held by one Pod share one write: a renewal that finds
        a write to its Pod not yet sent joins it and gets its result; otherwise it opens one.
        The opened write first waits while read-free renewals of leases held by that Pod are
        in their etcd call (:meth:`renewing`; they come due on the Pod's ticks together):
        they join it as they commit, so a Pod holding many leases is written once per tick
        rather than once per wave of etcd replies. The wait ends when the last of them
        commits or fails, or after ``wait`` seconds from its opening, the smallest ``wait``
        of the renewals in it: one that joins with a smaller bound than the opener's shortens
        the wait to it (or ends it, once that much passed), so no renewal's deadline waits
        longer than its own bound. Until then the holder keeps reading its previous deadline,
        which is earlier. The write is :meth:`patch`'s (conditional, gated, UID-bound); a
        batch closes when the write gets the Pod's turn, so nothing joins after it is sent."""
        key = (pod.namespace, pod.name)
        batch = self._batches.get(key)
        if batch is not None and batch.uid == pod.uid:
            batch.annotations.update(annotations)
            batch.joined += 1
            self._bound_gather(batch, wait)
            return await asyncio.shield(batch.done)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        opened = self.clock()
        batch = self._batches[key] = _DeadlineBatch(
            pod.uid, dict(annotations), done, opened, opened + max(wait, 0.0)
        )

        def close() -> None:
            if self._batches.get(key) is batch:
                del self._batches[key]

        try:
            if wait > 0 and self._in_etcd.get(key):
                batch.gathered = loop.create_future()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait) as timer:
                        batch.timer = timer
                        try:
                            await batch.gathered
                        finally:
                            batch.timer = None
            ok = await self.patch(pod, batch.annotations, on_turn=close)
        except BaseException as exc:
            close()
            if batch.joined:
                if isinstance(exc, Exception):
                    done.set_exception(exc)  # NotLeader, an API error: every pass sees it
                else:  # the opener was cancelled: the joiners' deadlines were not written
                    done.set_result(False)
            raise
        close()
        done.set_result(ok)
        return ok

    def _bound_gather(self, batch: _DeadlineBatch, wait: float) -> None:
        """A renewal joined ``batch`` with its own bound ``wait``: the batch's wait ends no
        later than that long after the batch opened (at once, if that time has passed)."""
        until = batch.opened + max(wait, 0.0)
        if until >= batch.until:
            return
        batch.until = until
        timer, gathered = batch.timer, batch.gathered
        if timer is None or gathered is None:
            return  # not waiting: nothing to shorten
        # Not while the wait is ending anyway (timed out, or the Pod's last renewal left
        # etcd): an expiring timeout cannot be moved.
        if not timer.expired() and not gathered.done():
            left = max(0.0, until - self.clock())
            timer.reschedule(asyncio.get_running_loop().time() + left)

    # ------------------------------------------------------------------- one write

    async def patch(
        self,
        pod: PodInfo,
        annotations: dict[str, str | None],
        on_turn: Callable[[], None] | None = None,
    ) -> bool:
        """Annotate ``pod``, each attempt conditional on a version read *before* the
        leadership gate that attempt passes (``docs/operations.md``, "Controller failover").

        A replica paused between its gate and the request sends a version its successor has
        since moved (the successor annotates every Pod whose state it changes): the API
        server refuses it, the re-read's attempt meets the gate again, and a replica whose
        term ended writes nothing. A version moved by the kubelet costs one re-read. A Pod
        re-created under the same name (another uid) is not annotated. This process's writes
        to one Pod (one Pod may hold many leases) take turns, each from the version the one
        before it made (kept in the Pod cache). ``False``: not written (gone, replaced, or
        still changing after :data:`POD_WRITE_ATTEMPTS`)."""
        key = (pod.namespace, pod.name)
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            if on_turn is not None:
                on_turn()
            current: PodInfo | None = self.pods.get(pod.namespace, pod.name) or pod
            for _ in range(POD_WRITE_ATTEMPTS):
                if current is None or (pod.uid and current.uid != pod.uid):
                    return False
                version = await self.kube.patch_pod_annotations(
                    pod.namespace, pod.name, annotations, current.resource_version
                )
                if version is not None:
                    merged = {**current.annotations, **annotations}
                    written = {k: v for k, v in merged.items() if v is not None}
                    self.pods.refresh(
                        replace(current, annotations=written, resource_version=version)
                    )
                    return True
                body = await self.kube.read_pod(pod.namespace, pod.name)
                current = None if body is None else PodInfo.from_body(body)
                if current is None or (pod.uid and current.uid != pod.uid):
                    self.pods.gone(pod.namespace, pod.name, pod.uid)
        log.warning(
            "%s/%s: not annotated: the Pod changed under %d attempts",
            pod.namespace,
            pod.name,
            POD_WRITE_ATTEMPTS,
        )
        return False
