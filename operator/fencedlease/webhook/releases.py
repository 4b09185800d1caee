"""Admission of a holder's release (a FencedRelease CREATE): only the Pod a generation was
granted to may give it back.

The check is the fenced write's holder check (:func:`fencedlease.authority.fence.check_grant`)
on the generation the release names: the requester must be a Pod-bound service-account token
whose Pod name and UID are the ones the release names, and the token the release names must
have been issued for that lease, to that Pod, under that lease id. Whether the generation is
still the *current* one is not decided here: the controller ends it with the store's
conditional release by lease id, so a delayed release of an older generation is admitted (its
Pod really held it) and then changes nothing (``status.phase: Refused``). Admission changes
no fencing state; the parsing and the decision are pure, :func:`review_release` adds the one
etcd read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from fencedlease.authority import fence as fencing
from fencedlease.authority.types import (
    FenceCode,
    FenceRead,
    LeaseKey,
    StoreUnavailable,
    TokenGrant,
)
from fencedlease.models import GROUP, RELEASES, FencedReleaseSpec
from fencedlease.webhook.reviews import (
    Identity,
    Verdict,
    created_spec,
    envelope,
    parse_identity,
    review_response,
    review_uid,
    reviews_resource,
)

log = logging.getLogger(__name__)


class GrantReads(Protocol):
    """The one store read a release check makes (the fence's read, its mark unused)."""

    async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead: ...


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    """A FencedRelease being created, and who creates it."""

    namespace: str
    spec: FencedReleaseSpec
    identity: Identity

    @property
    def lease(self) -> LeaseKey:
        return LeaseKey(self.namespace, self.spec.lease_ref.name)


def is_release_review(body: Any) -> bool:
    """Does ``body`` review a FencedRelease?"""
    return reviews_resource(body, GROUP, RELEASES)


def parse_release(body: Any) -> ReleaseRequest | Verdict:
    """The release a review creates, or the verdict without a store read."""
    request = envelope(body)
    if isinstance(request, Verdict):
        return request
    if not is_release_review(body):
        return Verdict.invalid(f"this path reviews {RELEASES}.{GROUP} only")
    if request.get("operation") != "CREATE" or request.get("subResource"):
        # The spec is immutable (CRD rule); only its creation names a generation to end.
        return Verdict.allow("unchanged", "only creating a FencedRelease is checked")
    created = created_spec(request, FencedReleaseSpec)
    if isinstance(created, Verdict):
        return created
    namespace, spec = created
    return ReleaseRequest(namespace, spec, parse_identity(request.get("userInfo")))


def requester_refusal(request: ReleaseRequest) -> str | None:
    """Why the requester may not release as the Pod the release names (``None``: it may).

    Only a Pod-bound service-account token of that very Pod (name and UID) in the release's
    namespace: no other identity, administrators included, releases for a holder (they have
    ``kubectl fencedlease force-release``)."""
    spec = request.spec
    return pod_refusal(request.identity, request.namespace, spec.holder, spec.holder_uid)


def pod_refusal(ident: Identity, namespace: str, holder: str, holder_uid: str) -> str | None:
    """Why ``ident`` is not Pod ``holder`` (UID ``holder_uid``) of ``namespace``, speaking
    with its own Pod-bound service-account token (``None``: it is)."""
    if not ident.is_pod or ident.pod_uid is None:
        return (
            "only the Pod itself, with its Pod-bound service-account token, may ask this "
            "(an administrator uses kubectl fencedlease force-release)"
        )
    if ident.pod_namespace != namespace:
        return f"requester Pod is not in namespace {namespace}"
    if ident.pod_name != holder or ident.pod_uid != holder_uid:
        return (
            f"requester is Pod {ident.pod_name} (uid {ident.pod_uid}), not the Pod named "
            f"({holder}, uid {holder_uid})"
        )
    return None


def decide_release(request: ReleaseRequest, grant: TokenGrant | None) -> Verdict:
    """Admit the release iff its requester is the Pod the named generation was granted to."""
    refusal = requester_refusal(request)
    if refusal is not None:
        return Verdict.from_fence(FenceCode.HOLDER_MISMATCH, f"holder_mismatch: {refusal}")
    spec = request.spec
    code = fencing.check_grant(grant, request.lease, spec.holder, spec.holder_uid)
    if code is None and grant is not None and grant.lease_id != spec.lease_id:
        code = FenceCode.LEASE_MISMATCH
    if code is not None:
        return Verdict.from_fence(
            code,
            f"{code.value}: token {spec.fencing_token} was not granted to Pod {spec.holder} "
            f"as lease {spec.lease_ref.name} generation {spec.lease_id}",
        )
    return Verdict.allow(
        "admitted",
        f"release of lease {spec.lease_ref.name} generation {spec.lease_id} by its holder",
    )


async def review_release(store: GrantReads, body: Any, budget: float) -> dict[str, Any]:
    """The AdmissionReview reply for a FencedRelease (never raises; at most one etcd read)."""
    parsed = parse_release(body)
    if isinstance(parsed, Verdict):
        verdict = parsed
    elif requester_refusal(parsed) is not None:
        verdict = decide_release(parsed, None)  # no read for a requester that is not the Pod
    else:
        spec = parsed.spec
        try:
            async with asyncio.timeout(budget):
                read = await store.grant_and_mark(
                    parsed.namespace, spec.lease_ref.name, spec.fencing_token
                )
            verdict = decide_release(parsed, read.grant)
        except TimeoutError:
            verdict = Verdict.unavailable(f"release check timed out after {budget}s")
        except StoreUnavailable as error:
            verdict = Verdict.unavailable(str(error))
        except Exception as error:  # never admit unchecked, never answer 500
            log.exception("release check failed")
            verdict = Verdict.unavailable(f"internal error: {type(error).__name__}")
    return review_response(review_uid(body), verdict)
