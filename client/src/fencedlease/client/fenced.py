"""Stamp this holder's grant on every write: fenced objects from a controller
(docs/fenced-objects.md, "The controller pattern").

A fenced object (labelled ``fencedlease.io/lease``, of a kind a FencePolicy declares) must
carry its writer's token in ``fencedlease.io/token`` on every write. The helpers here put the
token of the grant *currently* held on every write, read from a :class:`GrantSource` (the
downward-API files, :class:`~fencedlease.client.sources.DirectoryGrant`) just before it is sent:

* :func:`stamp` (pure): a request body with the token — a create/replace/merge/apply body gets
  ``metadata.annotations``, a JSON patch an ``add`` operation;
* :func:`delete_plan` (pure): a delete is two requests, a merge patch that writes the token
  and a DELETE with that write's ``resourceVersion`` as precondition (the webhook checks the
  *stored* token of a delete, so it must be this holder's);
* clients: :func:`fenced_api_client` (``kubernetes``), :func:`fenced_async_api_client`
  (``kubernetes_asyncio``) and :class:`FencedKubeClient` / :class:`AsyncFencedKubeClient` (this
  SDK's own) send every POST, PUT, PATCH and DELETE that way; a write of a subresource
  (``status``, ``scale``) unchanged (the webhook decides it by who writes); a collection
  delete not at all (:class:`~fencedlease.client.errors.UnfencedRequest`).

No held grant (absent, lost, past its deadline): the write is not sent and
:class:`~fencedlease.client.errors.GrantError` is raised — an efficiency check only; the fence
at the API server is the safety (a paused holder's write is refused there with
``stale_fence``, HTTP 403, :func:`fence_denial` reads it).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Union, cast
from urllib.parse import urlsplit

from fencedlease.client.api import AsyncKubeClient, KubeClient, KubeConfig
from fencedlease.client.errors import RequestInfo, UnfencedRequest
from fencedlease.client.grant import Grant, GrantSource, require
from fencedlease.client.plans import Reply, Request, Run
from fencedlease.client.validation import url_path

TOKEN_ANNOTATION = "fencedlease.io/token"
OPERATION_ANNOTATION = "fencedlease.io/operation-id"
LEASE_LABEL = "fencedlease.io/lease"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
WRITES = frozenset({"POST", "PUT", "PATCH"})

TokenSource = Union[GrantSource, Callable[[], Grant]]
"""Where the current grant comes from: a :class:`GrantSource` (read on every write) or a
callable returning the grant to stamp."""


def current_grant(source: TokenSource, min_remaining: float = 0.0) -> Grant:
    """The grant to stamp now, or raise :class:`GrantError` (absent, lost, expired)."""
    if hasattr(source, "read"):
        reader = cast(GrantSource, source)
        return require(reader.read(), reader.describe(), min_remaining)
    assert callable(source)
    return source().check(min_remaining)


def stamp(
    body: Any, token: int, content_type: str | None = None, operation_id: str | None = None
) -> Any:
    """``body`` with ``token`` (and ``operation_id``) stamped, as a new value (pure)."""
    values = {TOKEN_ANNOTATION: str(token)}
    if operation_id is not None:
        values[OPERATION_ANNOTATION] = operation_id
    if isinstance(body, list) or (content_type or "").startswith(JSON_PATCH):
        ops = list(body or [])
        for key, value in values.items():
            path = "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")
            ops.append({"op": "add", "path": path, "value": value})
        return ops
    out = copy.deepcopy(body) if isinstance(body, dict) else {}
    metadata = out.setdefault("metadata", {})
    annotations = metadata.get("annotations") or {}
    metadata["annotations"] = {**annotations, **values}
    return out


@dataclass(frozen=True)
class DeletePlan:
    """A fenced delete: first ``patch`` (merge) the object, then DELETE with ``options``
    completed by :meth:`options_after` with the patch's resourceVersion."""

    patch: dict[str, Any]
    options: dict[str, Any]

    def options_after(self, patched: Any) -> dict[str, Any]:
        version = ((patched or {}).get("metadata") or {}).get("resourceVersion")
        options = copy.deepcopy(self.options)
        preconditions = dict(options.get("preconditions") or {})
        if version:
            preconditions["resourceVersion"] = str(version)
        options["preconditions"] = preconditions
        options.setdefault("kind", "DeleteOptions")
        options.setdefault("apiVersion", "v1")
        return options


