"""Where a grant is read from: the sources (:class:`~fencedlease.client.grant.GrantSource`).

:class:`DirectoryGrant` reads the downward-API directory and watches it (``watchfiles`` when
installed, polling otherwise); :class:`PodGrant` reads the same annotations from the API (no
kubelet refresh lag: for short leases); :class:`LeaseStatusGrant` reads the FencedLease status.
The two API sources are written as plans (:mod:`fencedlease.client.plans`, like
:mod:`fencedlease.client.publish`): :meth:`~_FromApi.plan` says which objects to read and makes
the grant of them, without I/O; :meth:`~_FromApi.read` drives it with a
:class:`~fencedlease.client.api.KubeClient`, :meth:`~_FromApi.aread` with an
:class:`~fencedlease.client.api.AsyncKubeClient`.  The values they return are
:mod:`fencedlease.client.grant`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from fencedlease.client._compat import wait_event
from fencedlease.client.api import AsyncKubeClient, KubeClient, lease_path, pod_path
from fencedlease.client.contract import DEFAULT_DIR, GRANT_FILES
from fencedlease.client.errors import GrantAbsent, GrantError, TransportError
from fencedlease.client.grant import (
    Grant,
    GrantSource,
    GrantState,
    grant_from_annotations,
    parse_grant,
    parse_time,
    rfc3339,
)
from fencedlease.client.plans import Plan, Reply, Request, drive, drive_async

log = logging.getLogger("fencedlease.client")


def read_grant_dir(directory: str | os.PathLike[str], lease: str | None = None) -> Grant | None:
    """Read the downward-API files in ``directory``; ``None`` if missing or empty."""
    base = Path(directory)
    values: dict[str, str] = {}
    for field, name in GRANT_FILES.items():
        try:
            raw = (base / name).read_bytes()
        except FileNotFoundError:
            raw = b""
        except OSError as exc:
            raise GrantError(f"{base / name}: {exc}", source=str(base)) from exc
        try:
            values[field] = raw.decode("ascii")  # the operator writes ASCII only
        except UnicodeDecodeError as exc:
            raise GrantError(
                f"{base / name}: malformed grant: not ASCII text (byte {exc.start})",
                source=str(base),
            ) from exc
    return parse_grant(values, lease=lease, source=str(base))


class _Polling:
    """Watch by re-reading every ``poll_interval`` seconds; yields the first value, then each
    change."""

    poll_interval: float

    def read(self) -> Grant | None:
        raise NotImplementedError

    async def aread(self) -> Grant | None:
        raise NotImplementedError

    def _poll(self, stop: threading.Event | None) -> Iterator[Grant | None]:
        stop = stop or threading.Event()
        last: Grant | object | None = _UNSET
        while not stop.is_set():
            current = self._safe_read()
            if current != last:
                last = current
                yield current
            stop.wait(self.poll_interval)

    async def _apoll(self, stop: asyncio.Event | None) -> AsyncIterator[Grant | None]:
        stop = stop or asyncio.Event()
        last: Grant | object | None = _UNSET
        while not stop.is_set():
            try:
                current = await self.aread()
            except GrantError as exc:
                log.warning("%s", exc)
                current = None
            if current != last:
                last = current
                yield current
            await wait_event(stop, self.poll_interval)

    def _safe_read(self) -> Grant | None:
        try:
            return self.read()
        except GrantError as exc:  # a malformed or unreadable grant is no grant
            log.warning("%s", exc)
            return None


_UNSET = object()


class DirectoryGrant(_Polling):
    """The grant in a downward-API directory, watched with ``watchfiles`` (falls back to
    polling when it is not installed or cannot watch).  Changes are noticed within
    ``poll_interval`` seconds at worst."""

    def __init__(
        self,
        directory: str | os.PathLike[str] = DEFAULT_DIR,
        lease: str | None = None,
        *,
        poll_interval: float = 1.0,
        use_watchfiles: bool | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.lease = lease
        self.poll_interval = poll_interval
        self.use_watchfiles = use_watchfiles

    def describe(self) -> str:
        return f"directory {self.directory}"

    def read(self) -> Grant | None:
        return read_grant_dir(self.directory, self.lease)

    async def aread(self) -> Grant | None:
        return self.read()  # a few small local files

    def _watchfiles(self) -> Any:
        if self.use_watchfiles is False or not self.directory.is_dir():
            return None
        try:
            import watchfiles
        except ImportError:
            return None
        return watchfiles

    def _watching(self, stop: threading.Event | asyncio.Event) -> dict[str, Any]:
        """watchfiles' options: the poll interval as its timeout, yielding on it too."""
        timeout = int(self.poll_interval * 1000)
        options = {"stop_event": stop, "rust_timeout": timeout, "yield_on_timeout": True}
        return {**options, "debounce": 50, "step": 20}

    def watch(self, stop: threading.Event | None = None) -> Iterator[Grant | None]:
        wf = self._watchfiles()
        if wf is None:
            yield from self._poll(stop)
            return
        stop = stop or threading.Event()
        last = self._safe_read()
        yield last
        # Timeouts re-read too: a directory replaced wholesale, or a missed event, is still seen.
        for _ in wf.watch(self.directory, raise_interrupt=False, **self._watching(stop)):
            current = self._safe_read()
            if current != last:
                last = current
                yield current

    async def awatch(self, stop: asyncio.Event | None = None) -> AsyncIterator[Grant | None]:
        wf = self._watchfiles()
        if wf is None:
            async for grant in self._apoll(stop):
                yield grant
            return
        stop = stop or asyncio.Event()
        last = self._safe_read()
        yield last
        async for _ in wf.awatch(self.directory, **self._watching(stop)):
            current = self._safe_read()
            if current != last:
                last = current
                yield current


