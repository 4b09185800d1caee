"""Start the registration part of a process (called by the composition root,
:mod:`fencedlease.app`): the process's one FencePolicy watch, and what keeps the webhook
configuration — local mode's self-registration (``webhook_registration == "url"``, in the
process that serves the webhook) or chart mode's guard (``webhook_guard``, in a process with a
controller)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fencedlease.kube import KubeApi
from fencedlease.registration.fencepolicies import PolicyWatch
from fencedlease.registration.guard import ChartRegistrationGuard
from fencedlease.registration.selfregistration import Registration
from fencedlease.settings import Settings, WebhookRegistration

OnLeading = Callable[[Callable[[], None]], None]
"""Registers a callback for when this replica starts leading (the election's)."""


def needs_policies(settings: Settings, *, controller: bool, webhook: bool) -> bool:
    """Does a process with these parts watch FencePolicies: a controller (its fenced-object
    watches follow the declared kinds) or a self-registering webhook (its entries)."""
    return controller or (webhook and settings.webhook_registration is WebhookRegistration.URL)


async def start_registration(
    settings: Settings,
    kube: KubeApi,
    policies: PolicyWatch,
    *,
    port: int | None,
    leader: Callable[[], bool] | None,
    on_leading: OnLeading | None,
) -> list[asyncio.Task[Any]]:
    """Start ``policies`` (the process's one FencePolicy watch, whose followers are already
    wired) and what keeps the configuration; returns the tasks to cancel on shutdown.

    ``port``: the webhook's, in a process that serves it (local mode registers it by URL and
    keeps it registered; it writes whether or not it leads, as it always did). ``leader``: a
    controller's leadership (chart mode's guard: every replica watches, only the leader
    writes, and a replica that starts leading checks at once, through ``on_leading``)."""
    tasks: list[asyncio.Task[Any]] = []
    if settings.webhook_registration is WebhookRegistration.URL and port is not None:
        registration = await Registration(
            settings, port, kube.api, kube.events, policies=policies
        ).registered()
        policies.on_change = registration.sync
        tasks.append(asyncio.create_task(registration.watch(), name="webhook-registration"))
    elif (
        settings.webhook_registration is WebhookRegistration.NONE
        and settings.webhook_guard
        and leader is not None
    ):
        policies.may_write = leader
        guard = ChartRegistrationGuard(
            settings, kube.api, kube, may_write=leader, policies=policies
        )
        policies.on_change = guard.sync
        if on_leading is not None:
            on_leading(guard.leadership_started)
        tasks.append(asyncio.create_task(guard.watch(), name="webhook-guard"))
    tasks.append(asyncio.create_task(policies.run(), name="fence-policies"))
    return tasks
