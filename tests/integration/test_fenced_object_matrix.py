"""The conformance matrix of docs/fenced-objects.md, driven cell by cell through the real API
server (issue 43): every path a writer can take to a fenced object, for every writer, for a
ConfigMap, Secret, Service, Deployment, StatefulSet, Job, a custom resource with status and
scale subresources and one without.

The table in the doc is the expectation; this test reads it, runs each cell on a fresh object
and prints the whole matrix, observed beside expected, when any cell differs. Writers other
than the session's admin act by impersonation (:mod:`.pod_writers`): no controller-manager
runs here, so its controllers' identities are impersonated too."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import re
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.client.errors import UnfencedRequest
from fencedlease.client.fenced import fenced_async_api_client
from fencedlease.client.grant import Grant

from .objects_harness import Objects, policy
from .pod_writers import EXTRA, as_pod, impersonating, send
from .test_fenced_object_paths import CRD_GROUP, custom_kind, policy_ready
from .test_fenced_objects import leased

pytestmark = pytest.mark.timeout(300)

DOC = Path(__file__).resolve().parents[2] / "docs" / "fenced-objects.md"
TOKEN = "fencedlease.io/token"
LEASE = "fencedlease.io/lease"


def read_matrix() -> tuple[list[str], dict[str, dict[str, str]]]:
    """The doc's table: writers (columns) and ``{path: {writer: decision}}``."""
    text = DOC.read_text()
    block = text.split("<!-- conformance-matrix -->")[1].split("<!-- /conformance-matrix -->")[0]
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in block.strip().splitlines()
    ]
    header, body = rows[0], rows[2:]
    writers = header[1:]
    return writers, {row[0]: dict(zip(writers, row[1:], strict=True)) for row in body}


@dataclass(frozen=True)
class Kind:
    name: str
    api: str
    """``/api/v1`` or ``/apis/<group>/<version>``."""
    plural: str
    kind: str
    extra: dict[str, Any]
    """The body beyond metadata."""
    status: dict[str, Any] | None = None
    """A status merge patch (``None``: no status subresource)."""
    scale: bool = False
    strategic: bool = True

    def collection(self, ns: str) -> str:
        return f"{self.api}/namespaces/{ns}/{self.plural}"


def _deployment_spec() -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "pause:3.9"}]},
            },
        }
    }


_JOB_POD = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "pause:3.9"}]}
KINDS = [
    Kind("configmap", "/api/v1", "configmaps", "ConfigMap", {"data": {"k": "v"}}),
    Kind(
        "deployment",
        "/apis/apps/v1",
        "deployments",
        "Deployment",
        _deployment_spec(),
        status={"status": {"observedGeneration": 1}},
        scale=True,
    ),
    Kind("secret", "/api/v1", "secrets", "Secret", {"stringData": {"k": "v"}}),
    Kind(
        "service",
        "/api/v1",
        "services",
        "Service",
        {"spec": {"clusterIP": "None", "ports": [{"port": 80}], "selector": {"app": "web"}}},
        status={"status": {"loadBalancer": {}}},
    ),
    Kind(
        "statefulset",
        "/apis/apps/v1",
        "statefulsets",
        "StatefulSet",
        {"spec": {**_deployment_spec()["spec"], "serviceName": "web"}},
        status={"status": {"observedGeneration": 1, "replicas": 0}},
        scale=True,
    ),
    Kind(
        "job",
        "/apis/batch/v1",
        "jobs",
        "Job",
        {"spec": {"suspend": True, "template": {"spec": _JOB_POD}}},
        status={"status": {"active": 0}},
    ),
    Kind(
        "crd-status-scale",
        f"/apis/{CRD_GROUP}/v1",
        "fullwidgets",
        "Fullwidget",
        {"spec": {"replicas": 1}},
        status={"status": {"replicas": 1}},
        scale=True,
        strategic=False,
    ),
    Kind(
        "crd-plain",
        f"/apis/{CRD_GROUP}/v1",
        "plainwidgets",
        "Plainwidget",
        {"spec": {"replicas": 1}},
        strategic=False,
    ),
]
BY_NAME = {kind.name: kind for kind in KINDS}
BUILT_IN = [
    {"apiGroup": "", "resources": ["secrets", "services"]},
    {"apiGroup": "apps", "resources": ["statefulsets"]},
    {"apiGroup": "batch", "resources": ["jobs"]},
]
"""Declared by a policy of this module (the harness's declares configmaps and deployments)."""
SUBRESOURCES = {
    "fullwidgets": {
        "status": {},
        "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"},
    },
    "plainwidgets": None,
}

