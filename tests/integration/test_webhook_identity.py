"""The writer's identity through the real API server: an impersonated username that is not
``system:serviceaccount:<ns>:<name>`` is no Pod, whatever its extras say (issue 31)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from fencedlease.models import ARTIFACTS, GROUP
from fencedlease.webhook.reviews import POD_NAME_EXTRA

from .fence_harness import FenceHarness, api_client, artifact, publish

pytestmark = pytest.mark.timeout(90)


async def test_a_three_part_service_account_name_is_held_to_the_allowed_writers(
    fence: FenceHarness,
) -> None:
    ns = await fence.namespace()
    await fence.lease(ns, "imp")
    grant = await fence.grant(ns, "imp", "worker-a")
    # A user (impersonation: the API server takes the name as a plain user) whose name reads
    # like a service account of another namespace plus a third part, with the grant's Pod name.
    forged = "system:serviceaccount:elsewhere:pub:x"
    await fence.kubectl(
        "create", "role", "publisher", "-n", ns, "--verb=get,create,update,patch",
        f"--resource={ARTIFACTS}.{GROUP}",
    )  # fmt: skip
    await fence.kubectl(
        "create", "rolebinding", "publisher", "-n", ns, "--role=publisher", f"--user={forged}"
    )
    api = await api_client(fence.cluster.kubeconfig)
    api.set_default_header("Impersonate-User", forged)
    api.set_default_header(f"Impersonate-Extra-{POD_NAME_EXTRA.replace('/', '%2F')}", "worker-a")
    try:
        out = await publish(
            client.CustomObjectsApi(api), artifact(ns, "cat", "imp", grant.token, "x.tmp")
        )
    finally:
        await api.close()
    assert not out.ok and out.status == 403, out.message
    assert "holder_mismatch" in out.message and "not a Pod-bound service-account token" in (
        out.message
    ), out.message
    assert await fence.get(ns, "cat") is None
