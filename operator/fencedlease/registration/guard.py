"""Guard the Helm chart's webhook configuration (``webhook_registration == "none"``).

The chart (or Argo CD, Flux) owns the MutatingWebhookConfiguration: it references the
Service, and cert-manager may inject and rotate its CA. The operator watches it and enforces
rules, not a snapshot (:mod:`.loosenings`): any change that still fences every
FencedArtifact write stands — ``helm upgrade`` of ``timeoutSeconds``, the selector or the CA,
a GitOps sync, labels — and the guard writes nothing, so it never fights its owner. A
*loosening* (``failurePolicy: Ignore``, rules that miss fencedartifacts, a selector that can
exclude a served namespace, an object selector, match conditions, another target) is
reverted field by field to the last safe configuration seen (or the narrowest safe value),
with a Warning Event and ``webhook_configuration_restores_total{reason="altered"}``; the
reverted values are kept in the ``fencedlease.io/guard-reverted`` annotation, and a guard
that finds them safe under its own settings puts them back (a narrowed ``watchNamespace``
reverted by the previous controller during the rollout). A deleted configuration is
re-created from the last safe one — when RBAC allows it (``webhook.guard.restoreDeleted``;
otherwise it alerts, ``reason="unrestorable"``) and unless the Service it calls is gone too,
which is ``helm uninstall``, not an attack.

The FencePolicies' entries (``<policy>.objects.fencedlease.io``) are the controller's: kept as
the policies ask. Following a policy, a Helm timeout or a CA rotation is silent; a change made
by someone else (:func:`fencepolicies.altered`) is alerted like a loosening, with
``webhook_configuration_restores_total{reason="altered",webhook="policy"}`` and the Event.

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

from fencedlease import metrics
from fencedlease.events import EventSink, ObjectRef
from fencedlease.kube import Conflict, Forbidden, NotFound, api_call
from fencedlease.registration import fencepolicies, loosenings
from fencedlease.registration.fencepolicies import PolicyWatch
from fencedlease.registration.selfregistration import Registration
from fencedlease.settings import Settings

log = logging.getLogger(__name__)

UNINSTALL_SETTLE_SECONDS = 3.0
"""How long a deletion is left to show whether the Service went too (an uninstall)."""


def pristine(found: dict[str, Any]) -> dict[str, Any]:
    """The parts of a live configuration worth re-creating (no server-set metadata). Pure."""
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


class ChartRegistrationGuard(Registration):
    """Keeps the chart's configuration fencing (see the module docstring)."""

    owned_labels: dict[str, str] = {}  # Helm's labels stay untouched

    def __init__(
        self,
        settings: Settings,
        api: client.ApiClient,
        events: EventSink | None = None,
        *,
        may_write: Callable[[], bool] = lambda: True,
        settle_seconds: float = UNINSTALL_SETTLE_SECONDS,
        policies: PolicyWatch | None = None,
    ) -> None:
        super().__init__(settings, 0, api, events, policies=policies)
        self.coverage = loosenings.Coverage(namespace=settings.namespace)
        self.good: dict[str, Any] | None = None
        """The last configuration seen that loosened nothing (what a deletion restores)."""
        self.reapplied = 0
        self._alerted = False
        self._may_write = may_write
        self._settle = settle_seconds
        self._core = client.CoreV1Api(api)
        self._checks: set[asyncio.Task[Any]] = set()
        self._asked: dict[str, dict[str, Any]] = {}
        """The object webhooks the FencePolicies asked when the configuration last matched."""

    def leadership_started(self) -> None:
        """This replica leads now: check (and restore) at once, not at the next resync."""
        if self.coverage.target is None:
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
        """Wait until the configuration exists (the chart may create it after us); trust where
        its fence webhook calls (``clientConfig``), and keep it as the last safe one if it is."""
        while True:
            found = await self.current()
            webhook = loosenings.fence_webhook(found)
            if found is not None and webhook is not None:
                target = loosenings.target(webhook.get("clientConfig"))
                self.coverage = loosenings.Coverage(self.coverage.namespace, target)
                self._learn(found)
                log.info("guarding webhook configuration %s (calls %s)", self.name, target)
                return found
            log.warning(
                "webhook configuration %s (with webhook %s) not found; FencedArtifact writes "
                "are not fenced by the webhook until it exists (waiting for the chart)",
                self.name,
                loosenings.WEBHOOK_NAME,
            )
            await asyncio.sleep(retry_seconds)

    def _learn(self, found: dict[str, Any]) -> None:
        if not loosenings.configuration_loosenings(found, self.coverage):
            self.good = pristine(found)

    async def ensure(self) -> str | None:
        """Repair what loosens the fence; ``None`` when nothing needed it."""
        for _ in range(5):
            live = await self.current()
            try:
                if live is None:
                    return await self._recreate()
                return await self._repair(live)
            except (NotFound, Conflict):
                continue  # gone or changed meanwhile: look again (Forbidden: the caller's)
        raise RuntimeError(f"webhook configuration {self.name} kept changing under the guard")

    async def _recreate(self) -> str | None:
        if self.good is None:  # first seen loosened and deleted before it was repaired
            metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("unrestorable", "fence").inc()
            log.error(
                "webhook configuration %s is gone and this operator never saw it safe: "
                "FencedArtifact writes are NOT checked; restore it with 'helm upgrade'",
                self.name,
            )
            return None
        await asyncio.sleep(self._settle)
        if await self.current() is not None:
            return None  # re-created meanwhile (helm upgrade, a GitOps sync): check it next
        if await self._uninstalled():
            log.info(
                "webhook configuration %s was deleted with its Service: an uninstall, left so",
                self.name,
            )
            return None
        await self.configurations.create(pristine(self.good))
        return "deleted"

    async def _uninstalled(self) -> bool:
        """The Service the configuration calls is gone or going: the release is uninstalled."""
        service = (self.coverage.target or {}).get("service")
        if not isinstance(service, dict) or not service.get("name"):
            return False  # a URL webhook (local mode): nothing to tell an uninstall by
        try:
            found = await api_call(
                self._core.read_namespaced_service(
                    service["name"], service.get("namespace") or "default"
                )
            )
        except NotFound:
            return True
        except Forbidden:
            return False  # not allowed to look: restore (fail closed)
        return found.metadata.deletion_timestamp is not None

    async def _follow_policies(self, live: dict[str, Any]) -> dict[str, Any]:
        """``live`` with the object webhooks the FencePolicies ask for, written if they were
        not (the chart has none: these are the controller's, and Helm's merge keeps them)."""
        fence = loosenings.fence_webhook(live)
        if self.policies is None or not self.policies.synced or fence is None:
            return live
        if self.coverage.target is None or loosenings.loosenings(fence, self.coverage):
            return live  # repaired first; the next pass adds them
        webhooks = fencepolicies.object_webhooks(
            self.policies.policies,
            {**self.coverage.target, "caBundle": (fence.get("clientConfig") or {}).get("caBundle")},
            int(fence.get("timeoutSeconds") or self.settings.webhook_timeout_seconds),
            self.settings.namespace,
        )
        if not fencepolicies.objects_differ(live, webhooks):
            self._asked = {w["name"]: w for w in webhooks}
            return live
        altered = fencepolicies.altered(live, webhooks, self._asked)
        body = await self.written(self._replace, fencepolicies.with_object_webhooks(live, webhooks))
        webhooks = [w for w in body["webhooks"] if fencepolicies.is_object_webhook(w)]
        self._asked = {w["name"]: w for w in webhooks}
        if altered:
            await self.alert_restored(
                "altered (" + "; ".join(f"{n}: {why}" for n, why in sorted(altered.items())) + ")",
                webhook="policy",
                unchecked="writes of the objects those policies fence may have passed unchecked",
            )
        else:
            log.info(
                "webhook configuration %s: object webhooks follow the FencePolicies (%s)",
                self.name,
                ", ".join(w["name"] for w in webhooks) or "none",
            )
        found = await self.current()
        if found is None:
            raise NotFound(status=404, reason="deleted while following the policies")
        return found

    async def _repair(self, live: dict[str, Any]) -> str | None:
        live = await self._follow_policies(live)
        fix = loosenings.repaired(live, self.good, self.coverage)
        if fix is None:
            self._learn(live)
            back = loosenings.reapplied(live, self.coverage)
            if back is not None:
                await self._replace(back)
                self.reapplied += 1
                log.info(
                    "webhook configuration %s: put back what was reverted (safe now): %s",
                    self.name,
                    sorted(loosenings.reverted_values(live)),
                )
            return None
        await self._replace(fix.configuration)
        return "altered (" + "; ".join(fix.why[f] for f in sorted(fix.reverted)) + ")"

    async def _replace(self, body: dict[str, Any]) -> None:
        # ``body`` is the live object (its resourceVersion: a concurrent change is a
        # ``Conflict``, retried by :meth:`ensure`).
        await self.configurations.replace(self.name, body)

    async def restore(self) -> str | None:
        """:meth:`ensure` with its alerts, or — when RBAC forbids the write (the chart grants
        ``create`` only with ``webhook.guard.restoreDeleted``) — alert once per incident.

        Only while ``may_write`` (the leader): a standby leaves it to the leader."""
        if not self._may_write():
            return None
        try:
            problem = await super().restore()
        except Forbidden as exc:
            if not self._alerted:
                self._alerted = True
                metrics.WEBHOOK_CONFIGURATION_RESTORES.labels("unrestorable", "fence").inc()
                message = (
                    f"MutatingWebhookConfiguration {self.name} is missing or loosened and this "
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

    async def sync(self) -> None:
        """The FencePolicies changed: the leader brings the object webhooks in line."""
        if self._may_write() and self.coverage.target is not None:
            await super().sync()

    async def watch(self, resync_seconds: float = 30.0, backoff: float = 1.0) -> None:
        if self.coverage.target is None:
            await self.take_snapshot()
        await super().watch(resync_seconds, backoff)