def own_pod() -> tuple[str, str | None]:
    """This Pod's name and namespace from the environment (``POD_NAME``/``HOSTNAME``,
    ``POD_NAMESPACE``), as set by a downward-API ``env`` entry."""
    name = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or ""
    if not name:
        raise GrantError("cannot tell this Pod's name: set POD_NAME", source="environment")
    return name, os.environ.get("POD_NAMESPACE") or None


class _FromApi(_Polling):
    """A grant read from the API for lease ``lease`` and Pod ``pod`` (default: this Pod, from
    the environment), polled; ``client`` / ``async_client`` are made on first use when not
    given."""

    def __init__(
        self,
        lease: str,
        *,
        pod: str | None = None,
        namespace: str | None = None,
        client: Any = None,
        async_client: Any = None,
        poll_interval: float = 1.0,
    ) -> None:
        if pod is None:
            pod, env_ns = own_pod()
            namespace = namespace or env_ns
        self.lease = lease
        self.pod = pod
        self._client = client
        self._async_client = async_client
        base = client or async_client
        self.namespace = namespace or (base.namespace if base is not None else "default")
        self.poll_interval = poll_interval

    def plan(self) -> Plan[Grant | None]:
        """The reads of one grant, as a plan (:mod:`.plans`): no I/O here."""
        raise NotImplementedError

    def read(self) -> Grant | None:
        if self._client is None:
            self._client = KubeClient()
        return drive(self.plan(), self._client)

    async def aread(self) -> Grant | None:
        if self._async_client is None:
            self._async_client = AsyncKubeClient()
        return await drive_async(self.plan(), self._async_client)

    def watch(self, stop: threading.Event | None = None) -> Iterator[Grant | None]:
        return self._poll(stop)

    def awatch(self, stop: asyncio.Event | None = None) -> AsyncIterator[Grant | None]:
        return self._apoll(stop)


def _object(reply: Reply | None) -> dict[str, Any]:
    """The object a GET answered, or what ``KubeClient.get`` raises: the
    :class:`TransportError` a driver answered as status 0, an :class:`ApiError` for an error
    status."""
    assert reply is not None
    if reply.status_code == 0:
        raise TransportError(reply.info().message, request=reply.request)
    return reply.raise_for_status().json()


