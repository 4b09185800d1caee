"""Guard the Helm chart's webhook configuration (``webhook_registration == "none"``).

The chart owns the MutatingWebhookConfiguration (it references the Service, and cert-manager
may inject and rotate its CA). The operator still watches it, because deleting or loosening it
(``failurePolicy: Ignore``, narrower rules) would open an unfenced write path: it remembers the
configuration as first seen at start-up and restores it (Warning Event + metric) when it is
deleted or altered. ``caBundle`` and ``timeoutSeconds`` may change freely (:data:`FREE_FIELDS`):
CA rotation is legitimate, and a timeout cannot open a path (``failurePolicy: Fail`` fails
closed), so ``helm upgrade --set webhook.timeoutSeconds=...`` sticks.

Every controller replica watches, but only the elected one writes (``may_write``, the
controller's leadership): a standby restores nothing and posts no Event, and a replica that
starts leading checks the configuration at once (:meth:`ChartRegistrationGuard.leadership_started`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import metrics
from fencedlease.events import EventSink, ObjectRef
from fencedlease.settings import Settings
from fencedlease.webhook.registration import Registration

log = logging.getLogger(__name__)


def _pristine(found: dict[str, Any]) -> dict[str, Any]:
    """The parts of a live configuration worth restoring (no server-set metadata). Pure."""
    meta = found.get("metadata") or {}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "webhooks": copy.deepcopy(found.get("webhooks") or []),
    }


# Webhook fields that may change without being restored: none of them can loosen the fence.
FREE_FIELDS = ("timeoutSeconds",)


def with_current_free_fields(
    snapshot: dict[str, Any], current: dict[str, Any] | None
) -> dict[str, Any]:
    """``snapshot`` with each webhook's caBundle and :data:`FREE_FIELDS` taken from ``current``
    when present. Pure."""
    desired = copy.deepcopy(snapshot)
    live = {w.get("name"): w for w in (current or {}).get("webhooks") or []}
    for webhook in desired["webhooks"]:
        found = live.get(webhook.get("name")) or {}
        bundle = (found.get("clientConfig") or {}).get("caBundle")
        if bundle:
            webhook.setdefault("clientConfig", {})["caBundle"] = bundle
        for key in FREE_FIELDS:
            if found.get(key) is not None:
                webhook[key] = found[key]
    return desired


class ChartRegistrationGuard(Registration):
    """Restores the chart's configuration as it was when the operator started."""

    owned_labels: dict[str, str] = {}  # Helm's labels stay untouched

    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        events: EventSink | None = None,
        *,
        may_write: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(settings, 0, api, events)
        self.snapshot: dict[str, Any] | None = None
        self._alerted = False
        self._may_write = may_write
        self._checks: set[asyncio.Task[Any]] = set()

    def leadership_started(self) -> None:
        """This replica leads now: check (and restore) at once, not at the next resync."""
        if self.snapshot is None:
            return  # watch() has not started: it checks first thing
        task = asyncio.get_running_loop().create_task(self._check(), name="webhook-guard-check")
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _check(self) -> None:
        try:
            await self.restore()
        except Exception:
            log.exception("checking webhook configuration %s failed", self.name)

    async def take_snapshot(self, retry_seconds: float = 5.0) -> dict[str, Any]:
        """Wait until the configuration exists (the chart may create it after us), keep it."""
        while True:
            found = await self.current()
            if found is not None:
                self.snapshot = _pristine(found)
                log.info("guarding webhook configuration %s", self.name)
                return self.snapshot
            log.warning(
                "webhook configuration %s not found; FencedArtifact writes are not fenced by "
                "the webhook until it exists (waiting for the chart to create it)",
                self.name,
            )
            await asyncio.sleep(retry_seconds)

    async def desired(self) -> dict[str, Any]:
        if self.snapshot is None:
            raise RuntimeError("take_snapshot() first")
        return with_current_free_fields(self.snapshot, await self.current())

    async def restore(self) -> str | None:
        """Restore, or — when RBAC forbids re-creating a deleted configuration (the chart
        grants ``create`` on no webhook configuration) — alert once per deletion.

        Only while ``may_write`` (the leader): a standby leaves it to the leader."""
        if not self._may_write():
            return None
        try:
            problem = await super().restore()
        except ApiException as exc:
            if exc.status != 403:
                raise
            if not self._alerted:
                self._alerted = True
                metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("unrestorable").inc()
                message = (
                    f"MutatingWebhookConfiguration {self.name} is missing or altered and this "
                    f"operator may not restore it ({exc.reason}): FencedArtifact writes are NOT "
                    "checked by the fence webhook. Restore it with 'helm upgrade' now."
                )
                log.error(message)
                if self.events is not None:
                    ref = ObjectRef(
                        "MutatingWebhookConfiguration",
                        "admissionregistration.k8s.io/v1",
                        "",
                        self.name,
                    )
                    await self.events.event(
                        ref, "Warning", "WebhookConfigurationUnguarded", message
                    )
            return "unrestorable"
        self._alerted = False
        return problem

    async def watch(self, resync_seconds: float = 30.0, backoff: float = 1.0) -> None:
        if self.snapshot is None:
            await self.take_snapshot()
        await super().watch(resync_seconds, backoff)
