"""Fenced objects through the real API server: every request path finds its fields, and a
stored value gets the checks a request's gets (issue 42; docs/fenced-objects.md)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from .fence_harness import LABEL, FenceHarness
from .objects_harness import Objects, declared, policy, wait_for
from .pod_writers import as_pod, impersonating, send
from .test_fenced_objects import DEPLOYMENT_CONTROLLER, GC, configmap, deployment, leased

pytestmark = pytest.mark.timeout(120)

NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
SELECTOR = "fencedlease.io%2Flease%3Dctl"


async def names(objects: Objects, ns: str, kind: str = "configmaps") -> list[str]:
    out = await objects.fence.kubectl("get", kind, "-n", ns, "-o", "name", "-l", LEASE_LABEL)
    return out.stdout.split()


LEASE_LABEL = "fencedlease.io/lease"


async def test_a_collection_delete_by_the_holder_and_the_namespace_controller(
    objects: Objects,
) -> None:
    """Each item of a collection delete has no request.name and no request.object: the
    name comes from the stored object (a namespace holding fenced objects must terminate;
    the namespace controller deletes each kind as a collection)."""
    fence = objects.fence
    ns = await leased(objects)
    holder = await fence.grant(ns, "ctl", "replica-a")
    url = f"/api/v1/namespaces/{ns}/configmaps?labelSelector={SELECTOR}"
    for who in ([], ["--as", NAMESPACE_CONTROLLER]):
        for name in ("one", "two"):
            manifest = configmap(ns, name, holder.token, "a")
            await fence.kubectl("apply", "-f", "-", input=manifest)
        await fence.marked(ns, "ctl", holder.token)
        out = await fence.kubectl(*who, "delete", "--raw", url, check=False)
        assert out.returncode == 0, (who, out.stderr)
        assert await names(objects, ns) == [], who


async def unselected_namespace(objects: Objects, *manifests: str) -> str:
    """A namespace the policy does not select yet, with a FencedLease ``ctl`` and the given
    objects written there unfenced; then it is selected (labelled "before the policy")."""
    fence = objects.fence
    await declared(objects)
    ns = f"fw-{uuid.uuid4().hex[:10]}"
    await fence.kubectl("create", "namespace", ns)
    fence.namespaces.append(ns)
    await fence.lease(ns, "ctl")
    for manifest in manifests:
        await fence.kubectl("apply", "-f", "-", input=manifest.replace("NS", ns))
    await fence.kubectl("label", "namespace", ns, f"{LABEL}={fence.selector_value}")

    async def selected() -> bool:  # the API server's namespace informer caught up
        probe = configmap(ns, "probe", None, "x")
        out = await fence.kubectl("apply", "--dry-run=server", "-f", "-", input=probe, check=False)
        return out.returncode != 0

    await wait_for(selected, f"namespace {ns} to be selected")
    return ns


async def test_objects_labelled_before_their_policy_have_a_way_out(objects: Objects) -> None:
    fence = objects.fence
    forged = 2**63 - 1
    ns = await unselected_namespace(
        objects,
        configmap("NS", "untokened", None, "x"),
        configmap("NS", "untokened-gc", None, "x"),
        configmap("NS", "forged", forged, "x"),
        configmap("NS", "bad-1", None, "x", lease="Not_A_Lease"),
        configmap("NS", "bad-2", None, "x", lease="Not_A_Lease"),
        configmap("NS", "bad-3", None, "x", lease="Not_A_Lease"),
    )
    holder = await fence.grant(ns, "ctl", "replica-a")
    # A stored token never issued for the lease fences no one: the holder's write passes.
    mine = configmap(ns, "forged", holder.token, "by-holder")
    out = await fence.kubectl("apply", "-f", "-", input=mine)
    assert out.returncode == 0, out.stderr
    # The GC and the namespace controller delete a labelled object without a token.
    for who, name in ((GC, "untokened-gc"), (NAMESPACE_CONTROLLER, "untokened")):
        out = await fence.kubectl("--as", who, "delete", "configmap", "-n", ns, name, check=False)
        assert out.returncode == 0, (who, out.stderr)
    # A malformed stored label names no lease: removing it, deleting the object.
    unlabel = await fence.kubectl("label", "configmap", "-n", ns, "bad-1", f"{LEASE_LABEL}-")
    assert unlabel.returncode == 0, unlabel.stderr
    for args, name in (([], "bad-2"), (["--as", GC], "bad-3")):
        out = await fence.kubectl(*args, "delete", "configmap", "-n", ns, name, check=False)
        assert out.returncode == 0, (args, out.stderr)


async def test_a_superseded_replay_is_stale_not_duplicate(objects: Objects) -> None:
    """The old holder retries its last write (same operation id) after a newer grant, before
    the new holder wrote anything: told stale_fence, never duplicate."""
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    body = yaml.safe_load(configmap(ns, "cfg", old.token, "a"))
    body["metadata"]["annotations"]["fencedlease.io/operation-id"] = "op-1"
    await fence.kubectl("apply", "-f", "-", input=json.dumps(body))
    await fence.marked(ns, "ctl", old.token)
    retry = await fence.kubectl("replace", "-f", "-", input=json.dumps(body), check=False)
    assert "duplicate" in retry.stderr, retry.stderr  # while it holds: a retry, applied
    await fence.grant(ns, "ctl", "replica-b")
    replay = await fence.kubectl("replace", "-f", "-", input=json.dumps(body), check=False)
    assert replay.returncode != 0 and "stale_fence" in replay.stderr, replay.stderr
    assert "superseded by the newer grant" in replay.stderr


async def test_a_stale_leader_is_refused_before_the_new_leader_writes(objects: Objects) -> None:
    """docs/fenced-objects.md: a newer grant supersedes the old one at once (docs/tokens.md)."""
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    await fence.kubectl("apply", "-f", "-", input=configmap(ns, "cfg", old.token, "a"))
    await fence.marked(ns, "ctl", old.token)
    await fence.grant(ns, "ctl", "replica-b")  # it has written nothing yet
    stale = await fence.kubectl(
        "apply", "-f", "-", input=configmap(ns, "cfg", old.token, "a-2"), check=False
    )
    assert stale.returncode != 0 and "stale_fence" in stale.stderr, stale.stderr
    created = await fence.kubectl(
        "apply", "-f", "-", input=configmap(ns, "new", old.token, "a-3"), check=False
    )
    assert created.returncode != 0 and "stale_fence" in created.stderr, created.stderr


def secret(ns: str, name: str, token: int) -> str:
    meta = {
        "name": name,
        "namespace": ns,
        "labels": {LEASE_LABEL: "ctl"},
        "annotations": {"fencedlease.io/token": str(token)},
    }
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": meta})


async def test_an_unfenced_copy_moves_no_mark(objects: Objects) -> None:
    """Secrets are declared only for other namespaces: a labelled Secret here is a copy the
    webhook never checked, and must not consume a StrictlyGreater grant."""
    fence = objects.fence
    await declared(objects)
    other = f"other-{fence.selector_value}"
    copies = f"copies-{fence.selector_value}"
    manifest = policy(copies, [{"apiGroup": "", "resources": ["secrets"]}], other)
    await fence.kubectl("apply", "-f", "-", input=manifest)
    ns = await fence.namespace()
    await fence.lease(ns, "ctl", "StrictlyGreater")
    elsewhere = await fence.namespace()
    await fence.kubectl("label", "namespace", elsewhere, "--overwrite", f"{LABEL}={other}")
    await fence.lease(elsewhere, "ctl")
    try:
        holder = await fence.grant(ns, "ctl", "replica-a")
        await fence.kubectl("apply", "-f", "-", input=secret(ns, "copy", holder.token))
        # A fenced Secret after it, in the same watch: once its mark moved, the copy was seen.
        probe = await fence.grant(elsewhere, "ctl", "replica-a")

        async def fenced_secret() -> bool:
            out = await fence.kubectl(
                "apply", "-f", "-", input=secret(elsewhere, "real", probe.token), check=False
            )
            return out.returncode == 0

        await policy_ready(fence, copies)
        assert await fenced_secret()
        await fence.marked(elsewhere, "ctl", probe.token)
        assert await fence.hwm(ns, "ctl") is None
        out = await fence.kubectl(
            "apply", "-f", "-", input=configmap(ns, "cfg", holder.token, "a"), check=False
        )
        assert out.returncode == 0, out.stderr
    finally:
        await fence.kubectl("delete", "fencepolicy", copies, "--ignore-not-found", check=False)


CRD_GROUP = "fencetest.example.com"


def crd(plural: str, subresources: dict[str, Any] | None) -> str:
    kind = plural[:-1].capitalize()
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        },
    }
    if subresources is not None:
        version["subresources"] = subresources
    return yaml.safe_dump(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{CRD_GROUP}"},
            "spec": {
                "group": CRD_GROUP,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": plural[:-1], "kind": kind},
                "versions": [version],
            },
        }
    )


async def custom_kind(objects: Objects, plural: str, subresources: dict[str, Any] | None) -> str:
    """A CRD (established) declared by its own policy for the harness's namespaces."""
    fence = objects.fence
    await fence.kubectl("apply", "-f", "-", input=crd(plural, subresources))
    await fence.kubectl(
        "wait", "--for=condition=Established", f"crd/{plural}.{CRD_GROUP}", "--timeout=30s"
    )
    name = f"{plural}-{fence.selector_value}"
    manifest = policy(name, [{"apiGroup": CRD_GROUP, "resources": [plural]}], fence.selector_value)
    await fence.kubectl("apply", "-f", "-", input=manifest)
    await policy_ready(fence, name)
    return name


