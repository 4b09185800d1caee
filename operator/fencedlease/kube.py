"""The Kubernetes API adapter shared by the controller and the webhook (kubernetes_asyncio).

API errors are translated here, once: every answer outside 2xx becomes one of a small set of
typed exceptions (:class:`NotFound`, :class:`Conflict`, :class:`Invalid`, :class:`Forbidden`,
else :class:`ApiError`), and callers catch those, never an HTTP status.  Where an object that
is gone (404) or changed meanwhile (409, a failed JSON-patch test) is an expected outcome, the
adapter's method returns it as a result (``None``/``False``) instead; everything else
propagates to the caller's retry.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.events import KubeEvents, ObjectRef
from fencedlease.models import ARTIFACTS, CLAIMS, GROUP, LEASES, RELEASES, VERSION
from fencedlease.settings import StartupError

log = logging.getLogger(__name__)
T = TypeVar("T")
GONE = frozenset({404})
GONE_OR_CHANGED = frozenset({404, 409, 422})


class ApiError(ApiException):
    """An answer of the Kubernetes API outside 2xx, translated (:func:`translated`).  A
    subclass of the client library's ``ApiException``, so code that counts any API failure
    as a failed attempt still does; code that tells outcomes apart catches the subclasses."""


class NotFound(ApiError):
    """404: the object (or the kind) does not exist."""


class Conflict(ApiError):
    """409: a ``resourceVersion`` precondition failed, or the object already exists."""


class Invalid(ApiError):
    """422: the request was refused as invalid (also: a JSON-patch ``test`` that failed)."""


class Forbidden(ApiError):
    """403: RBAC (or an admission webhook) refused the request."""


_BY_STATUS: dict[int, type[ApiError]] = {
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
}


def translated(exc: ApiException) -> ApiError:
    """``exc`` as its typed :class:`ApiError` (status, reason, body and headers kept)."""
    if isinstance(exc, ApiError):
        return exc
    status = int(exc.status) if exc.status is not None else 0
    error = _BY_STATUS.get(status, ApiError)(status=exc.status, reason=exc.reason)
    error.body, error.headers = exc.body, exc.headers
    return error


async def api_call(call: Awaitable[T]) -> T:
    """``await call`` (a kubernetes_asyncio request) with its API error :func:`translated`."""
    try:
        return await call
    except ApiException as exc:
        raise translated(exc) from exc


async def unless(statuses: frozenset[int], call: Awaitable[T]) -> T | None:
    """``await call``; ``None`` when the API answers one of ``statuses``, the typed
    :class:`ApiError` for any other error answer."""
    try:
        return await api_call(call)
    except ApiError as exc:
        if exc.status in statuses:
            return None
        raise


def _finalizers_patch(resource_version: str, finalizers: list[str]) -> list[dict[str, Any]]:
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ]


def _resource_version(found: dict[str, Any] | None) -> str | None:
    """The resourceVersion of a patched object (``None`` for no object)."""
    if found is None:
        return None
    return str((found.get("metadata") or {}).get("resourceVersion") or "")


def _lease_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{LEASES}/{name}"


MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
"""Accept header of writes whose answer we only need the new resourceVersion of: the API
server sends the object's metadata instead of the whole object (a Pod is ~16 KB), and the
answer is read as plain JSON, never deserialized into model objects."""


async def request_json(
    api: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    accept: str = "application/json",
) -> dict[str, Any]:
    """One API request whose answer is read as plain JSON (a dict), never deserialized into
    the library's model objects (for a small object that costs more than the request); a
    status outside 2xx raises the typed :class:`ApiError` with the status and the body."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    response = await api_call(
        api.call_api(
            path,
            method,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _return_http_data_only=True,
        )
    )
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = _BY_STATUS.get(response.status, ApiError)(
            status=response.status, reason=response.reason
        )
        error.body = data.decode(errors="replace")
        raise error
    try:
        found = json.loads(data)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise ApiError(status=response.status, reason=f"{method} {path}: not a JSON object")
    return found


class KubeConfigError(StartupError):
    """No usable Kubernetes configuration (a user-facing message, not a crash)."""


async def load_config() -> client.ApiClient:
    """In-cluster config when running in a Pod, else the current kubeconfig."""
    kubeconfig = os.environ.get("KUBECONFIG")
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            # Read KUBECONFIG now: the library's default was captured when it was imported.
            await config.load_kube_config(config_file=kubeconfig)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config"
        raise KubeConfigError(
            f"no usable Kubernetes configuration ({where}: {exc}); set KUBECONFIG, run in a "
            "Pod, or use 'fencedlease local up' for a local control plane"
        ) from exc
    return client.ApiClient()