CONTROLLERS = {
    "gc": "system:serviceaccount:kube-system:generic-garbage-collector",
    "namespace-controller": "system:serviceaccount:kube-system:namespace-controller",
    "deployment-controller": "system:serviceaccount:kube-system:deployment-controller",
    "hpa": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
}
PODS = {"holder": "replica-b", "ex-holder": "replica-a", "candidate": "replica-c",
        "stranger": "stranger"}  # fmt: skip


@dataclass
class Writer:
    name: str
    api: k8s.ApiClient
    token: int | None
    """What it stamps (``None``: nothing, the cluster's controllers)."""


def body(kind: Kind, ns: str, name: str, token: int | None, note: str) -> dict[str, Any]:
    annotations = {"fencetest/by": note}
    if token is not None:
        annotations[TOKEN] = str(token)
    meta = {
        "name": name,
        "namespace": ns,
        "labels": {LEASE: "ctl", "cell": name},
        "annotations": annotations,
    }
    return {
        "apiVersion": kind.api.removeprefix("/apis/").removeprefix("/api/"),
        "kind": kind.kind,
        "metadata": meta,
        **copy.deepcopy(kind.extra),
    }


def observed(status: int, text: str) -> str:
    if status in (200, 201):
        return "allowed"
    try:
        message = str(json.loads(text).get("message", text))
    except ValueError:
        message = text
    found = re.search(r"denied the request: ([a-z_]+):", message)
    if found:
        return found.group(1)
    if status == 409:
        return "conflict"
    return f"http-{status}"


async def cell(kind: Kind, path: str, writer: Writer, ns: str, name: str) -> str | None:
    """Run one cell; ``None``: the kind has no such path."""
    api, token = writer.api, writer.token
    item = f"{kind.collection(ns)}/{name}"
    note = f"{writer.name}-{path}"
    merge = {"metadata": {"annotations": {f"fencetest/by-{writer.name}": note}}}
    if token is not None:
        merge["metadata"]["annotations"][TOKEN] = str(token)
    dry = [("dryRun", "All")]
    match path:
        case "create" | "dry-run-create":
            query = dry if path.startswith("dry") else []
            new = body(kind, ns, name, token, note)
            return observed(*await send(api, "POST", kind.collection(ns), new,
                                        "application/json", query))  # fmt: skip
        case "update" | "dry-run-update":
            query = dry if path.startswith("dry") else []
            _, text = await send(api, "GET", item)
            current = json.loads(text)
            current["metadata"]["annotations"].update(merge["metadata"]["annotations"])
            return observed(*await send(api, "PUT", item, current, "application/json", query))
        case "merge-patch":
            return observed(*await send(api, "PATCH", item, merge))
        case "strategic-patch":
            if not kind.strategic:
                return None
            return observed(*await send(api, "PATCH", item, merge,
                                        "application/strategic-merge-patch+json"))  # fmt: skip
        case "json-patch":
            ops = [
                {"op": "add", "path": "/metadata/annotations/" + k.replace("/", "~1"), "value": v}
                for k, v in merge["metadata"]["annotations"].items()
            ]
            return observed(*await send(api, "PATCH", item, ops, "application/json-patch+json"))
        case "apply" | "apply-force":
            applied = body(kind, ns, name, token, note)
            applied["metadata"]["annotations"] = merge["metadata"]["annotations"]
            query = [("fieldManager", f"m-{writer.name}")]
            if path == "apply-force":
                query.append(("force", "true"))
            return observed(*await send(api, "PATCH", item, applied,
                                        "application/apply-patch+yaml", query))  # fmt: skip
        case "delete" | "dry-run-delete":
            query = dry if path.startswith("dry") else []
            return observed(*await send(api, "DELETE", item, None, "application/json", query))
        case "delete-foreground-precondition":
            _, text = await send(api, "GET", item)
            version = json.loads(text)["metadata"]["resourceVersion"]
            options = {
                "propagationPolicy": "Foreground",
                "preconditions": {"resourceVersion": version},
            }
            return observed(*await send(api, "DELETE", item, options, "application/json"))
        case "collection-delete":
            query = [("labelSelector", f"cell={name}")]
            return observed(*await send(api, "DELETE", kind.collection(ns), None,
                                        "application/json", query))  # fmt: skip
        case "status":
            if kind.status is None:
                return None
            return observed(*await send(api, "PATCH", f"{item}/status", kind.status))
        case "scale":
            if not kind.scale:
                return None
            return observed(*await send(api, "PATCH", f"{item}/scale",
                                        {"spec": {"replicas": 2}}))  # fmt: skip
    raise AssertionError(f"the matrix names a path this test does not know: {path}")


