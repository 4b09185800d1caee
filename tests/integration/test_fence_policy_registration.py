"""FencePolicies the API server or the fence cannot honour, through the real API server
(docs/fenced-objects.md): a selector the API server would refuse is refused at apply; a
policy whose webhook entry the API server refuses anyway is isolated (the others register);
a cluster-scoped kind is refused and an unserved one is told, by discovery.

The fence webhook and the policies' registration run in this test process
(:mod:`.objects_harness`); every kubectl call runs in a thread.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from fencedlease.authority import fencepolicy
from fencedlease.registration.fencepolicies import OBJECT_WEBHOOK_SUFFIX

from .objects_harness import Objects, policy, wait_for

pytestmark = pytest.mark.timeout(120)

CM = [{"apiGroup": "", "resources": ["configmaps"]}]


def manifest(name: str, resources: list[dict[str, Any]], selector: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "fencedlease.io/v1alpha1",
            "kind": "FencePolicy",
            "metadata": {"name": name},
            "spec": {"resources": resources, "namespaceSelector": selector},
        }
    )


async def ready(objs: Objects, name: str) -> dict[str, Any] | None:
    """The policy's Ready condition once it describes its generation (else ``None``)."""
    out = await objs.fence.kubectl("get", "fencepolicy", name, "-o", "json", check=False)
    if out.returncode != 0:
        return None
    body = json.loads(out.stdout)
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"].get("generation"):
        return None
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)


async def entries(objs: Objects) -> list[str]:
    current = await objs.fence.registration.current() or {}
    return [str(w.get("name")) for w in current.get("webhooks") or []]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({"matchLabels": {"bad key!": "x"}}, "a label key is [prefix/]name"),
        ({"matchLabels": {"team": "bad value!"}}, "spec.namespaceSelector.matchLabels.team"),
        (
            {"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]},
            "spec.namespaceSelector.matchExpressions[0].key",
        ),
        (
            {"matchExpressions": [{"key": "team", "operator": "In"}]},
            "values must be non-empty for In/NotIn",
        ),
        (
            {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]},
            "values must be non-empty for In/NotIn and empty for Exists/DoesNotExist",
        ),
    ],
)
async def test_a_selector_the_api_server_would_refuse_is_refused_at_apply(
    objects: Objects, selector: dict[str, Any], expected: str
) -> None:
    name = f"bad-{uuid.uuid4().hex[:8]}"
    out = await objects.fence.kubectl(
        "apply", "-f", "-", input=manifest(name, CM, selector), check=False
    )
    assert out.returncode != 0
    assert expected in out.stderr, out.stderr
    missing = await objects.fence.kubectl("get", "fencepolicy", name, check=False)
    assert missing.returncode != 0  # nothing was stored


async def test_a_policy_the_api_server_refuses_does_not_block_the_others(
    objects: Objects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored policy whose entry the API server refuses (stored before the CRD and the
    parser checked selectors: here the parser's check is switched off and the policy is only
    in the operator's view) is refused with the server's reason; every other policy registers
    and is Ready, and a new one still registers after it."""
    fence = objects.fence
    watch = fence.registration.policies
    assert watch is not None
    monkeypatch.setattr(fencepolicy, "selector_refusal", lambda _: None)
    tag = fence.selector_value
    bad, good, later = f"aa-bad-{tag}", f"good-{tag}", f"later-{tag}"
    await fence.kubectl("apply", "-f", "-", input=policy(good, CM, tag))
    await wait_for(lambda: _ready_true(objects, good), "the good policy to be Ready")
    watch.bodies[bad] = {
        "metadata": {"name": bad, "generation": 1},
        "generation": 1,
        "spec": {
            "resources": CM,
            "namespaceSelector": {"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]},
        },
    }
    try:
        await fence.registration.sync()  # what the watch does when a policy changes
        found = watch.policies[bad]
        assert isinstance(found, str), found
        assert found.startswith("the API server refused its webhook entry: webhooks[")
        assert "namespaceSelector.matchExpressions[0].key" in found
        names = await entries(objects)
        assert f"{good}{OBJECT_WEBHOOK_SUFFIX}" in names
        assert f"{bad}{OBJECT_WEBHOOK_SUFFIX}" not in names
        condition = await ready(objects, good)
        assert condition is not None and condition["status"] == "True", condition

        await fence.kubectl(
            "apply",
            "-f",
            "-",
            input=policy(later, [{"apiGroup": "", "resources": ["secrets"]}], tag),
        )
        await wait_for(lambda: _ready_true(objects, later), "a policy added after it to be Ready")
        assert f"{later}{OBJECT_WEBHOOK_SUFFIX}" in await entries(objects)
    finally:
        watch.bodies.pop(bad, None)
        for name in (good, later):
            await fence.kubectl("delete", "fencepolicy", name, "--ignore-not-found", check=False)


async def _ready_true(objs: Objects, name: str) -> bool:
    condition = await ready(objs, name)
    return condition is not None and condition["status"] == "True"


async def test_a_cluster_scoped_kind_is_refused_and_an_unserved_one_is_told(
    objects: Objects,
) -> None:
    fence = objects.fence
    tag = fence.selector_value
    classes, typo = f"classes-{tag}", f"typo-{tag}"
    ingress = [{"apiGroup": "networking.k8s.io", "resources": ["ingressclasses"]}]
    await fence.kubectl("apply", "-f", "-", input=policy(classes, ingress, tag))
    typo_kind = [{"apiGroup": "", "resources": ["configmap"]}]
    await fence.kubectl("apply", "-f", "-", input=policy(typo, typo_kind, tag))
    try:

        async def refused() -> dict[str, Any] | None:
            condition = await ready(objects, classes)
            return condition if condition and condition["reason"] == "Refused" else None

        condition = await wait_for(refused, "the cluster-scoped policy to be Refused")
        assert condition["status"] == "False"
        assert "ingressclasses.networking.k8s.io is cluster-scoped" in condition["message"]
        assert f"{classes}{OBJECT_WEBHOOK_SUFFIX}" not in await entries(objects)

        async def told() -> dict[str, Any] | None:
            condition = await ready(objects, typo)
            return condition if condition and condition["reason"] == "KindNotServed" else None

        condition = await wait_for(told, "the unserved kind to be told")
        assert condition["status"] == "False"
        assert "serves no resource configmap" in condition["message"]
        assert f"{typo}{OBJECT_WEBHOOK_SUFFIX}" in await entries(objects)
    finally:
        for name in (classes, typo):
            await fence.kubectl("delete", "fencepolicy", name, "--ignore-not-found", check=False)


async def test_the_harness_policy_keeps_a_number_like_selector_value_a_string(
    objects: Objects,
) -> None:
    """Regression: a selector value that looks like a number to kubectl's YAML (``01835740``,
    a random suffix all in digits) made the harness's policy invalid, failing the module."""
    out = await objects.fence.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=policy("digits", CM, "01835740"), check=False
    )
    assert out.returncode == 0, out.stderr