async def policy_ready(fence: FenceHarness, name: str) -> None:
    async def ready() -> bool:
        out = await fence.kubectl("get", "fencepolicy", name, "-o", "json")
        conditions = (json.loads(out.stdout).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    await wait_for(ready, f"FencePolicy {name} to be Ready")


def custom(ns: str, plural: str, token: int, data: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{CRD_GROUP}/v1",
        "kind": plural[:-1].capitalize(),
        "metadata": {
            "name": "w",
            "namespace": ns,
            "labels": {LEASE_LABEL: "ctl"},
            "annotations": {"fencedlease.io/token": str(token)},
        },
        "spec": {"data": data},
    }


async def test_status_of_a_custom_resource_without_a_status_subresource_is_fenced(
    objects: Objects,
) -> None:
    fence = objects.fence
    plural = "plainwidgets"
    name = await custom_kind(objects, plural, None)
    try:
        ns = await leased(objects)
        kubeconfig = fence.cluster.kubeconfig
        path = f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/{plural}"
        old = await fence.grant(ns, "ctl", "replica-a")
        async with as_pod(kubeconfig, ns, "replica-a") as a, as_pod(kubeconfig, ns, "b") as b:
            status, text = await send(a, "POST", path, custom(ns, plural, old.token, "a"),
                                      "application/json")  # fmt: skip
            assert status == 200, text
            await fence.marked(ns, "ctl", old.token)
            new = await fence.grant(ns, "ctl", "b")
            patch = {"metadata": {"annotations": {"fencedlease.io/token": str(new.token)}}}
            status, text = await send(b, "PATCH", f"{path}/w", patch)
            assert status == 200, text
            # The ex-holder publishes .status on the main resource (keeps the stored token).
            status, text = await send(a, "PATCH", f"{path}/w", {"status": {"phase": "stale"}})
            assert status == 403 and "holder_mismatch" in text, (status, text)
            # ... with its own token: stale.
            stale = {**patch, "status": {"phase": "stale"}}
            stale["metadata"] = {"annotations": {"fencedlease.io/token": str(old.token)}}
            status, text = await send(a, "PATCH", f"{path}/w", stale)
            assert status == 403 and "stale_fence" in text, (status, text)
            status, text = await send(b, "PATCH", f"{path}/w", {"status": {"phase": "b"}})
            assert status == 200, text
    finally:
        await fence.kubectl("delete", "fencepolicy", name, "--ignore-not-found", check=False)


async def test_status_writes_are_decided_by_who_writes(objects: Objects) -> None:
    """The status subresource carries no token: the lease's current grant decides. The new
    holder reports status before it rewrote the object; the thawed ex-holder, whose token is
    still the stored one, is stale; a Pod that never held is holder_mismatch; the deployment
    controller (not a Pod) keeps working."""
    fence = objects.fence
    ns = await leased(objects)
    kubeconfig = fence.cluster.kubeconfig
    path = f"/apis/apps/v1/namespaces/{ns}/deployments"
    old = await fence.grant(ns, "ctl", "replica-a")
    body = yaml.safe_load(deployment(ns, old.token))
    status_of = {"status": {"observedGeneration": 1}}
    async with (
        as_pod(kubeconfig, ns, "replica-a") as a,
        as_pod(kubeconfig, ns, "replica-b") as b,
        as_pod(kubeconfig, ns, "replica-c") as c,
        impersonating(kubeconfig, DEPLOYMENT_CONTROLLER) as controller,
    ):
        status, text = await send(a, "POST", path, body, "application/json")
        assert status == 200, text
        await fence.marked(ns, "ctl", old.token)
        status, text = await send(a, "PATCH", f"{path}/web/status", status_of)
        assert status == 200, text  # the holder reports status
        await fence.grant(ns, "ctl", "replica-b")
        for api, expected in ((a, "stale_fence"), (c, "holder_mismatch")):
            status, text = await send(api, "PATCH", f"{path}/web/status", status_of)
            assert status == 403 and f"denied the request: {expected}" in text, (status, text)
        for api in (b, controller):
            status, text = await send(api, "PATCH", f"{path}/web/status", status_of)
            assert status == 200, text
