"""Local-mode self-registration (``settings.webhook_registration == "url"``) and its watchdog.

In local mode the operator is its own certificate authority: it creates ``ca.crt``/``ca.key``
and a serving pair ``tls.crt``/``tls.key`` for ``settings.webhook_url_host`` in
``settings.webhook_cert_dir`` (reused when present), and registers a
**MutatingWebhookConfiguration** whose entries call ``https://<webhook_url_host>:<port>``
on one path per review kind (``/fence``, ``/fence-release``, ``/fence-claim``; the
FencePolicies' entries ``/fence-object``) with that CA as ``caBundle``.  It is a mutating
webhook because mutating admission runs before the CRD's schema and CEL validation, so the
fence check sees and counts every write; its only mutation adds the
``fencedlease.io/high-water-mark`` finalizer to an admitted spec write
(``reinvocationPolicy: Never``).

:meth:`Registration.watch` keeps it that way: if the configuration is deleted or altered, it
is restored at once, a Warning Event is posted and
``fencedlease_webhook_configuration_restores_total{reason,webhook}`` is incremented.  (With the Helm
chart the configuration is the chart's, ``webhook_registration == "none"``.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from fencedlease import metrics, pki
from fencedlease.events import EventSink, ObjectRef
from fencedlease.kube import Conflict, Invalid, NotFound, WebhookConfigurations
from fencedlease.registration.fencepolicies import (
    OBJECT_WEBHOOK_SUFFIX,
    SCALE_WEBHOOK_SUFFIX,
    PolicyWatch,
    is_object_webhook,
    object_webhooks,
    policy_of_entry,
    with_object_webhooks,
)
from fencedlease.registration.loosenings import ENTRIES
from fencedlease.settings import Settings
from fencedlease.watching import ListWatch, Watched

log = logging.getLogger(__name__)

WEBHOOK_NAME = "fence.fencedlease.io"
"""The FencedArtifacts' entry (:data:`.policy.ENTRIES` lists the release and claim ones)."""
REQUEST_TIMEOUT = 10.0
"""Seconds one API call of :meth:`Registration.remove` may take (shutdown is bounded)."""
MANAGED_BY = {
    "app.kubernetes.io/managed-by": "fencedlease",
    "app.kubernetes.io/name": "fencedlease",
}


def ensure_local_certificates(settings: Settings) -> pki.LocalCertificates:
    """:func:`pki.ensure_local_certificates` for ``settings`` (blocking I/O)."""
    return pki.ensure_local_certificates(settings.webhook_cert_dir, settings.webhook_url_host)


def default_namespace_selector(settings: Settings) -> dict[str, Any]:
    """All namespaces, or only ``settings.namespace`` when the operator watches one."""
    if settings.namespace:
        return {"matchLabels": {"kubernetes.io/metadata.name": settings.namespace}}
    return {}


def desired_configuration(
    settings: Settings,
    port: int,
    ca_bundle: str,
    namespace_selector: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration we register (pure): one entry per review kind, each
    calling its own path (FencedArtifacts ``/fence``, a holder's release ``/fence-release``,
    a worker's claim ``/fence-claim``)."""
    selector = (
        default_namespace_selector(settings) if namespace_selector is None else namespace_selector
    )
    host = settings.webhook_url_host
    netloc = f"[{host}]" if ":" in host else host
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": settings.webhook_configuration_name, "labels": dict(MANAGED_BY)},
        "webhooks": [
            {
                "name": entry.name,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://{netloc}:{port}{entry.path}",
                    "caBundle": ca_bundle,
                },
                "rules": entry.webhook_rules(),
                "failurePolicy": "Fail",
                "matchPolicy": "Equivalent",
                "sideEffects": "NoneOnDryRun",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": settings.webhook_timeout_seconds,
                "namespaceSelector": selector,
                "objectSelector": {},
            }
            for entry in ENTRIES
        ],
    }


_COMPARED = (
    "admissionReviewVersions",
    "clientConfig",
    "rules",
    "failurePolicy",
    "matchPolicy",
    "sideEffects",
    "reinvocationPolicy",
    "timeoutSeconds",
    "namespaceSelector",
    "objectSelector",
)


def _normalized(webhook: dict[str, Any]) -> dict[str, Any]:
    out = {key: webhook.get(key) for key in _COMPARED}
    out["name"] = webhook.get("name")
    out["matchConditions"] = webhook.get("matchConditions") or []
    for key in ("namespaceSelector", "objectSelector"):
        out[key] = {k: v for k, v in (out[key] or {}).items() if v}
    return out


