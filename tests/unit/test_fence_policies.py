"""FencePolicies: what may be declared (the blast radius) and the webhook entries they become."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from fencedlease.authority import fencepolicy
from fencedlease.authority.fencepolicy import Declared
from fencedlease.kube import Invalid
from fencedlease.registration import fencepolicies, loosenings
from fencedlease.registration.selfregistration import refused_entries, without_entries


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


def test_each_policy_has_a_scale_entry_without_object_selector() -> None:
    """docs/fenced-objects.md, "Scale writes": a Scale carries no labels, so its entry has no
    objectSelector (the webhook reads the parent); same namespaces, target and failure policy."""
    declared = Declared("apps", (("", "configmaps"), ("apps", "deployments")))
    main = fencepolicies.object_webhook(declared, FENCE, 5, "team-a")
    hook = fencepolicies.scale_webhook(declared, FENCE, 5, "team-a")
    assert hook["name"] == "apps.scale.fencedlease.io"
    assert hook["objectSelector"] == {}
    assert hook["namespaceSelector"] == main["namespaceSelector"]
    assert hook["clientConfig"] == main["clientConfig"]
    assert hook["failurePolicy"] == "Fail"
    assert [(r["apiGroups"], r["operations"], r["resources"]) for r in hook["rules"]] == [
        ([""], ["UPDATE"], ["configmaps/scale"]),
        (["apps"], ["UPDATE"], ["deployments/scale"]),
    ]
    assert "deployments/scale" not in main["rules"][1]["resources"]
    # only Pod-bound writers are sent: everyone else is admitted without a look anyway
    (condition,) = hook["matchConditions"]
    assert "authentication.kubernetes.io/pod-name" in condition["expression"]
    assert "matchConditions" not in main
    assert fencepolicies.is_object_webhook(hook)
    # entry names map back to their policy, also for a policy named like a scale entry
    assert fencepolicies.policy_of_entry("apps.scale.fencedlease.io") == "apps"
    assert fencepolicies.policy_of_entry("a.scale.objects.fencedlease.io") == "a.scale"


def test_object_webhooks_are_replaced_and_the_fence_webhook_kept() -> None:
    live: dict[str, Any] = {
        "metadata": {"name": "x"},
        "webhooks": [
            {"name": loosenings.WEBHOOK_NAME, "clientConfig": {**FENCE, "caBundle": "Q0E="}},
            {"name": "old.objects.fencedlease.io", "clientConfig": FENCE},
        ],
    }
    wanted = fencepolicies.object_webhooks(
        {"apps": Declared("apps", (("", "configmaps"),)), "bad": "refused"}, FENCE, 5, None
    )
    assert fencepolicies.objects_differ(live, wanted)
    out = fencepolicies.with_object_webhooks(live, wanted)
    assert [w["name"] for w in out["webhooks"]] == [
        loosenings.WEBHOOK_NAME,
        "apps.objects.fencedlease.io",
        "apps.scale.fencedlease.io",
    ]
    assert out["webhooks"][1]["clientConfig"]["caBundle"] == "Q0E="
    assert not fencepolicies.objects_differ(out, wanted)
    # the guard's rules for the fence webhook do not see the object webhooks
    assert loosenings.fence_webhook(out) == live["webhooks"][0]


def _configuration(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"webhooks": [{"name": loosenings.WEBHOOK_NAME, "clientConfig": FENCE}, *entries]}


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
        assert fencepolicies.objects_differ(_configuration(changed, asked[1]), asked), field
        assert fencepolicies.altered(_configuration(changed, asked[1]), asked, {}) == {
            name: f"{field} changed"
        }, field
    # rules narrowed, or the entry removed, while the policy asks the same as before
    narrowed = {**asked[0], "rules": []}
    assert fencepolicies.altered(_configuration(narrowed, asked[1]), asked, before) == {
        name: "rules changed"
    }
    assert fencepolicies.altered(_configuration(asked[1]), asked, before) == {name: "removed"}
    # the scale entry alike: a label selector added to it would let every scale write skip it
    scale = "apps.scale.fencedlease.io"
    selected = {**asked[1], "objectSelector": asked[0]["objectSelector"]}
    assert fencepolicies.altered(_configuration(asked[0], selected), asked, {}) == {
        scale: "objectSelector changed"
    }
    assert fencepolicies.altered(_configuration(asked[0]), asked, before) == {scale: "removed"}
    # its match condition is ours: kept, it is in line; replaced (skip every write), altered
    skipping = {**asked[1], "matchConditions": [{"name": "skip", "expression": "false"}]}
    assert fencepolicies.altered(_configuration(asked[0], skipping), asked, {}) == {
        scale: "matchConditions changed"
    }
    # the policy changed (another kind): following it is not an alteration...
    wider = fencepolicies.object_webhooks(
        {"apps": Declared("apps", (("", "configmaps"), ("", "secrets")))}, FENCE, 5, None
    )
    assert fencepolicies.altered(_configuration(*asked), wider, before) == {}
    # ...nor a new policy, nor a new timeout from Helm, nor a first look (nothing known)
    assert fencepolicies.altered(_configuration(), asked, {}) == {}
    slower = fencepolicies.object_webhooks({"apps": apps}, FENCE, 9, None)
    assert fencepolicies.altered(_configuration(*asked), slower, before) == {}
    assert fencepolicies.altered(_configuration(narrowed, asked[1]), asked, {}) == {}


_NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
CM = [{"apiGroup": "", "resources": ["configmaps"]}]


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"bad key!": "x"}},
        {"matchLabels": {"team": "bad value!"}},
        {"matchLabels": {"Example.com/team": "a"}},  # prefix must be lowercase
        {"matchLabels": {"/team": "a"}},
        {"matchLabels": {"t" * 64: "a"}},
        {"matchLabels": {"team": "v" * 64}},
        {"matchLabels": {"team": 5}},
        {"matchLabels": ["team"]},
        {"matchExpressions": [{"key": "bad key!", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "team", "operator": "In"}]},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": []}]},
        {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]},
        {"matchExpressions": [{"key": "team", "operator": "Sometimes"}]},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a b"]}]},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": "a"}]},
        {"matchExpressions": [{"operator": "Exists"}]},
        {"matchExpressions": ["team"]},
        {"matchExpressions": {"key": "team"}},
        ["team"],
    ],
)
def test_a_selector_the_api_server_would_refuse_is_refused(selector: Any) -> None:
    """One such policy once made the whole configuration's update fail (422)."""
    found = fencepolicy.parse(body(CM, namespaceSelector=selector))
    assert isinstance(found, str) and found.startswith("spec.namespaceSelector"), found


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"team": "a", "example.com/tier": "", "a.b_c-d": "A.b_c-9"}},
        {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
        {"matchExpressions": [{"key": "example.com/team", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
        {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["", "b"]}]},
        {},
    ],
)
def test_valid_selectors_are_kept(selector: dict[str, Any]) -> None:
    assert isinstance(fencepolicy.parse(body(CM, namespaceSelector=selector)), Declared)


