"""The operator guards the chart-owned webhook configuration through the real API server:
what Helm, Argo CD or Flux change stands and the guard writes nothing; a loosening is reverted
field by field (the owner's other changes kept); a deletion is restored, unless the Service
went with it (``helm uninstall``); a narrowing reverted by the previous controller during a
rollout is put back by the next; only the leading replica writes."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import config

from fencedlease import metrics
from fencedlease.events import ObjectRef
from fencedlease.local.cluster import LocalCluster
from fencedlease.registration import loosenings
from fencedlease.registration.fencepolicies import PolicyWatch
from fencedlease.registration.guard import ChartRegistrationGuard
from fencedlease.settings import Settings
from tests.unit.reviews import FENCE_RULES

NAME_LABEL = loosenings.NAME_LABEL


def chart_like_configuration(
    name: str, served: str | None, *, service: tuple[str, str] | None = None
) -> dict[str, Any]:
    """As the chart renders it. ``served`` is a namespace nobody writes in (no other test's
    writes are fenced by this webhook, which answers nowhere); ``None``: every namespace."""
    client_config: dict[str, Any] = {"caBundle": base64.b64encode(b"ca-one").decode()}
    if service is None:
        client_config["url"] = "https://127.0.0.1:1/fence"
    else:
        client_config["service"] = {
            "name": service[1],
            "namespace": service[0],
            "path": "/fence",
            "port": 443,
        }
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
                "clientConfig": client_config,
                "rules": copy.deepcopy(FENCE_RULES),
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
                "namespaceSelector": (
                    {"matchLabels": {NAME_LABEL: served}} if served is not None else {}
                ),
            }
        ],
    }


class Live:
    def __init__(self, cluster: LocalCluster, name: str) -> None:
        self.cluster, self.name = cluster, name

    def get(self) -> dict[str, Any] | None:
        got = self.cluster.kubectl(
            "get", "mutatingwebhookconfiguration", self.name, "-o", "json", check=False
        )
        if got.returncode != 0:
            return None
        out: dict[str, Any] = json.loads(got.stdout)
        return out

    def webhook(self) -> dict[str, Any]:
        found = loosenings.fence_webhook(self.get())
        assert found is not None
        return found

    def version(self) -> str:
        return str((self.get() or {})["metadata"]["resourceVersion"])

    def patch(self, ops: list[dict[str, Any]]) -> None:
        self.cluster.kubectl(
            "patch",
            "mutatingwebhookconfiguration",
            self.name,
            "--type=json",
            "-p",
            json.dumps(ops),
        )


@asynccontextmanager
async def guarding(
    cluster: LocalCluster,
    configuration: dict[str, Any],
    served: str | None,
    **kwargs: Any,
) -> AsyncIterator[tuple[ChartRegistrationGuard, Live]]:
    name = configuration["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(configuration))
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    guard = ChartRegistrationGuard(
        Settings(webhook_configuration_name=name, namespace=served),
        api,
        settle_seconds=0.2,
        **kwargs,
    )
    try:
        await guard.take_snapshot()
        yield guard, Live(cluster, name)
    finally:
        await api.close()
        await asyncio.to_thread(
            cluster.kubectl, "delete", "mutatingwebhookconfiguration", name, "--ignore-not-found"
        )


def fresh_name() -> str:
    return f"guard-{uuid.uuid4().hex[:8]}.fencedlease.io"


def test_owner_changes_stand_and_the_guard_writes_nothing(cluster: LocalCluster) -> None:
    """helm upgrade of the timeout and the selector, a CA rotation, a GitOps tool's
    server-side apply with its own field manager: none is reverted, none causes a write."""
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        async with guarding(cluster, chart_like_configuration(name, served), served) as (g, live):
            changes: list[Callable[[], None]] = [
                lambda: live.patch(
                    [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 2}]
                ),
                lambda: live.patch(
                    [
                        {
                            "op": "replace",
                            "path": "/webhooks/0/clientConfig/caBundle",
                            "value": base64.b64encode(b"ca-two").decode(),
                        }
                    ]
                ),
                lambda: live.patch(
                    [
                        {
                            "op": "replace",
                            "path": "/webhooks/0/namespaceSelector",
                            "value": {
                                "matchExpressions": [
                                    {"key": NAME_LABEL, "operator": "In", "values": [served, "b"]}
                                ]
                            },
                        }
                    ]
                ),
            ]
            for change in changes:
                await asyncio.to_thread(change)
                before = live.version()
                assert await g.restore() is None
                assert live.version() == before  # the guard wrote nothing
            # Argo CD / Flux: a server-side apply by another manager (a label, the timeout).
            synced = chart_like_configuration(name, served)
            synced["metadata"] = {"name": name, "labels": {"argocd.argoproj.io/instance": "x"}}
            synced["webhooks"][0] = {"name": "fence.fencedlease.io", "timeoutSeconds": 3}
            await asyncio.to_thread(
                cluster.kubectl,
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=argocd-controller",
                "-f",
                "-",
                input=json.dumps(synced),
            )
            before = live.version()
            assert await g.restore() is None
            assert live.version() == before
            shown = live.webhook()
            assert shown["timeoutSeconds"] == 3
            assert base64.b64decode(shown["clientConfig"]["caBundle"]) == b"ca-two"
            assert shown["namespaceSelector"]["matchExpressions"][0]["values"] == [served, "b"]
            labels = (live.get() or {})["metadata"]["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert g.restores == 0

    asyncio.run(scenario())


def test_each_loosening_is_reverted_and_the_owners_other_changes_kept(
    cluster: LocalCluster,
) -> None:
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"
    cases: list[tuple[str, Any, Any]] = [
        ("failurePolicy", "Ignore", "Fail"),
        (
            "rules",
            [
                {
                    "apiGroups": ["fencedlease.io"],
                    "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["fencedartifacts"],
                    "scope": "Namespaced",
                }
            ],
            None,
        ),
        ("namespaceSelector", {"matchLabels": {NAME_LABEL: "elsewhere"}}, None),
        ("objectSelector", {"matchLabels": {"fenced": "yes"}}, {}),
    ]

    async def scenario() -> None:
        async with guarding(cluster, chart_like_configuration(name, served), served) as (g, live):
            original = live.webhook()
            for timeout, (field, value, expected) in enumerate(cases, start=10):
                await asyncio.to_thread(
                    live.patch,
                    [
                        {"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": timeout},
                        {"op": "add", "path": f"/webhooks/0/{field}", "value": value},
                    ],
                )
                problem = await g.restore()
                assert problem is not None and problem.startswith("altered"), problem
                shown = live.webhook()
                assert shown[field] == (original[field] if expected is None else expected)
                assert shown["timeoutSeconds"] == timeout  # the owner's change stays
                recorded = (live.get() or {})["metadata"]["annotations"]
                assert json.loads(recorded[loosenings.REVERTED_ANNOTATION]) == {field: value}
                assert recorded["meta.helm.sh/release-name"] == "fencedlease"
                assert await g.restore() is None  # repaired: the next check writes nothing
            assert g.restores == len(cases)

    asyncio.run(scenario())


def test_a_deletion_is_restored_unless_the_service_went_with_it(
    cluster: LocalCluster, namespace: str
) -> None:
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "fence-webhook", "namespace": namespace},
        "spec": {"ports": [{"port": 443, "targetPort": 8443}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(service))
    configuration = chart_like_configuration(name, served, service=(namespace, "fence-webhook"))

    async def scenario() -> None:
        async with guarding(cluster, configuration, served) as (g, live):
            await asyncio.to_thread(cluster.kubectl, "delete", "mutatingwebhookconfiguration", name)
            assert await g.restore() == "deleted"
            restored = live.get()
            assert restored is not None
            assert restored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
            assert loosenings.fence_webhook(restored)["failurePolicy"] == "Fail"  # type: ignore[index]

            # helm uninstall: the configuration first, the Service right after.
            await asyncio.to_thread(cluster.kubectl, "delete", "mutatingwebhookconfiguration", name)
            await asyncio.to_thread(
                cluster.kubectl, "delete", "service", "fence-webhook", "-n", namespace
            )
            assert await g.restore() is None
            assert live.get() is None  # left uninstalled
            assert g.restores == 1

    asyncio.run(scenario())


def test_a_narrowing_reverted_during_a_rollout_is_put_back_by_the_new_controller(
    cluster: LocalCluster,
) -> None:
    """helm upgrade --set watchNamespace=team: the cluster-wide controller still running
    reverts the narrowed selector; the new controller, serving only that namespace, finds
    the narrowing safe and puts it back."""
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"

    async def scenario() -> None:
        wide = chart_like_configuration(name, None)
        async with guarding(cluster, wide, None) as (old, live):
            narrowed = {"matchLabels": {NAME_LABEL: served}}
            await asyncio.to_thread(
                live.patch,
                [{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": narrowed}],
            )
            assert (await old.restore() or "").startswith("altered")
            assert live.webhook()["namespaceSelector"] == {}
            api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
            try:
                new = ChartRegistrationGuard(
                    Settings(webhook_configuration_name=name, namespace=served), api
                )
                await new.take_snapshot()
                assert await new.restore() is None
                assert new.reapplied == 1
                assert live.webhook()["namespaceSelector"] == narrowed
                annotations = (live.get() or {})["metadata"]["annotations"]
                assert loosenings.REVERTED_ANNOTATION not in annotations
                before = live.version()
                assert await new.restore() is None
                assert live.version() == before  # settled: no more writes
            finally:
                await api.close()

    asyncio.run(scenario())


def test_only_the_leading_replica_restores_and_a_new_leader_checks_at_once(
    cluster: LocalCluster,
) -> None:
    """Every controller replica runs the guard; a standby sees the deletion and writes nothing
    (no re-creation, no Event); the replica that starts leading restores it without waiting for
    a resync."""
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"
    leading = False

    async def scenario() -> None:
        nonlocal leading
        async with guarding(
            cluster, chart_like_configuration(name, served), served, may_write=lambda: leading
        ) as (guard, live):
            seen = asyncio.Queue[bool]()  # one entry per restore() call: was the object there?
            restore = guard.restore

            async def observed() -> str | None:
                present = await guard.current() is not None
                result = await restore()
                seen.put_nowait(present)
                return result

            guard.restore = observed  # type: ignore[method-assign]
            # A long resync: only watch events and the hand-over may trigger a check.
            task = asyncio.create_task(guard.watch(resync_seconds=300))
            try:
                async with asyncio.timeout(60):
                    assert await seen.get() is True  # the first check after listing
                    await asyncio.to_thread(
                        cluster.kubectl, "delete", "mutatingwebhookconfiguration", name
                    )
                    while await seen.get():  # the check that saw the deletion (the barrier)
                        pass
                    assert await asyncio.to_thread(live.get) is None  # the standby wrote nothing
                    assert guard.restores == 0

                    leading = True
                    guard.leadership_started()
                    assert await seen.get() is False  # checked at once, found it deleted...
                    assert await asyncio.to_thread(live.get) is not None  # ...and restored it
                    assert guard.restores == 1
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_the_guard_adds_what_fence_policies_ask_and_still_reverts_loosenings(
    cluster: LocalCluster,
) -> None:
    """Chart mode: the FencePolicies' object webhooks are the controller's; it adds and
    removes them, Helm's own apply keeps them (strategic merge by webhook name), and a
    loosening of the fence webhook is still reverted without touching them."""
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"
    hook = "cms.objects.fencedlease.io"
    scale = "cms.scale.fencedlease.io"

    def names(live: Live) -> list[str]:
        return [str(w["name"]) for w in (live.get() or {}).get("webhooks") or []]

    def object_hook(live: Live) -> dict[str, Any]:
        found = [w for w in (live.get() or {})["webhooks"] if w["name"] == hook]
        assert len(found) == 1
        result: dict[str, Any] = found[0]
        return result

    async def scenario() -> None:
        configuration = chart_like_configuration(name, served)
        async with guarding(cluster, configuration, served) as (g, live):
            policies = PolicyWatch(g.api)
            g.policies = policies
            policies.synced = True
            policies.bodies = {
                "cms": {
                    "metadata": {"name": "cms"},
                    "generation": 1,
                    "spec": {"resources": [{"apiGroup": "", "resources": ["configmaps"]}]},
                }
            }
            await g.sync()
            assert names(live) == ["fence.fencedlease.io", hook, scale]
            added = object_hook(live)
            assert added["clientConfig"]["url"] == "https://127.0.0.1:1/fence-object"
            assert added["failurePolicy"] == "Fail"
            assert added["objectSelector"]["matchExpressions"][0]["key"] == "fencedlease.io/lease"
            assert {"key": NAME_LABEL, "operator": "In", "values": [served]} in (
                added["namespaceSelector"]["matchExpressions"]
            )
            scales = [w for w in (live.get() or {})["webhooks"] if w["name"] == scale]
            assert scales[0]["rules"][0]["resources"] == ["configmaps/scale"]
            assert not scales[0].get("objectSelector")  # a Scale has no labels
            assert scales[0]["namespaceSelector"] == added["namespaceSelector"]
            before = live.version()
            assert await g.restore() is None and live.version() == before  # in line: no write
            # helm upgrade (a client-side apply of the chart's configuration, a new timeout)
            configuration["webhooks"][0]["timeoutSeconds"] = 4
            await asyncio.to_thread(
                cluster.kubectl, "apply", "-f", "-", input=json.dumps(configuration)
            )
            assert names(live) == ["fence.fencedlease.io", hook, scale]
            # a loosening of the fence webhook is reverted; the object webhook stays
            live.patch([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}])
            assert await g.restore() is not None
            assert live.webhook()["failurePolicy"] == "Fail"
            assert names(live) == ["fence.fencedlease.io", hook, scale]
            # a loosened object webhook is put back as the policy asks
            live.patch([{"op": "replace", "path": "/webhooks/1/failurePolicy", "value": "Ignore"}])
            await g.restore()
            assert object_hook(live)["failurePolicy"] == "Fail"
            # the policy goes: so does its webhook
            policies.bodies = {}
            await g.sync()
            assert names(live) == ["fence.fencedlease.io"]

    asyncio.run(scenario())


class Recorded:
    """An :class:`~fencedlease.events.EventSink` that keeps what the guard posts."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def policy_restores() -> float:
    return metrics.counter_total(
        metrics.WEBHOOK_CONFIGURATION_RESTORES, reason="altered", webhook="policy"
    )


