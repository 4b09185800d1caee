"""Every Prometheus metric of fencedlease, registered once, in the default registry.

A flat module of module-level metric objects: import it and call ``.inc()``/``.observe()``.
Labels are bounded by construction (fixed small value sets, never Pod or lease names), because
a label per lease or Pod would grow without limit (docs/operations.md).  The operator exposes the
default registry on its metrics port.
"""

from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from fencedlease import __version__

# No ``*_created`` series: one timestamp gauge per counter and histogram child that dashboards
# and alerts never use, doubling the scrape (Prometheus derives resets from the values).
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client

NAMESPACE = "fencedlease"

BUILD_INFO = Gauge(
    "build_info",
    "Always 1; the labels name the running fencedlease and Python versions.",
    ["version", "python"],
    namespace=NAMESPACE,
)
BUILD_INFO.labels(__version__, platform.python_version()).set(1)

UNAVAILABLE_CODES = frozenset(
    {"etcd_error", "restore_guard", "contention", "token_record_failed", "corrupt"}
)
"""Values of the ``code`` label of :data:`ACQUIRE_UNAVAILABLE`."""


# ---------------------------------------------------------------------------- grant authority

GRANTS = Counter(
    "grants",
    "New lease generations granted (each with a new fencing token).",
    namespace=NAMESPACE,
)
TAKEOVERS = Counter(
    "expired_takeovers",
    "Grants that took over a generation this replica had seen expire.",
    namespace=NAMESPACE,
)
RENEWALS = Counter(
    "renewals",
    "Renewal attempts by outcome (renewed, not_held, unavailable).",
    ["result"],
    namespace=NAMESPACE,
)
RELEASES = Counter(
    "releases",
    "Generations ended by release, by kind (release, force_release) and outcome.",
    ["kind", "result"],
    namespace=NAMESPACE,
)
EXPIRIES = Counter(
    "expiries",
    "Generations recorded as expired by this replica's monotonic clock.",
    namespace=NAMESPACE,
)
ACQUIRE_BUSY = Counter(
    "acquire_busy",
    "Acquisitions refused because an unexpired generation is held.",
    namespace=NAMESPACE,
)
ACQUIRE_UNAVAILABLE = Counter(
    "acquire_unavailable",
    "Acquisitions that could not be decided, by code (see UNAVAILABLE_CODES).",
    ["code"],
    namespace=NAMESPACE,
)
STORE_LATENCY = Histogram(
    "store_latency_seconds",
    "Latency of grant-authority store operations (all etcd round trips included).",
    ["operation"],
    namespace=NAMESPACE,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ETCD_ERRORS = Counter(
    "etcd_errors",
    "etcd requests that failed (timeouts, unreachable, ...), by store operation.",
    ["operation"],
    namespace=NAMESPACE,
)
MAX_TOKEN = Gauge(
    "max_token_issued",
    "Highest fencing token this process issued or saw (watch for exhaustion and restores).",
    namespace=NAMESPACE,
)

# ------------------------------------------------------------------------------------ fencing

FENCE_RESULTS = Counter(
    "fence_results",
    "Fenced writes by the outcome their client saw, each write once however often the API "
    "server re-ran admission for it: result code (applied, duplicate, stale_fence, "
    "unknown_token, lease_mismatch, holder_mismatch), operation (create, update, status, "
    "publish, other) and epoch (the lease service's etcd cluster id: one value per etcd "
    "cluster). The scope (lease and namespace) is in the Event, never a label.",
    ["result", "operation", "epoch"],
    namespace=NAMESPACE,
)
FENCE_CHECKS = Counter(
    "fence_checks",
    "Fence decisions of the webhook, one per admission call (the API server re-runs admission "
    "for one write on conflicts and stale caches, so this exceeds fence_results_total under "
    "contention), by result code and operation (create, update, status, other).",
    ["result", "operation"],
    namespace=NAMESPACE,
)


def fence_results_total(result: str, operation: str) -> float:
    """Sum of :data:`FENCE_RESULTS` over epochs (tests, diagnostics)."""
    return counter_total(FENCE_RESULTS, result=result, operation=operation)


def counter_total(counter: Counter, **labels: str) -> float:
    """Sum of ``counter``'s series whose labels include ``labels`` (tests, diagnostics)."""
    return sum(
        sample.value
        for family in counter.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
        and all(sample.labels.get(k) == v for k, v in labels.items())
    )


# ----------------------------------------------------------------------------- the operator

HOLDER_LOSSES = Counter(
    "holder_losses",
    "Holder Pods that lost a lease, by reason (expired, handed_over, force_released, released).",
    ["reason"],
    namespace=NAMESPACE,
)
FORCE_RELEASES = Counter(
    "force_releases",
    "Administrator force releases by result (released, ignored: stale lease id).",
    ["result"],
    namespace=NAMESPACE,
)
HOLDER_RELEASES = Counter(
    "holder_releases",
    "Releases by their holder (FencedRelease) by result (released, refused: not current).",
    ["result"],
    namespace=NAMESPACE,
)
LEASES_BY_PHASE = Gauge(
    "leases",
    "FencedLeases known to this operator, by status phase.",
    ["phase"],
    namespace=NAMESPACE,
)
CONTROLLER_LEADER = Gauge(
    "controller_leader",
    "1 while this controller replica leads (the only one that writes), 0 while it is a "
    "standby or has stopped leading (renewal deadline passed, resigned on SIGTERM).",
    namespace=NAMESPACE,
)
LEADERSHIP_CHANGES = Counter(
    "controller_leadership_changes",
    "Terms this replica started (started) or ended (stopped) leading.",
    ["change"],
    namespace=NAMESPACE,
)
SCHEDULER_KINDS = frozenset({"leases", "artifacts"})
"""Values of the ``kind`` label of the scheduler metrics (one scheduler each)."""

RECONCILE_ERRORS = Counter(
    "reconcile_errors",
    "Reconcile passes that failed unexpectedly (retried with backoff), by scheduler kind.",
    ["kind"],
    namespace=NAMESPACE,
)
RECONCILES = Counter(
    "reconciles",
    "Reconcile passes run, by scheduler kind (leases, artifacts) and result (ok, error).",
    ["kind", "result"],
    namespace=NAMESPACE,
)
RECONCILE_DURATION = Histogram(
    "reconcile_duration_seconds",
    "Duration of one reconcile pass (etcd and API round trips included), by scheduler kind.",
    ["kind"],
    namespace=NAMESPACE,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
SCHEDULER_QUEUE_DEPTH = Gauge(
    "scheduler_queue_depth",
    "Passes due now that no worker has started yet, by scheduler kind.",
    ["kind"],
    namespace=NAMESPACE,
)
SCHEDULER_LATENESS = Histogram(
    "scheduler_lateness_seconds",
    "How long after its due time a pass started (a renewal started late eats into the "
    "lease), by scheduler kind.",
    ["kind"],
    namespace=NAMESPACE,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# ------------------------------------------------------------- admission webhook (webhook/)

ADMISSION_LATENCY = Histogram(
    "admission_latency_seconds",
    "Time to answer one FencedArtifact AdmissionReview, by operation (create, update, "
    "status, other).",
    ["operation"],
    namespace=NAMESPACE,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
ADMISSION_INVALID = Counter(
    "admission_invalid",
    "AdmissionReviews refused as malformed (bad JSON, too deep, wrong version, bad names), "
    "by where they were caught (body, review).",
    ["stage"],
    namespace=NAMESPACE,
)

UNVERIFIED_TOKENS = Counter(
    "unverified_tokens",
    "Tokens shown by objects that the authority could not verify (a lease status without "
    "the authority's proof, an artifact whose token was not issued for its lease); never "
    "trusted as input to the restore guard or the high-water mark.",
    ["kind"],
    namespace=NAMESPACE,
)

ADMISSION_UNAVAILABLE = Counter(
    "admission_unavailable",
    "FencedArtifact writes refused because the fence could not be checked (etcd error, "
    "timeout), by operation (create, update, status, other).",
    ["operation"],
    namespace=NAMESPACE,
)
EVENTS_DROPPED = Counter(
    "events_dropped",
    "Event observations no Event counts, by Event reason (FenceStaleFence, Granted, ...) and "
    "cause: rate_limited (the involved object's spam filter), queue_full (too many Events in "
    "flight in the webhook), api_error (the API refused or was unreachable).",
    ["reason", "cause"],
    namespace=NAMESPACE,
)
WEBHOOK_CONFIGURATION_RESTORES = Counter(
    "webhook_configuration_restores",
    "Webhook configuration repairs by reason: deleted, altered (restored), unrestorable (RBAC);"
    " by webhook: fence (the fence webhook or the whole configuration), policy (a FencePolicy's).",
    ["reason", "webhook"],
    namespace=NAMESPACE,
)
TOKEN_SWEEP_KEYS = Counter(
    "token_sweep_keys",
    "Token records and high-water marks the legacy sweep looked at (docs/tokens.md, "
    "'Retention'), by what it did: pruned, kept, changed (left for the next sweep), malformed.",
    ["action"],
    namespace=NAMESPACE,
)
