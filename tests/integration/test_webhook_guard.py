"""The operator guards the chart-owned webhook configuration: restore on delete or loosening,
accept CA rotation, never touch Helm's labels."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

from kubernetes_asyncio import client, config

from fencedlease.local.cluster import LocalCluster
from fencedlease.settings import Settings
from fencedlease.webhook.guard import ChartRegistrationGuard


def chart_like_configuration(name: str, selector_value: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "fencedlease"},
        },
        "webhooks": [
            {
                "name": "fence.fencedlease.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": "https://127.0.0.1:1/fence",
                    "caBundle": base64.b64encode(b"ca-one").decode(),
                },
                "rules": [
                    {
                        "apiGroups": ["fencedlease.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["fencedartifacts", "fencedartifacts/status"],
                        "scope": "Namespaced",
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
                # Selects no namespace: this test must not fence other tests' writes.
                "namespaceSelector": {"matchLabels": {"fencedlease-guard-test": selector_value}},
            }
        ],
    }


def test_guard_restores_deleted_or_loosened_configuration(cluster: LocalCluster) -> None:
    name = f"guard-{uuid.uuid4().hex[:8]}.fencedlease.io"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(chart_like_configuration(name, name)))

    def live() -> dict[str, Any]:
        out: dict[str, Any] = json.loads(
            cluster.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout
        )
        return out

    async def scenario() -> None:
        await config.load_kube_config(config_file=str(cluster.kubeconfig))
        api = client.ApiClient()
        guard = ChartRegistrationGuard(Settings(webhook_configuration_name=name), api)
        await guard.take_snapshot()
        task = asyncio.create_task(guard.watch(resync_seconds=5))
        try:
            async with asyncio.timeout(60):

                async def expect_restore(action: list[str]) -> None:
                    guard.restored.clear()
                    await asyncio.to_thread(cluster.kubectl, *action)
                    await guard.restored.wait()

                await expect_restore(["delete", "mutatingwebhookconfiguration", name])
                assert live()["webhooks"][0]["failurePolicy"] == "Fail"

                loosen = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
                await expect_restore(
                    [
                        "patch",
                        "mutatingwebhookconfiguration",
                        name,
                        "--type=json",
                        "-p",
                        json.dumps(loosen),
                    ]
                )
                assert live()["webhooks"][0]["failurePolicy"] == "Fail"
                assert guard.restores == 2

                rotate = [
                    {
                        "op": "replace",
                        "path": "/webhooks/0/clientConfig/caBundle",
                        "value": base64.b64encode(b"ca-two").decode(),
                    }
                ]
                await asyncio.to_thread(
                    cluster.kubectl,
                    "patch",
                    "mutatingwebhookconfiguration",
                    name,
                    "--type=json",
                    "-p",
                    json.dumps(rotate),
                )
                assert await guard.restore() is None  # CA rotation is not an alteration
                assert guard.restores == 2
                got = live()
                assert base64.b64decode(got["webhooks"][0]["clientConfig"]["caBundle"]) == (
                    b"ca-two"
                )
                assert got["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
            await asyncio.to_thread(
                cluster.kubectl,
                "delete",
                "mutatingwebhookconfiguration",
                name,
                "--ignore-not-found",
            )

    asyncio.run(scenario())


def test_only_the_leading_replica_restores_and_a_new_leader_checks_at_once(
    cluster: LocalCluster,
) -> None:
    """Every controller replica runs the guard; a standby sees the deletion and writes nothing
    (no re-creation, no Event); the replica that starts leading restores it without waiting for
    a resync."""
    name = f"guard-{uuid.uuid4().hex[:8]}.fencedlease.io"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(chart_like_configuration(name, name)))

    def exists() -> bool:
        got = cluster.kubectl("get", "mutatingwebhookconfiguration", name, check=False)
        return got.returncode == 0

    async def scenario() -> None:
        await config.load_kube_config(config_file=str(cluster.kubeconfig))
        api = client.ApiClient()
        leading = False
        guard = ChartRegistrationGuard(
            Settings(webhook_configuration_name=name), api, may_write=lambda: leading
        )
        await guard.take_snapshot()
        seen = asyncio.Queue[bool]()  # one entry per restore() call: was the object there?
        restore = guard.restore

        async def observed() -> str | None:
            present = await guard.current() is not None
            result = await restore()
            seen.put_nowait(present)
            return result

        guard.restore = observed  # type: ignore[method-assign]
        # A long resync: only watch events and the leadership hand-over may trigger a check.
        task = asyncio.create_task(guard.watch(resync_seconds=300))
        try:
            async with asyncio.timeout(60):
                assert await seen.get() is True  # the first check after listing
                await asyncio.to_thread(
                    cluster.kubectl, "delete", "mutatingwebhookconfiguration", name
                )
                while await seen.get():  # the check that saw the deletion (the barrier)
                    pass
                assert not await asyncio.to_thread(exists)  # the standby restored nothing
                assert guard.restores == 0

                leading = True
                guard.leadership_started()
                assert await seen.get() is False  # checked at once, found it deleted...
                assert await asyncio.to_thread(exists)  # ...and restored it
                assert guard.restores == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await api.close()
            await asyncio.to_thread(
                cluster.kubectl,
                "delete",
                "mutatingwebhookconfiguration",
                name,
                "--ignore-not-found",
            )

    asyncio.run(scenario())
