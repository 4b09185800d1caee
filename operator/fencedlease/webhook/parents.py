"""The parent object of a ``scale`` write, read through the API server (docs/fenced-objects.md,
"Scale writes").

A Scale carries no labels and no annotations, so the webhook reads the object it scales to
learn its lease label and stored token: one GET with the webhook's own credentials (RBAC
``get`` on the declared kinds: the chart's ``fencedObjects.resources``), asking for its
metadata only (``PartialObjectMetadata``: a Deployment's spec is not transferred). Every way
the read can fail is mapped here, once, to :class:`ParentUnreadable`, which the checker answers
``unavailable`` (fail closed: the writer retries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client

from fencedlease.kube import METADATA_ONLY, ApiError, request_json
from fencedlease.webhook.objects import ParentRef

ParentReader = Callable[[ParentRef], Awaitable[dict[str, Any]]]
"""``read(ref)`` → the parent object (its metadata at least); raises :class:`ParentUnreadable`."""


class ParentUnreadable(Exception):
    """The parent object of a scale write could not be read (the message says why)."""


def unreadable(ref: ParentRef, error: BaseException) -> ParentUnreadable:
    """The one mapping of a failed parent read to what the writer is told (pure)."""
    status = getattr(error, "status", None) if isinstance(error, ApiError) else None
    if status == 403:
        why = (
            f"the webhook may not read {ref.resource} (give its service account RBAC get on "
            "the declared kinds: the chart's fencedObjects.resources)"
        )
    elif status == 404:
        why = "it was not found (deleted meanwhile?)"
    elif status is not None:
        why = f"the API server answered HTTP {status}"
    else:
        why = f"{type(error).__name__}"
    return ParentUnreadable(
        f"the scale write of {ref} is not decided: the webhook could not read the object to "
        f"learn its lease: {why}; retry"
    )


class ApiParents:
    """:data:`ParentReader` over an API client (the webhook's credentials)."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    async def __call__(self, ref: ParentRef) -> dict[str, Any]:
        try:
            return await request_json(self.api, "GET", ref.path, accept=METADATA_ONLY)
        except Exception as error:  # every failure is one answer: unavailable
            raise unreadable(ref, error) from error