def difference(current: dict[str, Any] | None, desired: dict[str, Any]) -> str | None:
    """Why ``current`` is not what we registered (``None``: it is). Pure."""
    if current is None:
        return "deleted"
    have = current.get("webhooks") or []
    want = desired["webhooks"]
    if len(have) != len(want):
        return f"altered: {len(have)} webhooks instead of {len(want)}"
    for got, expected in zip(have, want, strict=True):
        a, b = _normalized(got), _normalized(expected)
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return f"altered: webhooks[{expected['name']}].{key} was changed"
    return None


_ENTRY = re.compile(r"webhooks\[(\d+)\]")


def refused_entries(body: Mapping[str, Any], error: Invalid) -> dict[str, str]:
    """The FencePolicies' entries of ``body`` that the API server's 422 names, each with the
    server's reason (``{}``: it named none of them). Pure."""
    try:
        status = json.loads(error.body or "{}")
    except (TypeError, ValueError):
        return {}
    details = status.get("details") if isinstance(status, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    webhooks = body.get("webhooks") or []
    found: dict[str, str] = {}
    for cause in causes if isinstance(causes, list) else []:
        if not isinstance(cause, dict):
            continue
        field = str(cause.get("field") or "")
        match = _ENTRY.match(field)
        if match is None or int(match.group(1)) >= len(webhooks):
            continue
        webhook = webhooks[int(match.group(1))]
        if is_object_webhook(webhook):
            reason = f"{field}: {cause.get('message') or cause.get('reason') or 'invalid'}"
            found.setdefault(str(webhook["name"]), reason[:512])
    return found


def without_entries(body: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """``body`` without the webhooks named ``names`` (pure)."""
    out = dict(body)
    out["webhooks"] = [w for w in body.get("webhooks") or [] if w.get("name") not in names]
    return out


class Registration:
    """Registers and guards one MutatingWebhookConfiguration (see module docstring)."""

    owned_labels: dict[str, str] = MANAGED_BY
    """Labels stamped on a replaced configuration (none for the chart's: Helm owns it)."""

    def __init__(
        self,
        settings: Settings,
        port: int,
        api: client.ApiClient,
        events: EventSink | None = None,
        *,
        namespace_selector: dict[str, Any] | None = None,
        policies: PolicyWatch | None = None,
    ) -> None:
        self.policies = policies
        """The FencePolicies whose object webhooks the configuration carries (None: none)."""
        self.settings = settings
        self.port = port
        self.api = api
        self.configurations = WebhookConfigurations(api)
        self.events = events
        self.namespace_selector = namespace_selector
        self.restores = 0
        self.restored = asyncio.Event()
        """Set whenever :meth:`restore` had to fix something (callers may clear it)."""

    @property
    def name(self) -> str:
        return self.settings.webhook_configuration_name

    async def desired(self) -> dict[str, Any]:
        certs = await asyncio.to_thread(ensure_local_certificates, self.settings)
        return desired_configuration(
            self.settings, self.port, certs.ca_bundle(), self.namespace_selector
        )

    def with_policies(
        self, desired: dict[str, Any], current: dict[str, Any] | None
    ) -> dict[str, Any]:
        """``desired`` with the object webhooks the FencePolicies ask for; before the policies
        were listed, the ones ``current`` has (never dropped for not knowing yet)."""
        if self.policies is None:
            return desired
        if not self.policies.synced:
            live = [w for w in (current or {}).get("webhooks") or [] if is_object_webhook(w)]
            return with_object_webhooks(desired, live)
        fence = desired["webhooks"][0]
        webhooks = object_webhooks(
            self.policies.policies,
            fence["clientConfig"],
            int(fence.get("timeoutSeconds") or self.settings.webhook_timeout_seconds),
            self.settings.namespace,
        )
        return with_object_webhooks(desired, webhooks)

    async def written(
        self, write: Callable[[dict[str, Any]], Awaitable[None]], body: dict[str, Any]
    ) -> dict[str, Any]:
        """``write(body)``; when the API server refuses it (422) for FencePolicies' entries,
        those entries are dropped and their policies refused with the server's reason
        (:meth:`PolicyWatch.reject`), and the rest is written: one bad policy never keeps the
        others (or the fence webhook) from being registered. Returns what was written."""
        while True:
            try:
                await write(body)
                return body
            except Invalid as error:
                refused = refused_entries(body, error)
                if not refused or self.policies is None:
                    raise
                for entry, reason in refused.items():
                    self.policies.reject(policy_of_entry(entry), reason)
                body = without_entries(body, set(refused))

    async def discover(self) -> None:
        """Ask discovery about the FencePolicies' kinds (cluster-scoped ones are refused)."""
        if self.policies is not None and self.policies.synced:
            await self.policies.discover()

    async def sync(self) -> None:
        """The FencePolicies changed: bring the object webhooks in line (no alert: nobody
        altered the configuration), then report on each policy."""
        try:
            await self.discover()
            problem = await self.ensure()
        except Exception as error:
            log.exception("registering the FencePolicies' object webhooks failed")
            if self.policies is not None:
                await self.policies.report(f"the webhook configuration was not updated: {error}")
            return
        if problem is not None:
            log.info("webhook configuration %s follows the FencePolicies", self.name)
        if self.policies is not None:
            await self.policies.report(None)

    async def current(self) -> dict[str, Any] | None:
        return await self.configurations.get(self.name)

    async def registered(self) -> Registration:
        """Create the local CA/serving cert if needed and register (or fix) the configuration
        (:meth:`ensure`); returns this registration: run ``await registration.watch()`` in a
        task to keep it registered."""
        await self.ensure()
        return self

    async def ensure(self) -> str | None:
        """Create or replace the configuration if needed; returns what was wrong (or None)."""
        current = await self.current()
        desired = self.with_policies(await self.desired(), current)
        problem = difference(current, desired)
        if problem is None:
            return None
        if current is None:
            try:
                await self.written(self.configurations.create, desired)
            except Conflict:
                return await self.ensure()  # someone created it meanwhile: compare again
        else:
            body = dict(desired)
            body["metadata"] = dict(desired["metadata"])
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            labels = dict(current["metadata"].get("labels") or {})
            labels.update(self.owned_labels)
            body["metadata"]["labels"] = labels
            try:
                await self.written(self._replace_live, body)
            except (NotFound, Conflict):
                return await self.ensure()  # changed under us: compare again
        log.info("webhook configuration %s registered (%s)", self.name, problem)
        return problem

    async def _replace_live(self, body: dict[str, Any]) -> None:
        await self.configurations.replace(self.name, body)

    async def remove(self) -> None:
        """Delete the configuration (tests, uninstall). Writes are then no longer fenced by
        this webhook: only the CRD's CEL rule still refuses a lower token on update."""
        await self.configurations.delete(self.name, REQUEST_TIMEOUT)

    async def restore(self) -> str | None:
        """:meth:`ensure`, and alert (Event + metric) when something had to be restored."""
        await self.discover()
        problem = await self.ensure()
        if self.policies is not None and self.policies.synced:
            await self.policies.report(None)
        if problem is None:
            return None
        await self.alert_restored(
            problem,
            webhook="policy"
            if f"{OBJECT_WEBHOOK_SUFFIX}]" in problem or f"{SCALE_WEBHOOK_SUFFIX}]" in problem
            else "fence",
        )
        return problem

    async def alert_restored(
        self,
        problem: str,
        *,
        webhook: str = "fence",
        unchecked: str = (
            "FencedArtifact writes were not checked by the fence webhook (the CRD rule still "
            "refused lower tokens on update)"
        ),
    ) -> None:
        """Count and report a repair: ``webhook_configuration_restores_total{reason, webhook}``
        (``webhook``: ``fence``, the fence webhook or the whole configuration, or ``policy``, a
        FencePolicy's entry) and a Warning Event ``WebhookConfigurationRestored``."""
        reason = "deleted" if problem == "deleted" else "altered"
        self.restores += 1
        self.restored.set()
        metrics.WEBHOOK_CONFIGURATION_RESTORES.labels(reason, webhook).inc()
        message = (
            f"MutatingWebhookConfiguration {self.name} was {problem}; restored it. Until it was "
            f"restored, {unchecked}. Find out who changed it."
        )
        log.warning(message)
        if self.events is not None:
            ref = ObjectRef(
                "MutatingWebhookConfiguration", "admissionregistration.k8s.io/v1", "", self.name
            )
            await self.events.event(ref, "Warning", "WebhookConfigurationRestored", message)

    async def watch(self, resync_seconds: float = 30.0, backoff: float = 1.0) -> None:
        """Run forever: restore after each complete list, on every change event and at least
        every ``resync_seconds`` (the list-then-watch loop is :class:`ListWatch`: a change made
        after the list is delivered, one made before it is seen by that restore)."""
        what = Watched(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            field_selector=f"metadata.name={self.name}",
        )

        async def changed(event: Mapping[str, Any]) -> None:
            if event["type"] is not None:  # listed: restored once the list is complete
                await self.restore()

        async def listed(_: str | None, __: set[tuple[str, str]]) -> None:
            await self.restore()

        loop = ListWatch(self.api, what, changed, on_listed=listed, pause=lambda _: backoff)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(loop.run(), name=f"watch-{self.name}")
            while True:
                await asyncio.sleep(resync_seconds)
                try:
                    await self.restore()
                except Exception:
                    log.exception("checking webhook configuration %s failed", self.name)
