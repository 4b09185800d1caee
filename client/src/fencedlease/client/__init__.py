"""fencedlease.client: read your grant, publish through the fence, fence your own database.

Its own distribution, ``fencedlease-client``, independent of the operator (it talks to the
Kubernetes API over httpx; the optional extras ``fencedlease-client[watch]`` add file watching,
``fencedlease-client[postgres]`` psycopg).  Guide and exit codes of the CLI: docs/client.md.

Read the grant the operator gave this Pod (downward-API files, kept fresh)::

    from fencedlease.client import DirectoryGrant, GrantScope, Publisher, Applied, StaleFence

    source = DirectoryGrant("/etc/fencedlease", lease="report-july")
    with GrantScope(source, min_remaining=30) as scope:       # refuses to start without a grant
        key = render_to_unique_key(scope.token)               # prepare: harmless, immutable
        scope.check()                                         # efficiency check, not safety
        match Publisher().publish("report-july", object_ref=key, grant=scope.grant):
            case Applied() | Duplicate():  ...                # visible
            case StaleFence():             ...                # stop; never retry this grant
            case Rejected(code=code):      ...
            case Unavailable():            ...                # retried already; try later

``async with GrantScope(...)`` cancels the block when the grant is lost; ``AsyncPublisher`` is
the asyncio publisher.  :class:`SqlFence` is the article's ``UPDATE ... WHERE accepted_fence <=
:fence`` for PostgreSQL and SQLite.
"""

from __future__ import annotations

from fencedlease.client.api import AsyncKubeClient, KubeClient, KubeConfig
from fencedlease.client.claims import (
    AsyncClaimer,
    ClaimBusy,
    Claimed,
    Claimer,
    ClaimPending,
    ClaimRefused,
    ClaimResult,
)
from fencedlease.client.errors import (
    ApiError,
    ConfigError,
    FencedLeaseError,
    GrantAbsent,
    GrantError,
    GrantExpired,
    GrantLost,
    PublishError,
    RejectedError,
    RequestInfo,
    ResponseInfo,
    StaleFenceError,
    TransportError,
    UnavailableError,
    UnfencedRequest,
)
from fencedlease.client.grant import Grant, GrantSource, GrantState
from fencedlease.client.leadership import FencedLeadership as FencedLeadership
from fencedlease.client.publish import AsyncPublisher, Publisher, RetryPolicy, fence_code
from fencedlease.client.release import (
    AsyncReleaser,
    Released,
    ReleasePending,
    Releaser,
    ReleaseRefused,
    ReleaseResult,
)
from fencedlease.client.results import (
    Applied,
    Duplicate,
    PublishResult,
    Rejected,
    StaleFence,
    Unavailable,
)
from fencedlease.client.scope import GrantScope, run_under_grant, under_grant
from fencedlease.client.sources import (
    DirectoryGrant,
    LeaseStatusGrant,
    PodGrant,
    read_grant_dir,
    wait_for_grant,
)
from fencedlease.client.sql import CatalogRow, SqlFence, SqlFenceUsageError, SqlResult

__all__ = [
    "ApiError",
    "Applied",
    "AsyncClaimer",
    "AsyncKubeClient",
    "AsyncPublisher",
    "AsyncReleaser",
    "CatalogRow",
    "ClaimBusy",
    "ClaimPending",
    "ClaimRefused",
    "ClaimResult",
    "Claimed",
    "Claimer",
    "ConfigError",
    "DirectoryGrant",
    "Duplicate",
    "FencedLeaseError",
    "Grant",
    "GrantAbsent",
    "GrantError",
    "GrantExpired",
    "GrantLost",
    "GrantScope",
    "GrantSource",
    "GrantState",
    "KubeClient",
    "KubeConfig",
    "LeaseStatusGrant",
    "PodGrant",
    "PublishError",
    "PublishResult",
    "Publisher",
    "Rejected",
    "RejectedError",
    "ReleasePending",
    "ReleaseRefused",
    "ReleaseResult",
    "Released",
    "Releaser",
    "RequestInfo",
    "ResponseInfo",
    "RetryPolicy",
    "SqlFence",
    "SqlFenceUsageError",
    "SqlResult",
    "StaleFence",
    "StaleFenceError",
    "TransportError",
    "Unavailable",
    "UnavailableError",
    "UnfencedRequest",
    "fence_code",
    "read_grant_dir",
    "run_under_grant",
    "under_grant",
    "wait_for_grant",
]