def delete_plan(token: int, options: Any = None) -> DeletePlan:
    """How to delete a fenced object with ``token`` (pure; see :class:`DeletePlan`)."""
    return DeletePlan(
        stamp({}, token),
        copy.deepcopy(options) if isinstance(options, dict) else {},
    )


def fence_denial(status: int, body: Any) -> str | None:
    """The fence code of an API error (``stale_fence``, ``holder_mismatch``...), or ``None``
    when the error is not a fence denial."""
    if status not in (403, 422, 503):
        return None
    if isinstance(body, (bytes, str)):
        try:
            body = json.loads(body)
        except ValueError:
            return None
    message = str((body or {}).get("message") or "") if isinstance(body, dict) else ""
    marker = "denied the request: "
    if marker not in message:
        return None
    code = message.split(marker, 1)[1].split(":", 1)[0].strip()
    return code or None


@dataclass(frozen=True)
class Target:
    """What a request path addresses (:func:`target`)."""

    collection: bool
    subresource: str | None = None


NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def target(url: str) -> Target | None:
    """What ``url`` (a path, or a whole URL) addresses (pure): a collection, one object or
    one of its subresources; ``None``: no resource path (discovery, ``/version``...).

    ``/api/v1/[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]`` and
    ``/apis/<group>/<version>/...`` alike; ``/api/v1/namespaces/<name>`` is the namespace."""
    path = urlsplit(url).path if "://" in url else url.split("?", 1)[0]
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return None
    namespace_own = len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES
    if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_own:
        rest = rest[2:]
    if len(rest) == 1:
        return Target(collection=True)
    if len(rest) == 2:
        return Target(collection=False)
    if len(rest) == 3:
        return Target(collection=False, subresource=rest[2])
    return None


def _refuse_collection_delete(method: str, url: str) -> None:
    raise UnfencedRequest(
        f"a fenced client does not send a collection delete ({method} {url}): the fence "
        "decides each item on its stored token, which other writers may have stamped, so some "
        "items would go and others not. Delete each object (a fenced delete each), or use a "
        "client that stamps nothing for an unfenced collection (docs/client.md)",
        request=RequestInfo(method, url),
    )


def _route(method: str, url: str) -> str:
    """How a fenced client sends ``method url`` (pure, but raises :class:`UnfencedRequest`
    for a collection delete): ``read`` as it is; ``delete``: :func:`delete_plan`; ``stamp``:
    with the token; ``as-is``: a write of a subresource, sent unchanged (the webhook decides
    a ``status`` or ``scale`` write by who writes: no token travels with it, and a Scale has
    no annotations a token could go to), still only while the grant is held."""
    if method not in WRITES and method != "DELETE":
        return "read"
    found = target(url)
    if method == "DELETE":
        if found is not None and found.collection:
            _refuse_collection_delete(method, url)
        return "delete" if found is not None and found.subresource is None else "as-is"
    return "as-is" if found is not None and found.subresource is not None else "stamp"


# ------------------------------------------------------------------------ this SDK's client


def write_plan(
    token_of: Callable[[], int],
    method: str,
    path: str,
    body: Any = None,
    content_type: str | None = None,
    params: dict[str, str] | None = None,
) -> Generator[Request, Reply, Reply]:
    """The requests of one call (sans-IO, :mod:`.plans`): a read as it is, a write stamped
    with ``token_of()``, an object's DELETE as :func:`delete_plan`'s two requests, a
    subresource write (status, scale) unchanged; a collection delete is refused
    (:class:`UnfencedRequest`, nothing sent). Yields each :class:`~.plans.Request`, takes its
    :class:`Reply`; returns the last."""
    method = method.upper()
    route = _route(method, path)
    if route == "read":
        return (yield Request(method, path, body, content_type, params))
    token = token_of()
    if route == "delete":
        plan = delete_plan(token, body)
        patched = yield Request("PATCH", path, plan.patch, MERGE_PATCH)
        if not patched.ok:
            return patched
        return (yield Request("DELETE", path, plan.options_after(patched.body), None, params))
    if route == "stamp":
        body = stamp(body, token, content_type)
    return (yield Request(method, path, body, content_type, params))


