"""The fenced-artifact admission webhook (SPEC §3.5-3.6): the resource enforces the fence.

* :mod:`.admission` — pure: AdmissionReview → what to check → verdict → AdmissionReview.
* :mod:`.checker` — one review: lease policy, store (etcd), Events, metrics.
* :mod:`.server` — :class:`AdmissionServer`, aiohttp over TLS (``POST /fence``, ``/healthz``).
* :mod:`.registration` — local mode: own CA, MutatingWebhookConfiguration by URL, watchdog.
* :mod:`.wiring` — ``start_webhook(settings, runtime)`` for ``fencedlease run``.
"""

from fencedlease.webhook.admission import Verdict
from fencedlease.webhook.checker import FenceChecker, FenceStore, LeaseLookup
from fencedlease.webhook.server import AdmissionServer

__all__ = ["AdmissionServer", "FenceChecker", "FenceStore", "LeaseLookup", "Verdict"]
