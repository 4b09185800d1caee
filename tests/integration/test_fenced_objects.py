"""Fenced objects through the real API server (docs/fenced-objects.md).

The fence webhook runs in this test process (:mod:`.fence_harness`), registered the local-mode
way: a :class:`PolicyWatch` keeps the FencePolicies' object webhooks in the configuration and
reports on each policy, and :class:`ObjectCommits` (the controller's part) records every
committed token of the declared kinds. Writers are the session's admin (an allowed writer: its
token is checked, its identity is not a Pod) and, through impersonation, the identities of the
cluster's own controllers (kube-controller-manager does not run here: the test writes status,
finalizer and GC edits the way those controllers do). Every kubectl call runs in a thread: the
webhook shares this event loop and must stay free to answer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.client.leadership import FencedLeadership
from fencedlease.client.sources import DirectoryGrant

from .objects_harness import Objects, data_of, declared, policy, wait_for

pytestmark = pytest.mark.timeout(120)

GC = "system:serviceaccount:kube-system:generic-garbage-collector"
DEPLOYMENT_CONTROLLER = "system:serviceaccount:kube-system:deployment-controller"


def configmap(ns: str, name: str, token: int | None, data: str, lease: str | None = "ctl") -> str:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if lease:
        meta["labels"] = {"fencedlease.io/lease": lease}
    if token is not None:
        meta["annotations"] = {"fencedlease.io/token": str(token)}
    return yaml.safe_dump(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"owner": data}}
    )


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    ("group", "resource", "expected"),
    [
        ("", "pods", "core resources pods"),
        ("", "namespaces", "core resources pods"),
        ("coordination.k8s.io", "leases", "API group coordination.k8s.io cannot be fenced"),
        ("fencedlease.io", "fencedartifacts", "API group fencedlease.io cannot be fenced"),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            "API group admissionregistration.k8s.io cannot be fenced",
        ),
        ("", "*", "spec.resources[0].resources[0]"),
    ],
)
async def test_kinds_that_could_wedge_the_cluster_are_refused_at_apply(
    objects: Objects, group: str, resource: str, expected: str
) -> None:
    fence = objects.fence
    name = f"bad-{uuid.uuid4().hex[:8]}"
    manifest = policy(name, [{"apiGroup": group, "resources": [resource]}], "x")
    out = await fence.kubectl("apply", "-f", "-", input=manifest, check=False)
    assert out.returncode != 0
    assert expected in out.stderr, out.stderr
    missing = await fence.kubectl("get", "fencepolicy", name, check=False)
    assert missing.returncode != 0  # nothing was stored


async def leased(objects: Objects) -> str:
    """The module's policy Ready, a fresh namespace with a FencedLease ``ctl``: its name."""
    await declared(objects)
    ns = await objects.fence.namespace()
    await objects.fence.lease(ns, "ctl")
    return ns


async def test_a_stale_holder_is_refused_and_the_object_keeps_the_new_content(
    objects: Objects,
) -> None:
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    ok = await fence.kubectl("apply", "-f", "-", input=configmap(ns, "cfg", old.token, "a"))
    assert ok.returncode == 0
    await fence.marked(ns, "ctl", old.token)  # the controller recorded the commit
    new = await fence.grant(ns, "ctl", "replica-b")
    await fence.kubectl("apply", "-f", "-", input=configmap(ns, "cfg", new.token, "b"))
    await fence.marked(ns, "ctl", new.token)

    stale = await fence.kubectl(
        "apply", "-f", "-", input=configmap(ns, "cfg", old.token, "a-again"), check=False
    )
    assert stale.returncode != 0
    assert f"stale_fence: token {old.token} is below the high-water mark {new.token}" in (
        stale.stderr
    )
    assert await data_of(fence, ns, "cfg") == "b"

    # Removing the label is a fenced write: with the stale token it is refused too.
    unlabel = await fence.kubectl(
        "label", "configmap", "-n", ns, "cfg", "fencedlease.io/lease-", check=False
    )
    assert unlabel.returncode == 0  # it keeps the stored (current) token: admin may
    relabel = configmap(ns, "cfg", old.token, "sneaky")  # labelled again with the old token
    refused = await fence.kubectl("apply", "-f", "-", input=relabel, check=False)
    assert "stale_fence" in refused.stderr, refused.stderr


