"""FencePolicies: what may be declared (the blast radius) and the webhook entries they become."""

from __future__ import annotations

from typing import Any

import pytest

from fencedlease.authority import fencepolicy
from fencedlease.authority.fencepolicy import Declared
from fencedlease.webhook import fencepolicies, policy


def body(resources: list[dict[str, Any]], name: str = "apps", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": 3}, "spec": {"resources": resources, **spec}}


@pytest.mark.parametrize(
    ("group", "resource"),
    [
        ("", "pods"),
        ("", "namespaces"),
        ("", "nodes"),
        ("", "events"),
        ("coordination.k8s.io", "leases"),
        ("fencedlease.io", "fencedartifacts"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("rbac.authorization.k8s.io", "roles"),
        ("*", "configmaps"),
        ("", "*"),
        ("apps", "deployments/scale"),
    ],
)
def test_kinds_that_could_wedge_the_cluster_are_refused(group: str, resource: str) -> None:
    found = fencepolicy.parse(body([{"apiGroup": group, "resources": [resource]}]))
    assert isinstance(found, str)


def test_a_valid_policy() -> None:
    found = fencepolicy.parse(
        body(
            [
                {"apiGroup": "", "resources": ["configmaps", "secrets"]},
                {"apiGroup": "apps", "resources": ["deployments"]},
            ],
            namespaceSelector={"matchLabels": {"team": "a"}},
        )
    )
    assert found == Declared(
        "apps",
        (("", "configmaps"), ("", "secrets"), ("apps", "deployments")),
        {"matchLabels": {"team": "a"}},
        3,
    )


FENCE = {"service": {"name": "fl-webhook", "namespace": "fl", "path": "/fence", "port": 443}}


def test_each_policy_is_one_label_scoped_webhook_calling_fence_object() -> None:
    declared = Declared("apps", (("", "configmaps"), ("apps", "deployments")))
    hook = fencepolicies.object_webhook(declared, FENCE, 5, "team-a")
    assert hook["name"] == "apps.objects.fencedlease.io"
    assert hook["clientConfig"]["service"]["path"] == "/fence-object"
    assert hook["failurePolicy"] == "Fail"
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "fencedlease.io/lease", "operator": "Exists"}]
    }
    assert hook["namespaceSelector"]["matchExpressions"][-1]["values"] == ["team-a"]
    assert [r["apiGroups"] for r in hook["rules"]] == [[""], ["apps"]]
    assert all(r["operations"] == ["CREATE", "UPDATE", "DELETE"] for r in hook["rules"])
    url = fencepolicies.object_client_config({"url": "https://127.0.0.1:8443/fence"})
    assert url["url"] == "https://127.0.0.1:8443/fence-object"


def test_object_webhooks_are_replaced_and_the_fence_webhook_kept() -> None:
    live: dict[str, Any] = {
        "metadata": {"name": "x"},
        "webhooks": [
            {"name": policy.WEBHOOK_NAME, "clientConfig": {**FENCE, "caBundle": "Q0E="}},
            {"name": "old.objects.fencedlease.io", "clientConfig": FENCE},
        ],
    }
    wanted = fencepolicies.object_webhooks(
        {"apps": Declared("apps", (("", "configmaps"),)), "bad": "refused"}, FENCE, 5, None
    )
    assert fencepolicies.objects_differ(live, wanted)
    out = fencepolicies.with_object_webhooks(live, wanted)
    assert [w["name"] for w in out["webhooks"]] == [
        policy.WEBHOOK_NAME,
        "apps.objects.fencedlease.io",
    ]
    assert out["webhooks"][1]["clientConfig"]["caBundle"] == "Q0E="
    assert not fencepolicies.objects_differ(out, wanted)
    # the guard's rules for the fence webhook do not see the object webhooks
    assert policy.fence_webhook(out) == live["webhooks"][0]


def _configuration(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"webhooks": [{"name": policy.WEBHOOK_NAME, "clientConfig": FENCE}, *entries]}


def test_an_entry_changed_by_someone_else_is_altered_and_one_following_its_policy_is_not() -> None:
    apps = Declared("apps", (("", "configmaps"),))
    asked = fencepolicies.object_webhooks({"apps": apps}, FENCE, 5, None)
    before = {w["name"]: w for w in asked}
    name = "apps.objects.fencedlease.io"
    # in line: nothing altered
    assert fencepolicies.altered(_configuration(*asked), asked, before) == {}
    # failurePolicy, objectSelector, matchConditions: nothing we follow changes them
    for field, value in (
        ("failurePolicy", "Ignore"),
        ("objectSelector", {}),
        ("matchConditions", [{"name": "skip", "expression": "false"}]),
    ):
        changed = {**asked[0], field: value}
        assert fencepolicies.objects_differ(_configuration(changed), asked), field
        assert fencepolicies.altered(_configuration(changed), asked, {}) == {
            name: f"{field} changed"
        }, field
    # rules narrowed, or the entry removed, while the policy asks the same as before
    narrowed = {**asked[0], "rules": []}
    assert fencepolicies.altered(_configuration(narrowed), asked, before) == {name: "rules changed"}
    assert fencepolicies.altered(_configuration(), asked, before) == {name: "removed"}
    # the policy changed (another kind): following it is not an alteration...
    wider = fencepolicies.object_webhooks(
        {"apps": Declared("apps", (("", "configmaps"), ("", "secrets")))}, FENCE, 5, None
    )
    assert fencepolicies.altered(_configuration(*asked), wider, before) == {}
    # ...nor a new policy, nor a new timeout from Helm, nor a first look (nothing known)
    assert fencepolicies.altered(_configuration(), asked, {}) == {}
    slower = fencepolicies.object_webhooks({"apps": apps}, FENCE, 9, None)
    assert fencepolicies.altered(_configuration(*asked), slower, before) == {}
    assert fencepolicies.altered(_configuration(narrowed), asked, {}) == {}
