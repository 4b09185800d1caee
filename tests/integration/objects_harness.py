"""Fenced objects' test harness: the fence webhook of :mod:`.fence_harness` registered the
local-mode way, with the FencePolicies' object webhooks (:class:`PolicyWatch`) and the
controller's commit recorder for the declared kinds (:class:`ObjectCommits`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fencedlease.controller.objects import DeclaredKinds, ObjectCommits
from fencedlease.kube import KubeApi
from fencedlease.local.cluster import LocalCluster
from fencedlease.registration.fencepolicies import PolicyWatch

from .fence_harness import LABEL, FenceHarness, start_harness, stop_harness


class _Always:
    def is_leader(self) -> bool:
        return True


@dataclass
class Objects:
    fence: FenceHarness
    policy: str
    reviews: list[str]
    """Names of the objects whose reviews reached ``/fence-object``."""
    kinds: DeclaredKinds | None = None


@asynccontextmanager
async def running_objects(cluster: LocalCluster, cert_dir: Path) -> AsyncIterator[Objects]:
    fence = await start_harness(cluster, cert_dir)
    registration = fence.registration
    policies = PolicyWatch(fence.api, on_change=registration.sync)
    registration.policies = policies
    commits = ObjectCommits(fence.store, KubeApi(fence.api), _Always())
    kinds = DeclaredKinds(fence.api, commits)
    policies.follow(kinds.declare)  # the one FencePolicy watch, as the composition root wires it
    seen: list[str] = []
    review = fence.server.objects.review

    async def counting(body: Any) -> dict[str, Any]:
        seen.append(str(body.get("request", {}).get("name")))
        return await review(body)

    fence.server.objects.review = counting  # type: ignore[method-assign]
    tasks = [asyncio.create_task(t) for t in (policies.run(), commits.run(), kinds.run())]
    name = f"objects-{fence.selector_value}"
    try:
        yield Objects(fence, name, seen, kinds)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Every policy this harness applied: one left behind declares its kinds to every later
        # operator of the session (the chart-RBAC one may not watch a test's custom resource).
        await fence.kubectl(
            "delete", "fencepolicy", "-l", f"{LABEL}={fence.selector_value}", check=False
        )
        await fence.kubectl("delete", "fencepolicy", name, "--ignore-not-found", check=False)
        await stop_harness(fence)


def policy(name: str, resources: list[dict[str, Any]], selector_value: str) -> str:
    """The FencePolicy as JSON for ``kubectl apply``: PyYAML leaves a value like ``01835740``
    unquoted (not a YAML 1.1 number to it), and kubectl's YAML reads it as a number."""
    return json.dumps(
        {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencePolicy",
            # labelled with its harness, which deletes its policies when it stops
            "metadata": {"name": name, "labels": {LABEL: selector_value}},
            "spec": {
                "resources": resources,
                "namespaceSelector": {"matchLabels": {LABEL: selector_value}},
            },
        }
    )


async def wait_for(check: Callable[[], Awaitable[Any]], what: str, bound: float = 15.0) -> Any:
    try:
        async with asyncio.timeout(bound):
            while True:
                found = await check()
                if found:
                    return found
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def declared(objs: Objects) -> None:
    """Apply the module's policy (configmaps, deployments) and wait until it is Ready."""
    fence = objs.fence
    manifest = policy(
        objs.policy,
        [
            {"apiGroup": "", "resources": ["configmaps"]},
            {"apiGroup": "apps", "resources": ["deployments"]},
        ],
        fence.selector_value,
    )
    await fence.kubectl("apply", "-f", "-", input=manifest)

    async def ready() -> bool:
        out = await fence.kubectl("get", "fencepolicy", objs.policy, "-o", "json")
        status = json.loads(out.stdout).get("status") or {}
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    await wait_for(ready, "the FencePolicy to be Ready")


async def data_of(fence: FenceHarness, ns: str, name: str, key: str = "owner") -> str:
    out = await fence.kubectl(
        "get", "configmap", "-n", ns, name, "-o", f"jsonpath={{.data.{key}}}", check=False
    )
    return out.stdout
