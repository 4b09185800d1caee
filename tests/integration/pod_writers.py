"""Writers with a Pod-bound identity, by impersonation: the session's admin asks the API
server to act as ``system:serviceaccount:<ns>:ctl`` with the ``pod-name``/``pod-uid`` extras a
projected service-account token carries (what the fence webhook checks a grant against).
``system:masters`` is added so RBAC lets the write through to admission."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

EXTRA = "Impersonate-Extra-authentication.kubernetes.io%2F"


@asynccontextmanager
async def impersonating(
    kubeconfig: Path, user: str | None, extra: dict[str, str] | None = None
) -> AsyncIterator[k8s.ApiClient]:
    """An API client acting as ``user`` (``None``: the kubeconfig's own, the admin)."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    api = k8s.ApiClient(configuration)
    if user is not None:
        api.set_default_header("Impersonate-User", user)
        api.set_default_header("Impersonate-Group", "system:masters")
    for key, value in (extra or {}).items():
        api.set_default_header(EXTRA + key, value)
    try:
        yield api
    finally:
        await api.close()


def as_pod(kubeconfig: Path, ns: str, pod: str) -> Any:
    """An API client acting as Pod ``pod`` of namespace ``ns`` (UID ``uid-<pod>``)."""
    return impersonating(
        kubeconfig,
        f"system:serviceaccount:{ns}:ctl",
        {"pod-name": pod, "pod-uid": f"uid-{pod}"},
    )


async def send(
    api: k8s.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/merge-patch+json",
    query: list[tuple[str, str]] | None = None,
) -> tuple[int, str]:
    """One raw request: ``(HTTP status, body as text)``; never raises for an HTTP error."""
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    try:
        data = await api.call_api(
            path,
            method,
            query_params=query or [],
            header_params=headers,
            body=body,
            response_types_map={200: "object", 201: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
    except ApiException as error:
        return int(error.status), str(error.body)
    return 200, json.dumps(data)
