"""An example Kopf operator with fenced leadership (docs/fenced-objects.md).

Two replicas are the candidate Pods of the FencedLease ``fenced-controller``; the operator's
grant reaches each through its downward-API files (``/etc/fencedlease``). Only the replica
that holds the grant handles events, and every write it makes carries its token, so the fence
webhook refuses a former leader's write once the new leader wrote (``stale_fence``). It does
two things, both fenced:

* **mirror**: every ConfigMap labelled ``example.fencedlease.io/source`` is copied to
  ``<name>-mirror``, labelled ``fencedlease.io/lease: fenced-controller`` (a fenced object);
* **heartbeat**: every ``WRITE_INTERVAL`` seconds the leader decides three writes and sends
  them after the interval — writes queued across a pause, as in the article: the ConfigMap
  ``fenced-controller-state`` (``leader``: its Pod name, ``seq``), stamped with its token; the
  **status** of its Heartbeat ``fenced-controller-state`` (``leader``, ``seq``) and its
  **scale** (``replicas: seq``), which carry no token: the webhook decides them by who writes
  (only the Pod holding the current grant, docs/fenced-objects.md "Status writes"). A
  replica whose write the fence refuses stops (exit code 3) once its queued writes were sent.

``FENCED=false`` is the control run: the same operator without the lease label on what it
writes (nothing is fenced), which shows the stale leader's overwrite.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease.client import DirectoryGrant
from fencedlease.client.fenced import LEASE_LABEL, MERGE_PATCH, stamp
from fencedlease.client.leadership import FencedLeadership

LEASE = os.environ.get("FENCEDLEASE_LEASE", "fenced-controller")
GRANT_DIR = os.environ.get("FENCEDLEASE_DIR", "/etc/fencedlease")
NAMESPACE = os.environ.get("POD_NAMESPACE", "default")
POD = os.environ.get("POD_NAME", "local")
STATE = os.environ.get("STATE_NAME", "fenced-controller-state")
SOURCE_LABEL = "example.fencedlease.io/source"
HEARTBEATS = ("example.fencedlease.io", "v1", "heartbeats")
"""The example's custom resource with ``status`` and ``scale`` subresources (manifests.yaml)."""
INTERVAL = float(os.environ.get("WRITE_INTERVAL", "1"))
FENCED = os.environ.get("FENCED", "true").lower() != "false"
EXIT_REFUSED = 3
HEALTH = os.environ.get("HEALTH_ENDPOINT") or None
"""Kopf's liveness endpoint (``http://0.0.0.0:8080/healthz``), the Pod's readiness probe: a
frozen replica stops answering, turns unready, and the fencedlease operator moves the lease."""

log = logging.getLogger("fenced-controller")
leadership = FencedLeadership(DirectoryGrant(GRANT_DIR, LEASE, poll_interval=0.2))
leadership.install()


def fenced_labels() -> dict[str, str]:
    return {LEASE_LABEL: LEASE} if FENCED else {}


@kopf.on.event("configmaps", labels={SOURCE_LABEL: kopf.PRESENT}, when=leadership.when)
async def mirror(body: Any, name: str, namespace: str | None, type: str, **_: Any) -> None:
    """Copy a source ConfigMap (its every write is the leader's, stamped with its token)."""
    if type == "DELETED" or namespace is None:
        return
    api = leadership.api_client()
    try:
        core = client.CoreV1Api(api)
        copy: Any = {
            "metadata": {"name": f"{name}-mirror", "labels": fenced_labels()},
            "data": dict(body.get("data") or {}),
        }
        async with leadership.guard():
            try:
                await core.replace_namespaced_config_map(f"{name}-mirror", namespace, copy)
            except ApiException as error:
                if error.status != 404:
                    raise
                await core.create_namespaced_config_map(namespace, copy)
    finally:
        await api.close()


