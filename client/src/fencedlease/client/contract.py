"""The names the client shares with the operator, defined once. Public: another distribution
(the operator, which depends on this one) imports them from here into :mod:`fencedlease.models`,
and the Go client (go/) writes the same names again (tests/unit/test_go_grant_parity.py)."""

from __future__ import annotations

GROUP = "fencedlease.io"
VERSION = "v1alpha1"
LEASES = "fencedleases"
ARTIFACTS = "fencedartifacts"

ANNOTATION_TOKEN = "token.fencedlease.io"
ANNOTATION_LEASE_ID = "lease-id.fencedlease.io"
ANNOTATION_VALID_UNTIL = "valid-until.fencedlease.io"
ANNOTATION_STATE = "state.fencedlease.io"
ANNOTATION_FORCE_RELEASE = "fencedlease.io/force-release"

DEFAULT_DIR = "/etc/fencedlease"
"""Where the downward-API volume is mounted (docs/downward-api.md)."""

GRANT_FILES = {
    "token": "token",
    "lease_id": "lease-id",
    "valid_until": "valid-until",
    "state": "state",
}
"""Field of :class:`~fencedlease.client.Grant` -> file name in the downward-API directory."""

FENCE_CODES = frozenset(
    {
        "stale_fence",
        "unknown_token",
        "lease_mismatch",
        "duplicate",
        "holder_mismatch",
        "invalid",
        "unavailable",
    }
)
"""Result codes a refused artifact write's message starts with (docs/fenced-publish.md)."""


def annotation_keys(lease: str) -> dict[str, str]:
    """The four Pod annotation keys of lease ``lease``."""
    return {
        "token": f"{ANNOTATION_TOKEN}/{lease}",
        "lease_id": f"{ANNOTATION_LEASE_ID}/{lease}",
        "valid_until": f"{ANNOTATION_VALID_UNTIL}/{lease}",
        "state": f"{ANNOTATION_STATE}/{lease}",
    }