class _Stamping:
    """What a fenced client adds to its API client: the grant it stamps (``grant``, read
    before every write) and the plan of a call, :func:`write_plan`. :class:`FencedKubeClient`
    and :class:`AsyncFencedKubeClient` differ only in the client they extend."""

    grant: TokenSource
    min_remaining: float

    def __init__(
        self, grant: TokenSource, config: KubeConfig | None = None, *, min_remaining: float = 0.0
    ) -> None:
        super().__init__(config)  # type: ignore[call-arg]
        self.grant, self.min_remaining = grant, min_remaining

    def _token(self) -> int:
        return current_grant(self.grant, self.min_remaining).token

    def _plan(self, request: Request) -> Generator[Request, Reply, Reply]:
        return write_plan(self._token, request.method, request.path, **request.options())


class FencedKubeClient(_Stamping, KubeClient):
    """:class:`KubeClient` whose every write carries the current grant's token."""


class AsyncFencedKubeClient(_Stamping, AsyncKubeClient):
    """:class:`AsyncKubeClient` whose every write carries the current grant's token (the
    twin of :class:`FencedKubeClient`: what to send is decided once, by :func:`write_plan`)."""


# ------------------------------------------------------- kubernetes / kubernetes_asyncio


def _content_type(headers: Any) -> str | None:
    if not isinstance(headers, dict):
        return None
    for key, value in headers.items():
        if str(key).lower() == "content-type":
            return str(value)
    return None


def _merge_headers(headers: Any) -> dict[str, Any]:
    out = {k: v for k, v in (headers or {}).items() if str(k).lower() != "content-type"}
    out["Content-Type"] = MERGE_PATCH
    return out


def _api_calls(
    source: TokenSource, min_remaining: float, method: str, url: str, args: Any, kwargs: Any
) -> Generator[tuple[str, Any, dict[str, Any]], Any, Any]:
    """The calls of one ``ApiClient.request`` (sans-IO, like :func:`write_plan`): each
    ``(method, args, kwargs)`` to pass on with the URL, sent back its answer.  The URL is
    checked first (:func:`~fencedlease.client.validation.url_path`): a name ``..`` would
    address the collection."""
    url_path(url)
    method = method.upper()
    route = _route(method, url)
    if route == "read":
        return (yield method, args, kwargs)
    token = current_grant(source, min_remaining).token
    headers = kwargs.get("headers")
    if route == "delete":
        plan = delete_plan(token, kwargs.get("body"))
        timeout = kwargs.get("_request_timeout")
        patch = {
            "headers": _merge_headers(headers),
            "body": plan.patch,
            "_request_timeout": timeout,
        }
        patched = yield "PATCH", (), patch
        kwargs["body"] = plan.options_after(json.loads(patched.data or b"{}"))
    elif route == "stamp":
        kwargs["body"] = stamp(kwargs.get("body"), token, _content_type(headers))
    return (yield method, args, kwargs)


def fenced_api_client(
    grant: TokenSource, configuration: Any = None, *, min_remaining: float = 0.0
) -> Any:
    """A ``kubernetes.client.ApiClient`` whose every write carries the current grant's token
    (use it for every API object: ``CoreV1Api(fenced_api_client(source))``)."""
    from kubernetes import client as k8s

    class FencedApiClient(k8s.ApiClient):  # type: ignore[misc]
        def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            run = Run(_api_calls(grant, min_remaining, method, url, args, kwargs))
            for name, more, options in run:
                run.answer = super().request(name, url, *more, **options)
            return run.result

    return FencedApiClient(configuration)


def fenced_async_api_client(
    grant: TokenSource, configuration: Any = None, *, min_remaining: float = 0.0
) -> Any:
    """A ``kubernetes_asyncio.client.ApiClient`` whose every write carries the current
    grant's token (see :func:`fenced_api_client`)."""
    from kubernetes_asyncio import client as k8s

    class AsyncFencedApiClient(k8s.ApiClient):
        async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            run = Run(_api_calls(grant, min_remaining, method, url, args, kwargs))
            for name, more, options in run:
                run.answer = await super().request(name, url, *more, **options)
            return run.result

    return AsyncFencedApiClient(configuration)
