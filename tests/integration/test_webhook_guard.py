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
