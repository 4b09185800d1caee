"""List and watch one kind of Kubernetes object, for as long as the process runs.

Every watch in the operator is one :class:`ListWatch`: the controller's caches (FencedLeases,
Pods, FencedArtifacts), the fenced objects' kinds and FencePolicies (``controller/objects.py``,
``registration/fencepolicies.py``), the webhook's FencedLease policy table
(``webhook/leases.py``) and the webhook configuration's watchdog
(``registration/selfregistration.py``). The loop is the API
server's list-then-watch contract, the one client-go's reflector follows:

* **list** (paginated), hand every object over as an event of type ``None`` (with the list's
  ``kind`` and ``apiVersion``, which list items lack), then report the complete list
  (``on_listed``: a cache drops what it holds and the list no longer shows, deleted or out
  of the selector's scope while no watch was open);
* **watch** from the list's ``resourceVersion`` with bookmarks; each event is handed over as
  the API sends it, and its version remembered;
* a watch that ends (the server's ``timeoutSeconds``, a dropped connection, the client
  timeout) is **resumed** from the last version seen; so is a watch **silent** for longer
  than ``inactivity_timeout`` (no event, no bookmark: the API server sends a bookmark about
  every minute, so a silent stream is a dead one the TCP connection did not notice; Kopf's
  idea, ``settings.watching.inactivity_timeout``, docs/design.md); ``410 Gone`` (that version was
  compacted away) **relists**; any other failure (a kind not served yet: its CRD comes later)
  backs off and retries, resuming, or relisting when the consumer asked to hear of gaps
  (``on_failure``: a table that may have missed a deletion is not trusted until relisted);
* every request, event, bookmark and ending is reported to ``on_activity`` (liveness: a loop
  that keeps trying shows life, a wedged one does not).

Why our own and not a library's (Kopf hosts the operator and watches the FencedLeases,
``fencedlease/kopfapp.py``; these are the watches it cannot serve): Kopf's public API reports
no list's completion, so an object deleted while its watch was down is never seen;
kubernetes_asyncio's ``Watch`` reads lines with aiohttp's ``readline``, which refuses lines
above 128 KiB (a Pod may carry 256 KiB of annotations), and leaves listing and 410 to the
caller. This module is an adapter (docs/design.md, floor 2): it talks to the
API server and knows nothing of leases or Pods.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

log = logging.getLogger(__name__)

EventSink = Callable[[Mapping[str, Any]], Awaitable[None] | None]
"""Takes one event, ``{"type": "ADDED" | "MODIFIED" | "DELETED" | None, "object": {...}}``
(``None``: listed). It runs in the loop, in event order (a coroutine is awaited before the
next event is read: keep it short); what it raises is logged and the stream goes on."""
ListedSink = Callable[[str | None, set[tuple[str, str]]], Awaitable[None] | None]
"""Takes the namespace watched and the ``(namespace, name)`` of every object a complete
list showed (after their events)."""

SERVER_TIMEOUT = 300
"""Seconds the API server keeps one watch request open (``timeoutSeconds``)."""
CLIENT_TIMEOUT = 330.0
"""Seconds one watch request may last on our side: a healthy watch reconnects, and shows
activity, at least this often (the liveness bound of a watch)."""
INACTIVITY_TIMEOUT = 70.0
"""Seconds a watch stream may go without an event or a bookmark before it is dropped and
resumed: the API server sends a bookmark about every minute and keeps about 75 seconds of
events for a resume, so a dead stream is resumed while its events are still there (Kopf's
default and reasoning)."""
REQUEST_TIMEOUT = 30.0
"""Seconds one list page may take."""
PAGE_SIZE = 500


class Response(Protocol):
    """What the loop reads of an HTTP response (aiohttp's ``ClientResponse``)."""

    status: int
    reason: str | None

    async def read(self) -> bytes: ...

    def release(self) -> Any: ...

    @property
    def content(self) -> Any:
        """A stream with ``iter_any()`` (chunks as they arrive)."""


class Api(Protocol):
    """What the loop needs of kubernetes_asyncio's ``ApiClient``."""

    async def call_api(
        self,
        resource_path: str,
        method: str,
        *,
        query_params: Any = None,
        header_params: dict[Any, Any] | None = None,
        response_types_map: dict[Any, Any] | None = None,
        auth_settings: list[Any] | None = None,
        _return_http_data_only: bool | None = None,
        _preload_content: bool = True,
    ) -> Any: ...


class WatchFailed(Exception):
    """A list or watch request answered with an error (``status``: its HTTP code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Watched:
    """Which objects: a kind (``group`` ``""``: the core API), in one namespace or all,
    optionally only those a label or field selector matches (filtered by the API server)."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespace:
            base += f"/namespaces/{quote(self.namespace, safe='')}"
        return f"{base}/{self.plural}"

    def __str__(self) -> str:
        return self.plural if not self.namespace else f"{self.plural} in {self.namespace}"


def backoff(failures: int) -> float:
    """Seconds before the next attempt after ``failures`` failures in a row (jittered)."""
    return min(30.0, 0.5 * 2.0 ** min(failures, 6)) * random.uniform(0.5, 1.0)


class ListWatch:
    """The list-then-watch loop of one :class:`Watched` (see the module). :meth:`run` until
    cancelled; :attr:`synced` is set once the first complete list was handed over."""

    def __init__(
        self,
        api: Api,
        what: Watched,
        on_event: EventSink,
        *,
        on_listed: ListedSink | None = None,
        on_activity: Callable[[], None] | None = None,
        on_failure: Callable[[], None] | None = None,
        page_size: int = PAGE_SIZE,
        server_timeout: int = SERVER_TIMEOUT,
        client_timeout: float = CLIENT_TIMEOUT,
        inactivity_timeout: float = INACTIVITY_TIMEOUT,
        pause: Callable[[int], float] = backoff,
    ) -> None:
        self.api = api
        self.what = what
        self.on_event = on_event
        self.on_listed = on_listed
        self.on_activity = on_activity
        self.on_failure = on_failure
        """Told of every failed list or watch; given, the loop relists after one."""
        self.page_size = page_size
        self.server_timeout = server_timeout
        self.client_timeout = client_timeout
        self.inactivity_timeout = inactivity_timeout
        self.pause = pause
        self.synced = asyncio.Event()
        self.lists = 0
        """Complete lists handed over (the first one, and one per relist)."""
        self.version: str | None = None
        """The version the next watch starts from (``None``: list first): the list's, then
        that of the last event or bookmark handed over."""
        self.heard = False
        """Whether the current (or last) watch request got an event or a bookmark."""
        self.silences = 0
        """Watch requests dropped for being silent past ``inactivity_timeout``."""

    async def run(self) -> None:
        failures = 0
        while True:
            listed = False
            try:
                if self.version is None:
                    self.version = await self._list()
                    self.lists += 1
                    self.synced.set()
                    listed = True
                if await self._watch(self.version):
                    failures = 0
                    continue
                failures += 1  # a watch that ended with nothing said: pause, as on failure
            except asyncio.CancelledError:
                raise
            except WatchFailed as error:
                if error.status == 410:
                    log.info("%s: the watch's version is gone (410); relisting", self.what)
                    self.version = None
                    if not listed or self.heard:
                        continue
                    # Gone at once from a list just made: relisting at once would loop.
                failures += 1
                log.warning("%s: list or watch failed (%s); retrying", self.what, error)
            except Exception as error:  # a connection, a timeout, a malformed line
                failures += 1
                log.warning("%s: list or watch failed (%r); retrying", self.what, error)
            if self.on_failure is not None:
                self.version = None
                self.on_failure()
            self._saw()
            await asyncio.sleep(self.pause(failures))

    def _saw(self) -> None:
        if self.on_activity is not None:
            self.on_activity()

    async def _hand_over(self, event: Mapping[str, Any]) -> None:
        try:
            handled = self.on_event(event)
            if inspect.isawaitable(handled):
                await handled
        except Exception:
            log.exception("%s: handling a watch event failed; ignored", self.what)

    def _query(self, **extra: str) -> list[tuple[str, str]]:
        query = [(k, v) for k, v in extra.items() if v]
        if self.what.label_selector:
            query.append(("labelSelector", self.what.label_selector))
        if self.what.field_selector:
            query.append(("fieldSelector", self.what.field_selector))
        return query

    async def _get(self, query: list[tuple[str, str]]) -> Any:
        self._saw()
        response = await self.api.call_api(
            self.what.path,
            "GET",
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _return_http_data_only=True,
        )
        if not 200 <= response.status <= 299:
            try:
                body = (await response.read()).decode(errors="replace")
            finally:
                response.release()
            raise WatchFailed(response.status, body[:500] or str(response.reason))
        return response

    async def _list(self) -> str:
        """List every page; hand the objects over, then report the complete list. Returns
        the list's resourceVersion (the watch starts there)."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                response = await self._get(
                    self._query(limit=str(self.page_size), **{"continue": token})
                )
                try:
                    page = json.loads(await response.read())
                finally:
                    response.release()
            if not isinstance(page, dict):
                raise ValueError(f"{self.what}: a list page is not a JSON object")
            typed = {
                "kind": str(page.get("kind") or "").removesuffix("List"),
                "apiVersion": str(page.get("apiVersion") or ""),
            }
            items.extend({**typed, **i} for i in page.get("items") or () if isinstance(i, dict))
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                version = str(meta.get("resourceVersion") or "")
                break
        self._saw()
        listed: set[tuple[str, str]] = set()
        for item in items:
            meta = item.get("metadata") or {}
            listed.add((str(meta.get("namespace", "")), str(meta.get("name", ""))))
            await self._hand_over({"type": None, "object": item})
        if self.on_listed is not None:
            handled = self.on_listed(self.what.namespace, listed)
            if inspect.isawaitable(handled):
                await handled
        return version

    async def _watch(self, version: str) -> bool:
        """One watch request from ``version``, bounded by the client timeout; each event
        moves :attr:`version` on. Whether any event came (``WatchFailed`` 410: that version
        is gone, relist)."""
        self.heard = False
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.client_timeout):
            response = await self._get(
                self._query(
                    watch="true",
                    allowWatchBookmarks="true",
                    resourceVersion=version,
                    timeoutSeconds=str(self.server_timeout),
                )
            )
            quiet = asyncio.timeout_at(loop.time() + self.inactivity_timeout)
            try:
                async with quiet:
                    async for line in _lines(response.content):
                        quiet.reschedule(loop.time() + self.inactivity_timeout)
                        self._saw()
                        self.version = await self._event(json.loads(line)) or self.version
                        self.heard = True  # an event or a bookmark (an ERROR raised above)
            except TimeoutError:
                if not quiet.expired():
                    raise  # the client timeout: the caller's
                self.silences += 1
                log.info(
                    "%s: the watch was silent for %gs (no event, no bookmark); resuming",
                    self.what,
                    self.inactivity_timeout,
                )
                return True  # resumed at once from the version seen (Kopf's inactivity rule)
            finally:
                response.release()
                self._saw()
        return self.heard

    async def _event(self, event: Any) -> str:
        """Hand one watch event over; the version it shows (``""``: none). An ``ERROR``
        event raises :class:`WatchFailed` with its code (410: the version is gone)."""
        if not isinstance(event, dict):
            raise ValueError(f"{self.what}: a watch event is not a JSON object")
        kind, body = event.get("type"), event.get("object")
        if kind == "ERROR":
            status = body if isinstance(body, dict) else {}
            code = status.get("code")
            raise WatchFailed(
                code if isinstance(code, int) else 500, str(status.get("message") or status)
            )
        if not isinstance(body, dict):
            return ""
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            await self._hand_over(event)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")


async def _lines(stream: Any) -> AsyncIterator[bytes]:
    """The non-empty complete lines of a byte stream as they arrive (any length)."""
    buffer = b""
    async for chunk in stream.iter_any():
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                break
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line.strip():
                yield line
    # A line cut short (the stream broke mid-event) is dropped: the watch resumes from the
    # version before it and gets the event again.