async def writers(stack: AsyncExitStack, kubeconfig: Path, ns: str, tokens: dict[str, int],
                  names: list[str]) -> dict[str, Writer]:  # fmt: skip
    found: dict[str, Writer] = {}
    for name in names:
        if name in PODS:
            api = await stack.enter_async_context(as_pod(kubeconfig, ns, PODS[name]))
            token: int | None = tokens["old"] if name == "ex-holder" else tokens["current"]
        elif name in CONTROLLERS:
            api = await stack.enter_async_context(impersonating(kubeconfig, CONTROLLERS[name]))
            token = None
        elif name == "other-admin":
            api = await stack.enter_async_context(impersonating(kubeconfig, "alice"))
            token = tokens["current"]
        elif name == "admin":
            api = await stack.enter_async_context(impersonating(kubeconfig, None))
            token = tokens["current"]
        else:
            raise AssertionError(f"the matrix names a writer this test does not know: {name}")
        found[name] = Writer(name, api, token)
    return found


def cell_name(path: str, writer: str) -> str:
    return f"{path}-{writer}"[:63].strip("-")


async def test_every_cell_of_the_conformance_matrix(objects: Objects) -> None:
    names, expected = read_matrix()
    fence = objects.fence
    policies = [await custom_kind(objects, p, SUBRESOURCES[p]) for p in SUBRESOURCES]
    policies.append(f"built-in-{fence.selector_value}")
    manifest = policy(policies[-1], BUILT_IN, fence.selector_value)
    await fence.kubectl("apply", "-f", "-", input=manifest)
    await policy_ready(fence, policies[-1])
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", PODS["ex-holder"])
    current = await fence.grant(ns, "ctl", PODS["holder"])
    tokens = {"old": old.token, "current": current.token}
    results: dict[tuple[str, str, str], str | None] = {}
    async with AsyncExitStack() as stack:
        who = await writers(stack, fence.cluster.kubeconfig, ns, tokens, names)
        holder = who["holder"]
        for kind in KINDS:  # a fresh object per cell, written by the holder
            for path in expected:
                if path.endswith("create"):
                    continue
                for writer in names:
                    new = body(kind, ns, cell_name(path, writer), current.token, "holder")
                    status, text = await send(holder.api, "POST", kind.collection(ns), new,
                                              "application/json")  # fmt: skip
                    assert status == 200, (kind.name, path, writer, text)
        await fence.marked(ns, "ctl", current.token)
        limit = asyncio.Semaphore(8)

        async def run(kind: Kind, path: str, writer: str) -> None:
            async with limit:
                name = cell_name(path, writer)
                results[kind.name, path, writer] = await cell(kind, path, who[writer], ns, name)

        await asyncio.gather(*(run(k, p, w) for k in KINDS for p in expected for w in names))
    for name in policies:
        await fence.kubectl("delete", "fencepolicy", name, "--ignore-not-found", check=False)
    wrong = [
        key for key, got in results.items() if got is not None and got != expected[key[1]][key[2]]
    ]
    assert not wrong, render(names, expected, results, wrong)


