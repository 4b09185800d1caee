"""The fenced-artifact admission webhook: the resource enforces the fence (docs/fenced-publish.md).

* :mod:`.admission` — pure: AdmissionReview → what to check → verdict → AdmissionReview.
* :mod:`.checker` — one review: lease policy, one read of the store (etcd), Events, metrics.
* :mod:`.server` — :class:`~.server.AdmissionServer`, aiohttp over TLS (``POST /fence``).
* :mod:`.leases` — the lease policy lookup (an API GET, or a cache handed in by the caller).
* :mod:`.wiring` — ``start_webhook(...)``, called by the composition root :mod:`fencedlease.app`.

Only the admission path: the webhook configuration (registered, guarded) is
:mod:`fencedlease.registration`'s, run beside the controller. Nothing here imports
:mod:`fencedlease.controller` or :mod:`fencedlease.registration`.
"""