@kopf.on.startup()
async def start_heartbeat(memo: kopf.Memo, **_: Any) -> None:
    memo["heartbeat"] = asyncio.create_task(heartbeat(), name="heartbeat")


async def heartbeat() -> None:
    """Decide, wait, write: the write decided while leading goes out after the interval."""
    configuration = client.Configuration()
    try:
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except kube_config.ConfigException:
        await kube_config.load_kube_config(client_configuration=configuration)
    seq = 0
    async with client.ApiClient(configuration) as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        while not leadership.stopped.is_set():
            await leadership.wait_leading()
            if leadership.stopped.is_set():
                break
            seq += 1
            body: Any = {
                "metadata": {"name": STATE, "labels": fenced_labels()},
                "data": {"leader": POD, "seq": str(seq)},
            }
            if FENCED:
                body = stamp(body, leadership.token())  # decided now, sent after the pause
            await ensure_heartbeat(custom)
            log.info("queued %s: leader=%s seq=%d", STATE, POD, seq)
            await asyncio.sleep(INTERVAL)
            writes = (
                ("", write_state(core, body)),
                ("status of ", write_status(custom, seq)),
                ("scale of ", write_scale(custom, seq)),
            )
            for what, write in writes:  # each queued write is sent, refused or not
                try:
                    async with leadership.guard():
                        await write
                    log.info("wrote %s%s: leader=%s seq=%d", what, STATE, POD, seq)
                except ApiException as error:
                    log.error("%s%s write refused (%s): %s", what, STATE, error.status, error.body)
    log.error("the fence refused this replica's write: it stops")
    os._exit(EXIT_REFUSED)  # not sys.exit: the refused replica must not write anything else


async def write_state(core: client.CoreV1Api, body: Any) -> None:
    try:
        await core.replace_namespaced_config_map(STATE, NAMESPACE, body)
    except ApiException as error:
        if error.status != 404:
            raise
        await core.create_namespaced_config_map(NAMESPACE, body)


async def ensure_heartbeat(custom: client.CustomObjectsApi) -> None:
    """The Heartbeat exists (created by the first leader, stamped like every fenced write)."""
    group, version, plural = HEARTBEATS
    body: Any = {
        "apiVersion": f"{group}/{version}",
        "kind": "Heartbeat",
        "metadata": {"name": STATE, "labels": fenced_labels()},
        "spec": {"replicas": 0},
    }
    if FENCED:
        body = stamp(body, leadership.token())
    try:
        await custom.create_namespaced_custom_object(group, version, NAMESPACE, plural, body)
    except ApiException as error:
        if error.status != 409:  # 404: the CRD is not served yet (its writes log why)
            log.error("creating Heartbeat %s failed (%s): %s", STATE, error.status, error.body)


AS_MERGE_PATCH: Any = {"_content_type": MERGE_PATCH}
"""A dict body is a merge patch (the generated client would send it as a JSON patch)."""


async def write_status(custom: client.CustomObjectsApi, seq: int) -> None:
    """The Heartbeat's status: no token (decided by who writes it)."""
    group, version, plural = HEARTBEATS
    status = {"status": {"leader": POD, "seq": seq}}
    await custom.patch_namespaced_custom_object_status(
        group, version, NAMESPACE, plural, STATE, status, **AS_MERGE_PATCH
    )


async def write_scale(custom: client.CustomObjectsApi, seq: int) -> None:
    """The Heartbeat's scale subresource (``spec.replicas``): no token either."""
    group, version, plural = HEARTBEATS
    scale = {"spec": {"replicas": seq}}
    await custom.patch_namespaced_custom_object_scale(
        group, version, NAMESPACE, plural, STATE, scale, **AS_MERGE_PATCH
    )


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    kopf.run(
        standalone=True,
        namespaces=[NAMESPACE],
        stop_flag=leadership.stopped,
        liveness_endpoint=HEALTH,
    )
    return EXIT_REFUSED if leadership.stopped.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
