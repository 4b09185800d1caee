"""Fakes for the webhook's unit tests: an async in-memory store and AdmissionReview builders."""

from __future__ import annotations

import base64
import json
from typing import Any

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.authority.types import (
    Acquired,
)
from fencedlease.models import ARTIFACT_FINALIZER
from fencedlease.webhook import reviews
from fencedlease.webhook.checker import FenceChecker

NS = "default"

FENCE_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["fencedlease.io"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["fencedartifacts", "fencedartifacts/status"],
        "scope": "Namespaced",
    },
    {
        "apiGroups": ["fencedlease.io"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE"],
        "resources": ["fencedreleases"],
        "scope": "Namespaced",
    },
    {
        "apiGroups": ["fencedlease.io"],
        "apiVersions": ["v1alpha1"],
        "operations": ["CREATE", "DELETE"],
        "resources": ["fencedclaims"],
        "scope": "Namespaced",
    },
]
"""The fence webhook's rules as the chart renders them (copy before changing them)."""


def admission_review(
    op: str,
    resource: str,
    *,
    group: str = "fencedlease.io",
    version: str = "v1alpha1",
    **request: Any,
) -> dict[str, Any]:
    """An AdmissionReview (uid ``u-1``) of ``op`` on ``group/version/resource`` in ``NS``;
    ``request``: the request's other fields (``name``, ``object``, ``userInfo``, ...)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "resource": {"group": group, "version": version, "resource": resource},
            "operation": op,
            "namespace": NS,
            **request,
        },
    }


def review(
    op: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    sub: str | None = None,
    dry_run: bool = False,
    user: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return admission_review(
        op,
        "fencedartifacts",
        subResource=sub,
        name="cat",
        object=obj,
        oldObject=old,
        dryRun=dry_run,
        userInfo=user or {"username": "admin"},
    )


def art(
    token: int,
    obj: str = "k",
    op: str | None = None,
    lease: str = "l",
    rv: str = "",
    accepted: int | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseRef": {"name": lease}, "fencingToken": token, "objectRef": obj}
    if op:
        spec["operationId"] = op
    body: dict[str, Any] = {
        "metadata": {"name": "cat", "namespace": NS, "resourceVersion": rv},
        "spec": spec,
    }
    if accepted is not None:
        body["status"] = {"acceptedFence": accepted}
    return body


def grant(store: AsyncMemoryStore, holder: str = "pod-a", lease: str = "l") -> int:
    """A new generation of ``lease`` for ``holder`` (the current one is released first)."""
    held = store.auth.read(NS, lease)
    if held is not None and held.record.state.value == "held":
        store.auth.release(NS, lease, held.record.lease_id, held.token)
    result = store.auth.acquire(NS, lease, holder, 10)
    assert isinstance(result, Acquired), result
    return result.token


def checker(
    store: AsyncMemoryStore, policy: str | None = "AllowEqual", allow_non_pod: bool = True
) -> FenceChecker:
    """``allow_non_pod``: the reviews' default user ``admin`` is an allowed writer."""

    async def lookup(namespace: str, name: str) -> str | None:
        return policy

    writers = reviews.AllowedWriters.parse(["admin"] if allow_non_pod else [])
    return FenceChecker(store, lookup, None, writers=writers)


def answer(reply: dict[str, Any]) -> tuple[bool, str]:
    resp = reply["response"]
    assert resp["uid"] == "u-1"
    if "patch" in resp:  # the only mutation: our finalizer on an admitted write
        assert resp["allowed"] and resp["patchType"] == "JSONPatch"
        patch = json.loads(base64.b64decode(resp["patch"]))
        assert [p["path"] for p in patch] == ["/metadata/finalizers"]
        assert patch[0]["value"] == [ARTIFACT_FINALIZER]
    return resp["allowed"], resp.get("status", {}).get("message", "")


def commit(store: AsyncMemoryStore, token: int, lease: str = "l") -> None:
    """What the controller does once it sees a write with ``token`` stored."""
    assert store.auth.record_commit(NS, lease, token).verified
