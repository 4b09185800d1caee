"""Admission of a worker's claim (a FencedClaim CREATE): only the Pod a claim names may make
it. Pure, no store read: the grant itself comes later, from etcd, by the controller, and the
fence applies to the item's lease like to any other."""

from __future__ import annotations

from typing import Any

from fencedlease.authority.types import FenceCode
from fencedlease.models import CLAIMS, GROUP, FencedClaimSpec, parse_spec
from fencedlease.webhook.releases import pod_refusal
from fencedlease.webhook.reviews import (
    Verdict,
    created_spec,
    envelope,
    parse_identity,
    review_response,
    review_uid,
    reviews_resource,
)


def is_claim_review(body: Any) -> bool:
    """Does ``body`` review a FencedClaim?"""
    return reviews_resource(body, GROUP, CLAIMS)


def decide_claim(body: Any) -> Verdict:
    """Admit a FencedClaim creation iff its requester is the Pod it names."""
    request = envelope(body)
    if isinstance(request, Verdict):
        return request
    if not is_claim_review(body):
        return Verdict.invalid(f"this path reviews {CLAIMS}.{GROUP} only")
    operation = request.get("operation")
    if operation == "DELETE" and not request.get("subResource"):
        return _withdrawal(request)
    if operation != "CREATE" or request.get("subResource"):
        return Verdict.allow("unchanged", "only creating and deleting a FencedClaim is checked")
    created = created_spec(request, FencedClaimSpec)
    if isinstance(created, Verdict):
        return created
    namespace, spec = created
    why = pod_refusal(
        parse_identity(request.get("userInfo")), namespace, spec.holder, spec.holder_uid
    )
    if why is not None:
        return Verdict.from_fence(FenceCode.HOLDER_MISMATCH, f"holder_mismatch: {why}")
    return Verdict.allow("admitted", f"claim of item {spec.item} by Pod {spec.holder}")


def _withdrawal(request: dict[str, Any]) -> Verdict:
    """A claim is withdrawn by the Pod that made it, or by a non-Pod identity (its owner's
    garbage collection, an administrator): another Pod cannot end a worker's item lease."""
    ident = parse_identity(request.get("userInfo"))
    if not ident.is_pod:
        return Verdict.allow("admitted", "withdrawn by a non-Pod identity")
    old = request.get("oldObject")
    spec = parse_spec(FencedClaimSpec, old.get("spec") if isinstance(old, dict) else None)
    namespace = request.get("namespace")
    if isinstance(spec, str) or not isinstance(namespace, str):
        return Verdict.invalid("request.oldObject is not a FencedClaim")
    why = pod_refusal(ident, namespace, spec.holder, spec.holder_uid)
    if why is not None:
        return Verdict.from_fence(FenceCode.HOLDER_MISMATCH, f"holder_mismatch: {why}")
    return Verdict.allow("admitted", f"claim of item {spec.item} withdrawn by its Pod")


def review_claim(body: Any) -> dict[str, Any]:
    """The AdmissionReview reply for a FencedClaim (never raises)."""
    return review_response(review_uid(body), decide_claim(body))