def render(
    names: list[str],
    expected: dict[str, dict[str, str]],
    results: dict[tuple[str, str, str], str | None],
    wrong: list[tuple[str, str, str]],
) -> str:
    """The matrix per kind: ``observed`` where it matches, ``observed (expected X)`` not."""
    lines = [f"{len(wrong)} of {len(results)} cells differ from docs/fenced-objects.md:"]
    for kind in KINDS:
        lines.append(f"\n{kind.name}: | path | " + " | ".join(names) + " |")
        for path, row in expected.items():
            shown: list[str] = []
            for writer in names:
                got = results.get((kind.name, path, writer))
                if got is None:
                    shown.append("n/a")
                elif got == row[writer]:
                    shown.append(got)
                else:
                    shown.append(f"**{got}** (expected {row[writer]})")
            lines.append(f"| {path} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


async def test_a_dry_run_never_moves_a_mark(objects: Objects) -> None:
    """A newer holder's dry runs are admitted and store nothing: the mark stays. A real write
    of another lease after them, seen by the same watch, shows they were looked at."""
    fence = objects.fence
    ns = await leased(objects)
    await fence.lease(ns, "probe")
    first = await fence.grant(ns, "ctl", "replica-a")
    kubeconfig = fence.cluster.kubeconfig
    kind = BY_NAME["configmap"]
    async with impersonating(kubeconfig, None) as admin:
        cfg = body(kind, ns, "cfg", first.token, "a")
        status, text = await send(admin, "POST", kind.collection(ns), cfg, "application/json")
        assert status == 200, text
        await fence.marked(ns, "ctl", first.token)
        newer = await fence.grant(ns, "ctl", "replica-b")
        dry = [("dryRun", "All")]
        created = body(kind, ns, "dry", newer.token, "b")
        status, text = await send(admin, "POST", kind.collection(ns), created,
                                  "application/json", dry)  # fmt: skip
        assert status == 200, text
        patch = {"metadata": {"annotations": {TOKEN: str(newer.token)}}}
        status, text = await send(admin, "PATCH", f"{kind.collection(ns)}/cfg", patch,
                                  query=dry)  # fmt: skip
        assert status == 200, text
        probe = await fence.grant(ns, "probe", "replica-b")
        real = body(kind, ns, "probe", probe.token, "p")
        real["metadata"]["labels"][LEASE] = "probe"
        status, text = await send(admin, "POST", kind.collection(ns), real, "application/json")
        assert status == 200, text
    await fence.marked(ns, "probe", probe.token)
    mark = await fence.hwm(ns, "ctl")
    assert mark is not None and mark.token == first.token


async def test_status_writes_reach_the_webhook_for_labelled_objects_of_declared_kinds_only(
    objects: Objects,
) -> None:
    fence = objects.fence
    ns = await leased(objects)
    holder = await fence.grant(ns, "ctl", "replica-a")
    kind = BY_NAME["deployment"]
    plain = body(kind, ns, "plain", None, "x")
    del plain["metadata"]["labels"][LEASE]
    replicaset = body(kind, ns, "undeclared", holder.token, "x")  # a kind no policy declares
    replicaset["kind"] = "ReplicaSet"
    replicasets = f"/apis/apps/v1/namespaces/{ns}/replicasets"
    created = [
        (kind.collection(ns), plain),
        (kind.collection(ns), body(kind, ns, "fenced", holder.token, "x")),
        (replicasets, replicaset),
    ]
    async with impersonating(fence.cluster.kubeconfig, None) as admin:
        for collection, obj in created:
            status, text = await send(admin, "POST", collection, obj, "application/json")
            assert status == 200, text
        before = list(objects.reviews)
        for collection, obj in created:
            item = f"{collection}/{obj['metadata']['name']}/status"
            status, text = await send(admin, "PATCH", item, {"status": {"observedGeneration": 1}})
            assert status == 200, text
    seen = objects.reviews[len(before) :]
    assert seen == ["fenced"], seen


async def test_scale_writes_reach_the_webhook_from_pods_for_declared_kinds_in_selected_namespaces(
    objects: Objects,
) -> None:
    """The scale entry has no objectSelector (a Scale has no labels) but a match condition
    (docs/fenced-objects.md "Scale writes"): a Pod-bound writer's scale write of a declared
    kind in a selected namespace reaches the webhook, labelled or not (its cost); the same
    writes by an admin (the HPA alike: not Pod-bound) never do, nor a Pod's of an undeclared
    kind (ReplicaSet) or in a namespace the policy does not select. The unlabelled parent is
    admitted."""
    fence = objects.fence
    ns = await leased(objects)
    other = f"fw-other-{fence.selector_value}-{len(objects.reviews)}"
    await fence.kubectl("create", "namespace", other)  # not labelled: not selected
    holder = await fence.grant(ns, "ctl", "replica-a")
    kind = BY_NAME["deployment"]
    plain = body(kind, ns, "plain", None, "x")
    del plain["metadata"]["labels"][LEASE]
    elsewhere = body(kind, other, "elsewhere", holder.token, "x")
    replicaset = body(kind, ns, "undeclared", holder.token, "x")
    replicaset["kind"] = "ReplicaSet"
    created = [
        (kind.collection(ns), plain),
        (kind.collection(ns), body(kind, ns, "fenced", holder.token, "x")),
        (kind.collection(other), elsewhere),
        (f"/apis/apps/v1/namespaces/{ns}/replicasets", replicaset),
    ]
    kubeconfig = fence.cluster.kubeconfig
    answers: dict[str, str] = {}
    try:
        async with impersonating(kubeconfig, None) as admin:
            for collection, obj in created:
                status, text = await send(admin, "POST", collection, obj, "application/json")
                assert status == 200, text
            before = len(objects.reviews)
            for collection, obj in created:
                item = f"{collection}/{obj['metadata']['name']}/scale"
                status, text = await send(admin, "PATCH", item, {"spec": {"replicas": 0}})
                assert status == 200, text
        assert objects.reviews[before:] == []  # not Pod-bound: not sent
        async with as_pod(kubeconfig, ns, "replica-b") as pod:  # not the holder
            for collection, obj in created:
                item = f"{collection}/{obj['metadata']['name']}/scale"
                status, text = await send(pod, "PATCH", item, {"spec": {"replicas": 2}})
                answers[obj["metadata"]["name"]] = observed(status, text)
        assert objects.reviews[before:] == ["plain", "fenced"], objects.reviews[before:]
        assert answers == {
            "plain": "allowed",  # the parent is not labelled: not fenced
            "fenced": "holder_mismatch",
            "elsewhere": "allowed",
            "undeclared": "allowed",
        }, answers
    finally:
        await fence.kubectl("delete", "namespace", other, "--wait=false", check=False)


async def fenced_as_pod(kubeconfig: Path, ns: str, pod: str, token: int) -> k8s.ApiClient:
    """The SDK's fenced ``kubernetes_asyncio`` client on a held grant of ``token``, acting as
    Pod ``pod`` (impersonated like :func:`.pod_writers.as_pod`)."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(kubeconfig), client_configuration=configuration
    )
    until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    held = Grant(token=token, lease_id="g", valid_until=until, state="held", lease="ctl")
    api: k8s.ApiClient = fenced_async_api_client(lambda: held, configuration)
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:ctl")
    api.set_default_header("Impersonate-Group", "system:masters")
    api.set_default_header(EXTRA + "pod-name", pod)
    api.set_default_header(EXTRA + "pod-uid", f"uid-{pod}")
    return api


async def test_the_fenced_client_writes_status_and_scale_as_the_holder(objects: Objects) -> None:
    """docs/client.md, "Fenced clients": the holder's status write and JSON-patch scale write
    through the SDK's fenced client are admitted as they are; the frozen ex-holder's, on the
    object it last wrote, are ``stale_fence``; a collection delete is never sent."""
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    kind = BY_NAME["deployment"]
    async with impersonating(fence.cluster.kubeconfig, None) as admin:
        web = body(kind, ns, "web", old.token, "x")
        status, text = await send(admin, "POST", kind.collection(ns), web, "application/json")
        assert status == 200, text
    holder = await fence.grant(ns, "ctl", "replica-b")
    kubeconfig = fence.cluster.kubeconfig
    answers: dict[str, list[str]] = {}
    for pod, token in (("replica-a", old.token), ("replica-b", holder.token)):
        api = await fenced_as_pod(kubeconfig, ns, pod, token)
        apps = k8s.AppsV1Api(api)
        found: list[str] = []
        writes = (
            apps.patch_namespaced_deployment_status("web", ns, {"status": {"replicas": 0}}),
            apps.patch_namespaced_deployment_scale(
                "web", ns, [{"op": "replace", "path": "/spec/replicas", "value": 2}]
            ),
        )
        for write in writes:
            try:
                await write
                found.append("allowed")
            except ApiException as error:
                found.append(observed(int(error.status), str(error.body)))
        with pytest.raises(UnfencedRequest):
            await apps.delete_collection_namespaced_deployment(ns)
        await api.close()
        answers[pod] = found
    assert answers == {
        "replica-a": ["stale_fence", "stale_fence"],
        "replica-b": ["allowed", "allowed"],
    }, answers
