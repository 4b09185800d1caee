"""Pydantic models of the custom resources' specs and statuses (docs/design.md, "Names").

The CRD schema is the first line of validation (the API server rejects malformed objects);
these models are the operator's own reading of what it was given, so an object that slipped
past an older CRD version gets a clear ``SpecValid=False`` condition instead of a crash.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fencedlease.authority.types import FencingPolicy

# The names the worker's side shares with the operator: defined once, in the client
# distribution (which the operator depends on and which must not import pydantic).
from fencedlease.client.contract import ANNOTATION_FORCE_RELEASE as ANNOTATION_FORCE_RELEASE
from fencedlease.client.contract import ANNOTATION_LEASE_ID as ANNOTATION_LEASE_ID
from fencedlease.client.contract import ANNOTATION_STATE as ANNOTATION_STATE
from fencedlease.client.contract import ANNOTATION_TOKEN as ANNOTATION_TOKEN
from fencedlease.client.contract import ANNOTATION_VALID_UNTIL as ANNOTATION_VALID_UNTIL
from fencedlease.client.contract import ARTIFACTS as ARTIFACTS
from fencedlease.client.contract import GROUP as GROUP
from fencedlease.client.contract import LEASES as LEASES
from fencedlease.client.contract import VERSION as VERSION
from fencedlease.client.contract import annotation_keys

pod_annotation_keys = annotation_keys
"""The four downward-API annotation keys for a lease (the client's ``annotation_keys``)."""

M = TypeVar("M", bound=BaseModel)

RELEASES = "fencedreleases"
"""FencedRelease: a holder giving its lease back (docs/client.md, "Release")."""
CLAIMS = "fencedclaims"
"""FencedClaim: a worker Pod asking for one item's lease from code (docs/client.md, "Claims")."""
ANNOTATION_CLAIM_TEMPLATE = "fencedlease.io/claim-template"
"""On a FencedLease: ``"true"`` makes it a template of item leases, never granted itself."""
LABEL_TEMPLATE = "fencedlease.io/template"
"""On an item's FencedLease (made by the operator for claims): its template's name."""

ARTIFACT_FINALIZER = "fencedlease.io/high-water-mark"
"""On every FencedArtifact: removed only once the fencing domain's high-water mark covers the
artifact's token, so deleting and re-creating an artifact can never slip below it."""


class Phase(StrEnum):
    PENDING = "Pending"
    HELD = "Held"
    EXPIRED = "Expired"
    RELEASED = "Released"
    UNAVAILABLE = "Unavailable"


class ConditionType(StrEnum):
    """The FencedLease conditions (docs/design.md, "Status"); ``Ready`` summarises the others."""

    READY = "Ready"
    HELD = "Held"
    ETCD_AVAILABLE = "EtcdAvailable"
    TOKENS_MONOTONIC = "TokensMonotonic"
    SPEC_VALID = "SpecValid"


MAX_CONDITION_MESSAGE = 32768
"""``message`` bound of a condition (metav1.Condition, and the CRD schema)."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class LabelSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes label-selector semantics (an empty selector matches everything)."""
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True


class FencedLeaseSpec(_Model):
    lease_duration_seconds: int = Field(alias="leaseDurationSeconds", ge=1, le=86400)
    fencing_policy: FencingPolicy = Field(default=FencingPolicy.ALLOW_EQUAL, alias="fencingPolicy")
    holder_selector: LabelSelector = Field(alias="holderSelector")


class Condition(_Model):
    """One entry of ``status.conditions``, the fields of the API conventions' metav1.Condition.

    ``observed_generation`` is the ``metadata.generation`` the condition was computed from: a
    reader compares it with the object's generation to tell a current condition from a stale
    one.
    """

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str = Field(alias="lastTransitionTime")
    observed_generation: int | None = Field(default=None, alias="observedGeneration")


class FencedLeaseStatus(_Model):
    phase: Phase | None = None
    holder: str | None = None
    lease_id: str | None = Field(default=None, alias="leaseId")
    fencing_token: int | None = Field(default=None, alias="fencingToken")
    token_proof: str | None = Field(default=None, alias="tokenProof")
    acquire_time: str | None = Field(default=None, alias="acquireTime")
    renew_time: str | None = Field(default=None, alias="renewTime")
    """The latest renewal *recorded* here: at the grant, at the first renewal of each
    controller term and then at most every ``STATUS_REFRESH_SECONDS`` (docs/operations.md,
    "What a renewal writes"). Every renewal is published on the holder Pod instead."""
    expire_time: str | None = Field(default=None, alias="expireTime")
    """No longer written (always removed): a deadline that moves with every renewal cannot be
    shown without a write per renewal. The holder's deadline is its Pod's ``valid-until``."""
    lease_duration_seconds: float | None = Field(default=None, alias="leaseDurationSeconds")
    """The current grant's duration: each renewal gives the holder this much (minus the
    clock-skew bound) from the moment it is sent."""
    renew_interval_seconds: float | None = Field(default=None, alias="renewIntervalSeconds")
    """How often the controller renews the current grant while its holder is healthy."""
    transitions: int = 0
    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    conditions: list[Condition] = Field(default_factory=list)

    def to_patch(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json", exclude_none=False)


class LeaseRef(_Model):
    """A FencedLease in the same namespace: its name is an object name (lowercase letters,
    digits, ``-`` and ``.``), never a path (``lr/status`` would name a subresource)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class FencedReleaseSpec(_Model):
    """What a holder gives back: the exact generation, and who it says it is (the webhook
    checks that against the requester's Pod-bound token)."""

    lease_ref: LeaseRef = Field(alias="leaseRef")
    lease_id: str = Field(alias="leaseId", min_length=1, max_length=64)
    fencing_token: int = Field(alias="fencingToken", ge=1, le=2**63 - 1)
    holder: str = Field(min_length=1, max_length=253)
    holder_uid: str = Field(alias="holderUID", min_length=1, max_length=64)


class FencedClaimSpec(_Model):
    """An item a Pod claims under a template lease, and who it says it is (checked by the
    webhook against the requester's Pod-bound token)."""

    template_ref: LeaseRef = Field(alias="templateRef")
    item: str = Field(min_length=1, max_length=62, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    holder: str = Field(min_length=1, max_length=253)
    holder_uid: str = Field(alias="holderUID", min_length=1, max_length=64)

    @property
    def lease(self) -> str:
        return item_lease(self.template_ref.name, self.item)


def item_lease(template: str, item: str) -> str:
    """The FencedLease of ``item`` under ``template``: ``<template>-<item>``."""
    return f"{template}-{item}"


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_spec(model: type[M], raw: Any) -> M | str:
    """Validate ``raw`` as ``model``; return the model or a one-line, user-facing error."""
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            parts.append(f"spec.{loc}: {err['msg']}")
        return "; ".join(parts)


def stamp_generation(
    conditions: list[Condition], generation: int, only: Collection[str] | None = None
) -> list[Condition]:
    """The conditions a pass over ``generation`` re-evaluated (``only``; default: all) now
    describe that generation.  Transition times stay: only a change of ``status`` moves
    ``lastTransitionTime``."""
    return [
        c.model_copy(update={"observed_generation": generation})
        if only is None or c.type in only
        else c
        for c in conditions
    ]


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: Literal["True", "False", "Unknown"],
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int | None,
) -> list[Condition]:
    """Upsert a condition, keeping lastTransitionTime when the status does not change."""
    previous = next((c for c in conditions if c.type == type_), None)
    since = rfc3339(now)
    if previous is not None and previous.status == status:
        since = previous.last_transition_time
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message[:MAX_CONDITION_MESSAGE],
        last_transition_time=since,
        observed_generation=generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]


# ------------------------------------------------------------------ fenced objects (FencePolicy)

FENCE_POLICIES = "fencepolicies"
"""The cluster-scoped kind that declares which resource kinds may be fenced
(docs/fenced-objects.md)."""
OBJECT_LEASE_LABEL = "fencedlease.io/lease"
"""On any object of a declared kind: the FencedLease (same namespace) that fences its writes."""
OBJECT_TOKEN_ANNOTATION = "fencedlease.io/token"
"""On a fenced object: the writer's fencing token, a decimal string."""
OBJECT_OPERATION_ANNOTATION = "fencedlease.io/operation-id"
"""On a fenced object (optional): the write's idempotency key (``duplicate`` on a retry)."""


class FencePolicyStatus(_Model):
    """A FencePolicy's status: ``Ready`` says whether its kinds are in the fence webhook's
    rules (``Registered``) or why not (``Refused``, ``NotRegistered``)."""

    observed_generation: int | None = Field(default=None, alias="observedGeneration")
    conditions: list[Condition] = Field(default_factory=list)

    def to_patch(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)