async def test_malformed_annotations_are_invalid_and_change_nothing(objects: Objects) -> None:
    fence = objects.fence
    ns = await leased(objects)
    grant = await fence.grant(ns, "ctl", "replica-a")
    await fence.kubectl("apply", "-f", "-", input=configmap(ns, "cfg", grant.token, "a"))
    for bad in ("forty-two", "0", "99999999999999999999"):
        out = await fence.kubectl(
            "annotate",
            "configmap",
            "-n",
            ns,
            "cfg",
            "--overwrite",
            f"fencedlease.io/token={bad}",
            check=False,
        )
        assert out.returncode != 0
        assert "invalid: annotation fencedlease.io/token must be a decimal integer" in out.stderr
    missing = await fence.kubectl(
        "annotate", "configmap", "-n", ns, "cfg", "fencedlease.io/token-", check=False
    )
    assert "must carry the writer's fencing token" in missing.stderr
    out = await fence.kubectl("get", "configmap", "-n", ns, "cfg", "-o", "json")
    annotations = json.loads(out.stdout)["metadata"]["annotations"]
    assert annotations["fencedlease.io/token"] == str(grant.token)


async def test_unlabelled_objects_never_reach_the_webhook(objects: Objects) -> None:
    fence = objects.fence
    await declared(objects)
    ns = await fence.namespace()
    name = f"plain-{uuid.uuid4().hex[:6]}"
    await fence.kubectl("apply", "-f", "-", input=configmap(ns, name, None, "x", lease=None))
    await fence.kubectl("delete", "configmap", "-n", ns, name)
    assert name not in objects.reviews
    labelled = f"fenced-{uuid.uuid4().hex[:6]}"
    out = await fence.kubectl(
        "apply", "-f", "-", input=configmap(ns, labelled, None, "x"), check=False
    )
    assert out.returncode != 0 and labelled in objects.reviews


async def test_delete_then_recreate_below_the_mark_is_refused(objects: Objects) -> None:
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    new = await fence.grant(ns, "ctl", "replica-b")
    await fence.kubectl("apply", "-f", "-", input=configmap(ns, "cfg", new.token, "b"))
    await fence.marked(ns, "ctl", new.token)
    # The GC's identity is not an allowed writer: its content edit is holder_mismatch ...
    edit = await fence.kubectl(
        "--as", GC, "annotate", "configmap", "-n", ns, "cfg", "x=y", check=False
    )
    assert "holder_mismatch" in edit.stderr, edit.stderr
    deleted = await fence.kubectl("delete", "configmap", "-n", ns, "cfg")
    assert deleted.returncode == 0
    again = await fence.kubectl(
        "apply", "-f", "-", input=configmap(ns, "cfg", old.token, "a"), check=False
    )
    assert f"stale_fence: token {old.token} is below the high-water mark {new.token}" in (
        again.stderr
    )


def deployment(ns: str, token: int, image: str = "pause:3.9") -> str:
    labels = {"app": "web"}
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": ns,
                "labels": {"fencedlease.io/lease": "ctl"},
                "annotations": {"fencedlease.io/token": str(token)},
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": image}]},
                },
            },
        }
    )


