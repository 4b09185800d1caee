"""The requests the controller keeps by the lease they name: FencedReleases
(``controller/releases.py``) and FencedClaims (``controller/claims.py``), one registry for both.

Each kind's watch hands its events to :meth:`ByLease.on_event` (keep the request, poke the
lease it names) and its complete lists to :meth:`ByLease.listed`: a request deleted while no
watch was open (the gap before a relist after ``410 Gone``) sends no ``DELETED`` event, so a
complete list drops what it no longer shows and pokes those leases, as a deletion would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from fencedlease.authority.types import LeaseKey

Poke = Callable[[LeaseKey], None]


class Named(Protocol):
    """A namespaced object by name."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=Named)
K = TypeVar("K", bound=tuple[str, str])


def unlisted(keys: Iterable[K], namespace: str | None, listed: set[tuple[str, str]]) -> list[K]:
    """The ``(namespace, name)`` keys (in ``namespace``, or all) a complete list did not show."""
    return [k for k in keys if namespace in (None, k[0]) and (k[0], k[1]) not in listed]


class ByLease(Generic[R]):
    """Requests by the lease they name, then by their own name.

    A kind says how to read one from a watched body (``parse``: ``None`` when it names
    nothing) and which lease it names (``lease_of``); :meth:`upsert` says whether a change is
    news to its lease (the default: a request not known yet).
    """

    def __init__(
        self, parse: Callable[[Mapping[str, Any]], R | None], lease_of: Callable[[R], LeaseKey]
    ) -> None:
        self.parse = parse
        self.lease_of = lease_of
        self._by_lease: dict[LeaseKey, dict[str, R]] = {}

    def known(self, request: R) -> R | None:
        """The kept version of ``request`` (same lease and name), if any."""
        return self._by_lease.get(self.lease_of(request), {}).get(request.name)

    def put(self, request: R) -> None:
        self._by_lease.setdefault(self.lease_of(request), {})[request.name] = request

    def update(self, request: R) -> None:
        """Replace the kept version of ``request``; nothing if it was forgotten meanwhile."""
        if self.known(request) is not None:
            self.put(request)

    def upsert(self, request: R) -> bool:
        """Keep ``request``; ``True`` when its lease should be looked at."""
        new = self.known(request) is None
        self.put(request)
        return new

    def remove(self, namespace: str, name: str) -> LeaseKey | None:
        """Forget request ``namespace/name``; the lease it named, if it was known."""
        for key, requests in self._by_lease.items():
            if key.namespace == namespace and requests.pop(name, None) is not None:
                if not requests:
                    del self._by_lease[key]
                return key
        return None

    def of(self, key: LeaseKey) -> list[R]:
        """The requests naming lease ``key``, oldest kept first."""
        return list(self._by_lease.get(key, {}).values())

    def on_event(self, event: Mapping[str, Any], poke: Poke) -> None:
        """One watch event: keep the request, poke its lease when it is news to it (a new
        request to act on, or a deleted one: its Pod no longer asks)."""
        body = event.get("object") or {}
        if event.get("type") == "DELETED":
            meta = body.get("metadata") or {}
            key = self.remove(str(meta.get("namespace", "")), str(meta.get("name", "")))
            if key is not None:
                poke(key)
            return
        request = self.parse(body)
        if request is not None and self.upsert(request):
            poke(self.lease_of(request))

    def listed(self, namespace: str | None, listed: set[tuple[str, str]], poke: Poke) -> None:
        """A complete list (in ``namespace``, or all): what it does not show was deleted
        while no watch was open; forget it and poke its lease, as its deletion would."""
        names = [(r.namespace, r.name) for rs in self._by_lease.values() for r in rs.values()]
        for namespace_, name in unlisted(names, namespace, listed):
            key = self.remove(namespace_, name)
            if key is not None:
                poke(key)