def _invalid(*fields: str) -> Invalid:
    error = Invalid(status=422, reason="Unprocessable Entity")
    error.body = json.dumps(
        {
            "kind": "Status",
            "details": {
                "causes": [
                    {"reason": "FieldValueInvalid", "message": f"Invalid value: {f}", "field": f}
                    for f in fields
                ]
            },
        }
    ).encode()
    return error


def test_the_entries_a_422_names_are_found_and_only_object_entries() -> None:
    configuration = {
        "webhooks": [
            {"name": "fence.fencedlease.io"},
            {"name": "a.objects.fencedlease.io"},
            {"name": "b.objects.fencedlease.io"},
        ]
    }
    error = _invalid(
        "webhooks[2].namespaceSelector.matchExpressions[0].key",
        "webhooks[0].timeoutSeconds",  # the fence webhook's own: not a policy's fault
        "webhooks[9].name",
        "metadata.name",
    )
    found = refused_entries(configuration, error)
    assert list(found) == ["b.objects.fencedlease.io"]
    assert found["b.objects.fencedlease.io"].startswith(
        "webhooks[2].namespaceSelector.matchExpressions[0].key: Invalid value"
    )
    left = without_entries(configuration, set(found))
    assert [w["name"] for w in left["webhooks"]] == [
        "fence.fencedlease.io",
        "a.objects.fencedlease.io",
    ]
    garbled = _invalid()
    garbled.body = b"not json"
    assert refused_entries(configuration, garbled) == {}


def test_a_cluster_scoped_kind_is_refused_and_an_unserved_one_is_told() -> None:
    watch = fencepolicies.PolicyWatch(api=None)  # type: ignore[arg-type]
    watch.bodies = {
        "classes": body([{"apiGroup": "networking.k8s.io", "resources": ["ingressclasses"]}]),
        "typo": body([{"apiGroup": "", "resources": ["configmap"]}], name="typo"),
        "ok": body(CM, name="ok"),
    }
    watch.scopes = {
        ("networking.k8s.io", "ingressclasses"): "Cluster",
        ("", "configmap"): "Unserved",
        ("", "configmaps"): "Namespaced",
    }
    found = watch.policies
    assert isinstance(found["classes"], str)
    assert "ingressclasses.networking.k8s.io is cluster-scoped" in found["classes"]
    assert isinstance(found["typo"], Declared) and isinstance(found["ok"], Declared)
    note = watch.unserved(found["typo"])
    assert note is not None and "serves no resource configmap" in note
    status = fencepolicies.ready_condition(found["typo"], None, {}, _NOW, note)
    assert status.conditions[0].status == "False"
    assert status.conditions[0].reason == "KindNotServed"
    assert watch.unserved(found["ok"]) is None
    refused = fencepolicies.ready_condition(found["classes"], None, {}, _NOW)
    assert (refused.conditions[0].status, refused.conditions[0].reason) == ("False", "Refused")


def test_a_policy_the_api_server_refused_stays_refused_until_it_changes() -> None:
    watch = fencepolicies.PolicyWatch(api=None)  # type: ignore[arg-type]
    watch.bodies = {"a": body(CM, name="a")}
    watch.reject("a", "webhooks[1].namespaceSelector: Invalid value")
    found = watch.policies["a"]
    assert isinstance(found, str) and "API server refused its webhook entry" in found
    changed = body(CM, name="a")
    changed["metadata"]["generation"] = 4
    changed["generation"] = 4
    watch.bodies = {"a": changed}
    assert isinstance(watch.policies["a"], Declared)