def test_a_changed_policy_entry_is_put_back_counted_and_reported(cluster: LocalCluster) -> None:
    """Chart mode: someone loosening a FencePolicy's entry (``failurePolicy: Ignore``, match
    conditions, the entry removed, its rules narrowed) is reverted *and* counted as the fence
    webhook's loosening is: ``webhook_configuration_restores_total{reason="altered",
    webhook="policy"}`` (``FencedLeaseWebhookConfigurationLoosened``) and a Warning Event naming
    the entry. Following a policy's own change (another kind, the policy deleted) or a new
    timeout from Helm is not an alteration: no count."""
    name, served = fresh_name(), f"nobody-{uuid.uuid4().hex[:6]}"
    hook = "cms.objects.fencedlease.io"

    def cms(resources: list[str]) -> dict[str, Any]:
        return {
            "metadata": {"name": "cms"},
            "generation": len(resources),
            "spec": {"resources": [{"apiGroup": "", "resources": resources}]},
        }

    def index(live: Live) -> int:
        names = [w["name"] for w in (live.get() or {})["webhooks"]]
        return names.index(hook)

    def entry(live: Live) -> dict[str, Any] | None:
        found = [w for w in (live.get() or {})["webhooks"] if w["name"] == hook]
        return found[0] if found else None

    async def scenario() -> None:
        events = Recorded()
        configuration = chart_like_configuration(name, served)
        async with guarding(cluster, configuration, served, events=events) as (g, live):
            policies = PolicyWatch(g.api)
            g.policies, policies.synced = policies, True
            policies.bodies = {"cms": cms(["configmaps"])}
            await g.sync()  # the policy's entry added: following, not an alteration
            start = policy_restores()
            assert entry(live) is not None and g.restores == 0 and events.events == []

            alterations: list[tuple[list[dict[str, Any]], str]] = [
                ([{"op": "replace", "path": "/failurePolicy", "value": "Ignore"}], "failurePolicy"),
                (
                    [
                        {
                            "op": "add",
                            "path": "/matchConditions",
                            "value": [{"name": "skip", "expression": "false"}],
                        }
                    ],
                    "matchConditions",
                ),
                ([{"op": "replace", "path": "/rules/0/resources", "value": ["secrets"]}], "rules"),
                ([{"op": "remove", "path": ""}], "removed"),
            ]
            for count, (ops, what) in enumerate(alterations, start=1):
                at = f"/webhooks/{index(live)}"
                live.patch([{**op, "path": at + op["path"]} for op in ops])
                await g.restore()
                put_back = entry(live)
                assert put_back is not None, what
                assert put_back["failurePolicy"] == "Fail", what
                assert not put_back.get("matchConditions"), what
                resources = put_back["rules"][0]["resources"]
                assert resources == ["configmaps", "configmaps/status"], what
                assert policy_restores() == start + count, what
                assert g.restores == count, what
                kind, reason, message = events.events[-1]
                assert (kind, reason) == ("Warning", "WebhookConfigurationRestored")
                assert hook in message and what in message, message
                assert await g.restore() is None and policy_restores() == start + count

            # the scale entry narrowed to labelled objects (a Scale has none: it would match no
            # scale write) is put back and counted the same way
            scale = "cms.scale.fencedlease.io"
            spot = [w["name"] for w in (live.get() or {})["webhooks"]].index(scale)
            selector = {"matchExpressions": [{"key": "fencedlease.io/lease", "operator": "Exists"}]}
            live.patch([{"op": "replace", "path": f"/webhooks/{spot}/objectSelector",
                         "value": selector}])  # fmt: skip
            await g.restore()
            scales = [w for w in (live.get() or {})["webhooks"] if w["name"] == scale]
            assert not scales[0].get("objectSelector")
            assert policy_restores() == start + len(alterations) + 1
            kind, reason, message = events.events[-1]
            assert scale in message and "objectSelector" in message, message

            # following: the policy asks another kind, Helm sets a new timeout, the policy goes
            policies.bodies = {"cms": cms(["configmaps", "secrets"])}
            await g.sync()
            assert (entry(live) or {})["rules"][0]["resources"] == [
                "configmaps",
                "configmaps/status",
                "secrets",
                "secrets/status",
            ]
            configuration["webhooks"][0]["timeoutSeconds"] = 4
            await asyncio.to_thread(
                cluster.kubectl, "apply", "-f", "-", input=json.dumps(configuration)
            )
            await g.restore()
            assert (entry(live) or {})["timeoutSeconds"] == 4
            policies.bodies = {}
            await g.sync()
            assert entry(live) is None
            assert policy_restores() == start + len(alterations) + 1
            assert g.restores == len(alterations) + 1

    asyncio.run(scenario())