def environment_unused() -> bool:
    """Nothing in the environment for aiohttp's ``trust_env`` to use: no ``*_proxy``
    variable and no netrc file."""
    if urllib.request.getproxies() or os.environ.get("NETRC"):
        return False
    try:
        return not (Path.home() / ".netrc").exists()
    except (OSError, RuntimeError):  # no home directory to look in
        return True


def skip_environment_lookups(api: client.ApiClient) -> bool:
    """kubernetes_asyncio opens its aiohttp session with ``trust_env=True``: every request
    then looks up a netrc entry and an environment proxy, each in a worker thread (two
    thread hops per request, about a tenth of the operator's CPU per renewal). Where the
    environment has neither (:func:`environment_unused`) the lookups can only find nothing,
    so they are turned off; otherwise the session is left as it is (``True``: turned off)."""
    session = getattr(getattr(api, "rest_client", None), "pool_manager", None)
    if session is None or not getattr(session, "_trust_env", False) or not environment_unused():
        return False
    session._trust_env = False
    return True


class KubeApi:
    """The few calls the controller and webhook make; 404s are results, not crashes."""

    def __init__(
        self, api: client.ApiClient, component: str = "fencedlease", home_namespace: str = "default"
    ) -> None:
        skip_environment_lookups(api)
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.component = component
        self.events = KubeEvents(api, component, home_namespace)  # correlated (the webhook)
        self._lifecycle = KubeEvents(api, component, home_namespace, correlate=False)

    @classmethod
    async def create(
        cls, component: str = "fencedlease", home_namespace: str = "default"
    ) -> KubeApi:
        return cls(await load_config(), component, home_namespace)

    async def close(self) -> None:
        await self.api.close()

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as the API server has it now (its JSON body); ``None`` if gone."""
        found = await unless(GONE, self.core.read_namespaced_pod(name, namespace))
        if found is None:
            return None
        body: dict[str, Any] = self.api.sanitize_for_serialization(found)
        return body

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: dict[str, str | None],
        resource_version: str,
    ) -> str | None:
        """Merge-patch annotations (``None`` removes a key) iff the Pod is still at
        ``resource_version`` (empty: unconditionally): the Pod's new resourceVersion, ``None``
        if it changed or is gone. A replica paused between its leadership check and this call
        cannot annotate from its outdated view, nor annotate a Pod re-created under the same
        name."""
        metadata: dict[str, Any] = {"annotations": annotations}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return await self._patch_version(
            f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": metadata}
        )

    async def _patch_version(self, path: str, body: Any, content_type: str = MERGE) -> str | None:
        """PATCH ``path`` and return only the new resourceVersion (``None``: gone or changed),
        asking for the object's metadata alone and decoding nothing else."""
        try:
            found = await request_json(
                self.api, "PATCH", path, body, content_type=content_type, accept=METADATA_ONLY
            )
        except (NotFound, Conflict, Invalid):
            return None
        return str((found.get("metadata") or {}).get("resourceVersion") or "")

    async def patch_lease_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str | None:
        """Merge-patch a FencedLease's status iff it is still at ``resource_version`` (the
        version the decision was made from): the new resourceVersion, or ``None`` when the
        lease changed or is gone. A replica that was paused between its leadership check and
        this call therefore cannot write a status from its outdated view over a newer one."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._patch_version(_lease_path(namespace, name) + "/status", body)

    async def patch_lease_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> str | None:
        """Merge-patch annotations: the new resourceVersion, ``None`` when the lease is gone."""
        body = {"metadata": {"annotations": annotations}}
        return _resource_version(await self._patch_custom(namespace, LEASES, name, body))

    async def set_lease_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> str | None:
        """Set a FencedLease's ``metadata.finalizers`` iff it is still at ``resource_version``:
        the new resourceVersion, ``None`` when it is gone or changed meanwhile."""
        patch = _finalizers_patch(resource_version, finalizers)
        return await self._patch_version(_lease_path(namespace, name), patch, JSON_PATCH)

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a FencedLease (an item's, for claims): the created object, ``None`` when
        one of that name exists already."""
        call = self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, LEASES, body)
        created: dict[str, Any] | None = await unless(frozenset({409}), call)
        return created

    async def delete_lease(self, namespace: str, name: str) -> None:
        """Delete a FencedLease (its finalizer then releases it); gone already is fine."""
        call = self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, LEASES, name)
        await unless(GONE, call)

    async def patch_claim_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        """Merge-patch a FencedClaim's status (``False`` when it is gone)."""
        found = await self._patch_custom(namespace, CLAIMS, name, {"status": status}, status=True)
        return found is not None

    async def patch_release_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        """Merge-patch a FencedRelease's status (``False`` when it is gone)."""
        found = await self._patch_custom(namespace, RELEASES, name, {"status": status}, status=True)
        return found is not None

    async def patch_artifact_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> bool:
        """Merge-patch the status iff the artifact is still at ``resource_version`` (``False``
        when it changed or is gone: the next watch event brings the new state)."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        found = await self._patch_custom(
            namespace, ARTIFACTS, name, body, status=True, absent=GONE_OR_CHANGED
        )
        return found is not None

    async def set_artifact_finalizers(
        self, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> bool:
        """Set ``metadata.finalizers`` iff the artifact is still at ``resource_version``.

        ``False`` when the artifact is gone or changed meanwhile (the next watch event
        brings the new state)."""
        return await self._set_finalizers(ARTIFACTS, namespace, name, resource_version, finalizers)

    async def _set_finalizers(
        self, plural: str, namespace: str, name: str, resource_version: str, finalizers: list[str]
    ) -> bool:
        patch = _finalizers_patch(resource_version, finalizers)
        found = await self._patch_custom(
            namespace, plural, name, patch, content_type=JSON_PATCH, absent=GONE_OR_CHANGED
        )
        return found is not None

    async def _patch_custom(
        self,
        namespace: str,
        plural: str,
        name: str,
        body: Any,
        *,
        status: bool = False,
        content_type: str = MERGE,
        absent: frozenset[int] = GONE,
    ) -> dict[str, Any] | None:
        """Patch a FencedLease/FencedArtifact (or its status): the patched object, or ``None``
        when the API answers one of ``absent``."""
        patch = (
            self.custom.patch_namespaced_custom_object_status
            if status
            else self.custom.patch_namespaced_custom_object
        )
        call = patch(  # type: ignore[call-arg]
            GROUP, VERSION, namespace, plural, name, body, _content_type=content_type
        )
        found: dict[str, Any] | None = await unless(absent, call)
        return found

    async def list_leases_probe(self, namespace: str | None = None) -> None:
        """One cheap authenticated call (readiness): list at most one FencedLease, in the
        watched namespace when there is one (a namespace-scoped install has no cluster role)."""
        if namespace:
            await api_call(
                self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, LEASES, limit=1
                )
            )
        else:
            await api_call(self.custom.list_cluster_custom_object(GROUP, VERSION, LEASES, limit=1))

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        call = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, LEASES, name)
        found: dict[str, Any] | None = await unless(GONE, call)
        return found

    async def secret_value(self, namespace: str, name: str, key: str, create: bytes) -> bytes:
        """``data[key]`` of Secret ``namespace/name``; created with ``create`` when missing
        (a racing replica's Secret wins: it is read back)."""
        for _ in range(3):
            secret = await unless(GONE, self.core.read_namespaced_secret(name, namespace))
            if secret is not None:
                return base64.b64decode((secret.data or {})[key])
            body = client.V1Secret(
                metadata=client.V1ObjectMeta(
                    name=name,
                    namespace=namespace,
                    labels={"app.kubernetes.io/name": "fencedlease"},
                ),
                data={key: base64.b64encode(create).decode()},
            )
            if await unless(frozenset({409}), self.core.create_namespaced_secret(namespace, body)):
                return create
        raise KubeConfigError(f"Secret {namespace}/{name} keeps disappearing")

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event, one per call (the controller's lifecycle Events: one per
        lease transition; best effort: logged, never raised)."""
        await self._lifecycle.event(ref, type_, reason, message)


class WebhookConfigurations:
    """MutatingWebhookConfigurations as plain JSON, API errors translated: :meth:`get`
    answers ``None`` for a missing one; :meth:`create` raises :class:`Conflict` when it
    exists, :meth:`replace` :class:`NotFound` or :class:`Conflict` when it is gone or changed
    (the body's ``resourceVersion``); every call :class:`Forbidden` when RBAC refuses."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._admission = client.AdmissionregistrationV1Api(api)

    async def get(self, name: str) -> dict[str, Any] | None:
        found = await unless(GONE, self._admission.read_mutating_webhook_configuration(name))
        if found is None:
            return None
        raw: dict[str, Any] = self.api.sanitize_for_serialization(found)
        return raw

    async def create(self, body: dict[str, Any]) -> None:
        payload: Any = body
        await api_call(self._admission.create_mutating_webhook_configuration(payload))

    async def replace(self, name: str, body: dict[str, Any]) -> None:
        payload: Any = body
        await api_call(self._admission.replace_mutating_webhook_configuration(name, payload))

    async def delete(self, name: str, request_timeout: float) -> None:
        """Delete it; one already gone is fine."""
        call = self._admission.delete_mutating_webhook_configuration(
            name, _request_timeout=request_timeout
        )
        await unless(GONE, call)


# ------------------------------------------------------------------ discovery


async def preferred_version(api: client.ApiClient, group: str) -> str | None:
    """The group's preferred version (``v1`` for the core group); ``None``: not served."""
    if not group:
        return "v1"
    found = await unless(GONE, request_json(api, "GET", f"/apis/{group}"))
    version = ((found or {}).get("preferredVersion") or {}).get("version")
    return version if isinstance(version, str) else None