class PodGrant(_FromApi):
    """The grant in a Pod's annotations, read from the API (polled: no kubelet lag).

    ``client`` is a :class:`~fencedlease.client.api.KubeClient` for :meth:`read` /
    :meth:`watch`, and an :class:`~fencedlease.client.api.AsyncKubeClient` for
    :meth:`aread` / :meth:`awatch` (give either or both).
    """

    def describe(self) -> str:
        return f"Pod {self.namespace}/{self.pod} annotations"

    def _parse(self, pod: dict[str, Any]) -> Grant | None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return grant_from_annotations(annotations, self.lease, source=self.describe())

    def plan(self) -> Plan[Grant | None]:
        """Read the Pod."""
        pod = _object((yield Request("GET", pod_path(self.namespace, self.pod))))
        return self._parse(pod)


class LeaseStatusGrant(_FromApi):
    """The grant as the FencedLease status shows it, for holder Pod ``pod``: ``held`` while
    the status says ``Held`` by ``pod``, ``lost`` once it names another holder or phase.

    The status shows the grant, not each renewal: ``valid_until`` is the holder Pod's
    ``valid-until`` annotation (one more GET of this Pod while the status names it), or the
    status ``expireTime`` that operators before schema revision 2 wrote on every renewal.
    :class:`PodGrant` gets the same deadline with one request.
    """

    _mine: Grant | None = None
    """The grant this Pod last held (a later status of another generation: ``lost``)."""

    def describe(self) -> str:
        return f"FencedLease {self.namespace}/{self.lease} status"

    def _needs_pod(self, obj: dict[str, Any]) -> bool:
        status = obj.get("status") or {}
        return status.get("holder") == self.pod and not status.get("expireTime")

    def _parse(self, obj: dict[str, Any], pod: dict[str, Any] | None = None) -> Grant | None:
        status = obj.get("status") or {}
        token, lease_id, expire = (
            status.get("fencingToken"),
            status.get("leaseId"),
            status.get("expireTime"),
        )
        if not expire and pod is not None:
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            shown = grant_from_annotations(annotations, self.lease, source=self.describe())
            if shown is not None and shown.lease_id == lease_id and shown.token == token:
                expire = rfc3339(shown.valid_until)
        if (
            status.get("holder") == self.pod
            and isinstance(token, int)
            and not isinstance(token, bool)
            and token >= 1
            and isinstance(lease_id, str)
            and lease_id
            and expire
        ):
            state = "held" if status.get("phase") == "Held" else "lost"
            try:
                until = parse_time(str(expire))
            except ValueError as exc:
                raise GrantError(
                    f"{self.describe()}: malformed expireTime {str(expire)!r:.60}: {exc}",
                    source=self.describe(),
                ) from exc
            grant = Grant(token, lease_id, until, state, self.lease, self.describe())
            self._mine = grant if state == "held" else None
            return grant
        if self._mine is not None:  # we held it, the status now shows another generation
            lost = Grant(
                self._mine.token,
                self._mine.lease_id,
                self._mine.valid_until,
                "lost",
                self.lease,
                self.describe(),
            )
            return lost
        return None

    def plan(self) -> Plan[Grant | None]:
        """Read the FencedLease, then (when its status names this Pod without a deadline) the
        Pod."""
        obj = _object((yield Request("GET", lease_path(self.namespace, self.lease))))
        pod = None
        if self._needs_pod(obj):
            pod = _object((yield Request("GET", pod_path(self.namespace, self.pod))))
        return self._parse(obj, pod)


def wait_for_grant(
    source: GrantSource, timeout: float | None = None, min_remaining: float = 0.0
) -> Grant:
    """Block until ``source`` shows a held grant (with ``min_remaining`` seconds left)."""
    stop = threading.Event()
    deadline = None if timeout is None else time.monotonic() + timeout
    timer: threading.Timer | None = None
    if timeout is not None:
        timer = threading.Timer(timeout, stop.set)
        timer.daemon = True
        timer.start()
    try:
        for grant in source.watch(stop):
            held = grant is not None and grant.status() is GrantState.HELD
            if grant is not None and held and grant.remaining() >= min_remaining:
                return grant
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        if timer is not None:
            timer.cancel()
    raise GrantAbsent(
        f"{source.describe()}: no held grant within {timeout}s", source=source.describe()
    )
