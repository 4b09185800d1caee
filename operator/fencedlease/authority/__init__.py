"""The grant authority's pure core: lease decisions, fence checks and their result types.

No I/O lives here; :mod:`fencedlease.store.etcd` runs these decisions as etcd transactions and
:mod:`fencedlease.authority.memory` runs them against a dict (tests, operator unit tests).
"""

from fencedlease.authority.types import (
    Acquired,
    AcquireResult,
    Busy,
    EndedBy,
    Expired,
    ExpireResult,
    FenceCode,
    FenceResult,
    FencingPolicy,
    HighWaterMark,
    LeaseKey,
    LeaseRecord,
    LeaseState,
    LeaseView,
    NotHeld,
    Released,
    ReleaseResult,
    Renewed,
    RenewResult,
    StoreUnavailable,
    TokenGrant,
    Unavailable,
)

__all__ = [
    "AcquireResult",
    "Acquired",
    "Busy",
    "EndedBy",
    "ExpireResult",
    "Expired",
    "FenceCode",
    "FenceResult",
    "FencingPolicy",
    "HighWaterMark",
    "LeaseKey",
    "LeaseRecord",
    "LeaseState",
    "LeaseView",
    "NotHeld",
    "ReleaseResult",
    "Released",
    "RenewResult",
    "Renewed",
    "StoreUnavailable",
    "TokenGrant",
    "Unavailable",
]