async def test_a_fenced_deployment_rolls_out_scales_and_is_deleted_in_the_foreground(
    objects: Objects,
) -> None:
    fence = objects.fence
    ns = await leased(objects)
    old = await fence.grant(ns, "ctl", "replica-a")
    holder = await fence.grant(ns, "ctl", "replica-b")
    await fence.kubectl("apply", "-f", "-", input=deployment(ns, holder.token))
    await fence.marked(ns, "ctl", holder.token)
    # Roll out: a new template, written by the holder with its token.
    rolled = await fence.kubectl("apply", "-f", "-", input=deployment(ns, holder.token, "p:2"))
    assert rolled.returncode == 0
    # A stale roll-out is refused.
    stale = await fence.kubectl(
        "apply", "-f", "-", input=deployment(ns, old.token, "p:old"), check=False
    )
    assert "stale_fence" in stale.stderr, stale.stderr
    # The deployment controller's status writes (UpdateStatus: a PUT of the status
    # subresource with the object it read, so the token on it is not its own): not fenced.
    out = await fence.kubectl("get", "deployment", "-n", ns, "web", "-o", "json")
    body = json.loads(out.stdout)
    body["status"] = {"observedGeneration": body["metadata"]["generation"], "replicas": 1}
    wrote = await fence.kubectl(
        "--as", DEPLOYMENT_CONTROLLER, "replace", "--subresource=status", "-f", "-",
        input=json.dumps(body),
    )  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    # Scale by a person (kubectl scale as the admin; the HPA alike) is admitted: no candidate
    # of a lease (docs/fenced-objects.md, "Scale writes"; a Pod's is fenced: the matrix test).
    scaled = await fence.kubectl("scale", "deployment", "-n", ns, "web", "--replicas=3")
    assert scaled.returncode == 0, scaled.stderr
    # Foreground deletion: the delete is fenced (the holder's stored token) ...
    await fence.kubectl(
        "delete", "deployment", "-n", ns, "web", "--cascade=foreground", "--wait=false"
    )
    out = await fence.kubectl("get", "deployment", "-n", ns, "web", "-o", "json")
    meta = json.loads(out.stdout)["metadata"]
    assert "foregroundDeletion" in meta["finalizers"] and meta.get("deletionTimestamp")
    # ... and the garbage collector's finalizer removal (its own identity) goes through.
    gc = await fence.kubectl(
        "--as", GC, "patch", "deployment", "-n", ns, "web", "--type=json",
        "-p", json.dumps([{"op": "remove", "path": "/metadata/finalizers/0"}]),
    )  # fmt: skip
    assert gc.returncode == 0, gc.stderr
    gone = await fence.kubectl("get", "deployment", "-n", ns, "web", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    recreate = await fence.kubectl("apply", "-f", "-", input=deployment(ns, old.token), check=False)
    assert "stale_fence" in recreate.stderr, recreate.stderr


async def test_removing_a_policy_removes_its_webhook(objects: Objects) -> None:
    fence = objects.fence
    await declared(objects)
    extra = f"extra-{fence.selector_value}"
    await fence.kubectl(
        "apply", "-f", "-",
        input=policy(extra, [{"apiGroup": "", "resources": ["secrets"]}], fence.selector_value),
    )  # fmt: skip

    async def names() -> list[str]:
        current = await fence.registration.current() or {}
        return [str(w.get("name")) for w in current.get("webhooks") or []]

    async def has() -> bool:
        return f"{extra}.objects.fencedlease.io" in await names()

    async def has_not() -> bool:
        return f"{extra}.objects.fencedlease.io" not in await names()

    await wait_for(has, "the new policy's webhook")
    await fence.kubectl("delete", "fencepolicy", extra)
    await wait_for(has_not, "the removed policy's webhook to go")
    assert f"{objects.policy}.objects.fencedlease.io" in await names()


def write_grant(directory: Path, token: int, lease_id: str) -> None:
    """What the operator's downward-API volume shows a holder (client/sources.py reads it)."""
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(str(token))
    (directory / "lease-id").write_text(lease_id)
    (directory / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (directory / "state").write_text("held")


async def test_a_controller_replica_past_its_lease_is_refused_and_stops(
    objects: Objects, tmp_path: Path
) -> None:
    """The article's scenario with the holder-side helpers: both replicas stamp their grant
    on every write; the old leader's queued write, sent after the new leader's grant, is
    refused (a newer grant supersedes the old one at once, docs/tokens.md)."""
    fence = objects.fence
    ns = await leased(objects)
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=str(fence.cluster.kubeconfig), client_configuration=configuration
    )
    tasks: list[asyncio.Task[None]] = []
    apis = []

    async def replica(name: str) -> tuple[FencedLeadership, k8s.CoreV1Api]:
        granted = await fence.grant(ns, "ctl", name)
        write_grant(tmp_path / name, granted.token, granted.lease_id)
        leadership = FencedLeadership(DirectoryGrant(tmp_path / name, "ctl", poll_interval=0.05))
        tasks.append(asyncio.create_task(leadership.run()))
        async with asyncio.timeout(10):
            await leadership.wait_leading()
        apis.append(leadership.api_client(configuration))
        return leadership, k8s.CoreV1Api(apis[-1])

    try:
        body: Any = {
            "metadata": {"name": "state", "labels": {"fencedlease.io/lease": "ctl"}},
            "data": {"leader": "replica-a"},
        }
        old, old_api = await replica("replica-a")
        async with old.guard():
            await old_api.create_namespaced_config_map(ns, body)
        await fence.marked(ns, "ctl", old.token())
        new, new_api = await replica("replica-b")  # the old leader paused past its lease
        async with new.guard():
            await new_api.patch_namespaced_config_map(
                "state", ns, {"data": {"leader": "replica-b"}}
            )
        await fence.marked(ns, "ctl", new.token())
        # The old leader thaws; its queued write goes out stamped with its old token.
        with pytest.raises(ApiException) as refused:
            async with old.guard():
                await old_api.patch_namespaced_config_map(
                    "state", ns, {"data": {"leader": "replica-a"}}
                )
        assert refused.value.status == 403 and "stale_fence" in str(refused.value.body)
        assert old.stopped.is_set() and not old.leading()
        assert await data_of(fence, ns, "state", "leader") == "replica-b"
        # The new leader deletes it (its token written first, then that version deleted).
        await new_api.delete_namespaced_config_map("state", ns)
        gone = await fence.kubectl("get", "configmap", "-n", ns, "state", check=False)
        assert "NotFound" in gone.stderr
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for api in apis:
            await api.close()
