"""The guard's rules (pure): what Helm, Argo CD or Flux may change stands; what opens an
unfenced path is reverted, field by field, and put back when it becomes safe."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fencedlease.registration import loosenings
from fencedlease.registration.loosenings import NAME_LABEL, Coverage

from .reviews import FENCE_RULES

TARGET = {"service": {"name": "w", "namespace": "n", "path": "/fence", "port": 443}}
SERVED = Coverage("team-a", TARGET)
EVERYWHERE = Coverage(None, TARGET)


RULES = FENCE_RULES


def configuration(**changes: Any) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "name": "fence.fencedlease.io",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {**copy.deepcopy(TARGET), "caBundle": "AAA"},
        "rules": copy.deepcopy(RULES),
        "failurePolicy": "Fail",
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": 5,
        "namespaceSelector": {"matchLabels": {NAME_LABEL: "team-a"}},
        "objectSelector": {},
    }
    webhook.update(changes)
    return {
        "metadata": {"name": "cfg", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
        "webhooks": [webhook],
    }


def by_name(*names: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": NAME_LABEL, "operator": "In", "values": list(names)}]}


@pytest.mark.parametrize(
    "change",
    [
        {"timeoutSeconds": 2},
        {"clientConfig": {**TARGET, "caBundle": "BBB"}},  # CA rotation
        {"namespaceSelector": by_name("team-a", "team-b")},  # wider
        {"namespaceSelector": {}},  # every namespace
        {
            "rules": [
                {
                    "apiGroups": ["*"],
                    "apiVersions": ["*"],
                    "operations": ["*"],
                    "resources": ["*", "*/*"],
                    "scope": "*",
                }
            ]
        },
        {
            "rules": [
                {
                    "apiGroups": ["fencedlease.io"],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"],
                    "resources": [
                        "fencedartifacts",
                        "fencedartifacts/*",
                        "fencedreleases",
                        "fencedclaims",
                    ],
                }
            ]
        },
        {"sideEffects": "None", "reinvocationPolicy": "IfNeeded"},
    ],
)
def test_what_the_owner_may_change_stands(change: dict[str, Any]) -> None:
    live = configuration(**change)
    before = copy.deepcopy(live)
    assert loosenings.loosenings(loosenings.fence_webhook(live), SERVED) == {}
    assert loosenings.repaired(live, configuration(), SERVED) is None
    assert live == before  # pure


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"failurePolicy": "Ignore"}, "failurePolicy"),
        ({"rules": []}, "rules"),
        (
            {
                "rules": [
                    {
                        "apiGroups": ["fencedlease.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["fencedartifacts"],
                    }
                ]
            },
            "rules",
        ),  # status writes no longer fenced
        (
            {
                "rules": [
                    {
                        "apiGroups": ["fencedlease.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["CREATE"],
                        "resources": ["*", "*/*"],
                    }
                ]
            },
            "rules",
        ),
        (
            {
                "rules": [
                    {
                        "apiGroups": ["fencedlease.io"],
                        "apiVersions": ["v1alpha1"],
                        "operations": ["*"],
                        "resources": ["*"],
                        "scope": "Cluster",
                    }
                ]
            },
            "rules",
        ),
        ({"namespaceSelector": {"matchLabels": {NAME_LABEL: "team-b"}}}, "namespaceSelector"),
        (
            {"namespaceSelector": {"matchLabels": {NAME_LABEL: "team-a", "env": "prod"}}},
            "namespaceSelector",
        ),  # anyone who can label the namespace opens it
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]
                }
            },
            "namespaceSelector",
        ),
        ({"objectSelector": {"matchLabels": {"fenced": "yes"}}}, "objectSelector"),
        ({"matchConditions": [{"name": "skip", "expression": "false"}]}, "matchConditions"),
        (
            {"clientConfig": {"url": "https://evil.example/allow", "caBundle": "AAA"}},
            "clientConfig",
        ),
        ({"rules": "fencedartifacts"}, "rules"),  # hostile shapes are loosenings, not crashes
        ({"namespaceSelector": ["team-a"]}, "namespaceSelector"),
    ],
)
def test_each_loosening_is_reverted_alone(change: dict[str, Any], field: str) -> None:
    good = configuration()
    live = configuration(timeoutSeconds=9, **change)  # the owner's timeout change rides along
    why = loosenings.loosenings(loosenings.fence_webhook(live), SERVED)
    assert set(why) == {field}
    fix = loosenings.repaired(live, good, SERVED)
    assert fix is not None and set(fix.reverted) == {field}
    webhook = loosenings.fence_webhook(fix.configuration)
    assert webhook is not None
    assert loosenings.loosenings(webhook, SERVED) == {}
    assert webhook["timeoutSeconds"] == 9  # not reverted
    assert fix.configuration["metadata"]["labels"] == good["metadata"]["labels"]
    recorded = json.loads(
        fix.configuration["metadata"]["annotations"][loosenings.REVERTED_ANNOTATION]
    )
    assert recorded == {field: change[field]}


def test_without_a_safe_configuration_the_narrowest_safe_value_is_written() -> None:
    live = configuration(failurePolicy="Ignore", namespaceSelector={}, objectSelector=None)
    fix = loosenings.repaired(live, None, SERVED)
    assert fix is not None
    webhook = loosenings.fence_webhook(fix.configuration)
    assert webhook is not None and webhook["failurePolicy"] == "Fail"
    # {} covers team-a: not a loosening, left as the owner set it.
    assert webhook["namespaceSelector"] == {}


def test_a_missing_fence_webhook_is_put_back_from_the_last_safe_configuration() -> None:
    live = configuration()
    live["webhooks"] = [{"name": "other.example.com"}]
    fix = loosenings.repaired(live, configuration(), SERVED)
    assert fix is not None
    assert [w["name"] for w in fix.configuration["webhooks"]] == [
        "other.example.com",
        "fence.fencedlease.io",
    ]
    assert loosenings.repaired(live, None, SERVED) is None  # nothing known to restore it from


@pytest.mark.parametrize(
    ("selector", "namespace", "covers"),
    [
        (None, None, True),
        ({}, None, True),
        ({"matchExpressions": [{"key": NAME_LABEL, "operator": "Exists"}]}, None, True),
        ({"matchLabels": {NAME_LABEL: "a"}}, None, False),
        ({"matchLabels": {NAME_LABEL: "a"}}, "a", True),
        ({"matchLabels": {NAME_LABEL: "a"}}, "b", False),
        (by_name("a", "b"), "b", True),
        (by_name("a"), None, False),
        (
            {"matchExpressions": [{"key": NAME_LABEL, "operator": "NotIn", "values": ["x"]}]},
            None,
            False,
        ),
        ({"matchExpressions": [{"key": NAME_LABEL, "operator": "DoesNotExist"}]}, "a", False),
        ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, "a", False),
        ({"matchExpressions": "oops"}, "a", False),
    ],
)
def test_selector_coverage(selector: Any, namespace: str | None, covers: bool) -> None:
    assert loosenings.selector_covers(selector, namespace) is covers


def test_a_narrowing_reverted_by_the_previous_controller_is_put_back_by_the_next() -> None:
    """helm upgrade --set watchNamespace=team-a: the cluster-wide controller still running
    reverts the narrowed selector; the controller that serves only team-a puts it back."""
    good = configuration(namespaceSelector={})
    narrowed = configuration(namespaceSelector={"matchLabels": {NAME_LABEL: "team-a"}})
    fix = loosenings.repaired(narrowed, good, EVERYWHERE)
    assert fix is not None
    assert loosenings.fence_webhook(fix.configuration)["namespaceSelector"] == {}  # type: ignore[index]
    assert loosenings.reapplied(fix.configuration, EVERYWHERE) is None  # still unsafe for it
    back = loosenings.reapplied(fix.configuration, SERVED)
    assert back is not None
    assert loosenings.fence_webhook(back)["namespaceSelector"] == {  # type: ignore[index]
        "matchLabels": {NAME_LABEL: "team-a"}
    }
    assert loosenings.REVERTED_ANNOTATION not in back["metadata"]["annotations"]


def test_a_reverted_loosening_is_never_put_back() -> None:
    fix = loosenings.repaired(configuration(failurePolicy="Ignore"), configuration(), SERVED)
    assert fix is not None
    assert loosenings.reapplied(fix.configuration, SERVED) is None
    assert loosenings.reapplied(fix.configuration, EVERYWHERE) is None
    hostile = configuration()
    hostile["metadata"]["annotations"] = {
        loosenings.REVERTED_ANNOTATION: json.dumps({"clientConfig": {"url": "https://evil"}})
    }
    assert loosenings.reapplied(hostile, SERVED) is None  # a target never comes from annotations
    hostile["metadata"]["annotations"][loosenings.REVERTED_ANNOTATION] = "{not json"
    assert loosenings.reverted_values(hostile) == {}


def routed(**changes: Any) -> dict[str, Any]:
    """A configuration routed by path: the fence webhook (artifacts) and one entry each for
    releases and claims; ``changes``: ``{entry name: {field: value}}``."""
    out = configuration(rules=copy.deepcopy(RULES[:1]))
    fence = out["webhooks"][0]
    for name, path, rule in (
        (loosenings.RELEASE_WEBHOOK_NAME, "/fence-release", RULES[1]),
        (loosenings.CLAIM_WEBHOOK_NAME, "/fence-claim", RULES[2]),
    ):
        entry = copy.deepcopy(fence)
        entry.update(name=name, rules=[copy.deepcopy(rule)])
        entry["clientConfig"]["service"]["path"] = path
        out["webhooks"].append(entry)
    for webhook in out["webhooks"]:
        webhook.update(changes.get(webhook["name"], {}))
    return out


def test_a_routed_configuration_is_safe_and_so_is_one_written_by_0_2() -> None:
    assert loosenings.configuration_loosenings(routed(), SERVED) == {}
    assert loosenings.configuration_loosenings(configuration(), SERVED) == {}  # one entry, /fence
    assert loosenings.repaired(configuration(), configuration(), SERVED) is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"failurePolicy": "Ignore"}, "failurePolicy"),
        ({"rules": copy.deepcopy(RULES[:1])}, "rules"),
        ({"objectSelector": {"matchLabels": {"x": "y"}}}, "objectSelector"),
        ({"clientConfig": {**copy.deepcopy(TARGET), "caBundle": "AAA"}}, "clientConfig"),  # /fence
    ],
)
def test_a_loosened_release_or_claim_entry_is_reverted(change: dict[str, Any], field: str) -> None:
    for name in (loosenings.RELEASE_WEBHOOK_NAME, loosenings.CLAIM_WEBHOOK_NAME):
        live = routed(**{name: change})
        fix = loosenings.repaired(live, routed(), SERVED)
        assert fix is not None and set(fix.reverted) == {f"{name}:{field}"}
        assert loosenings.configuration_loosenings(fix.configuration, SERVED) == {}
        assert fix.configuration["webhooks"] == routed()["webhooks"]


def test_a_missing_release_entry_is_put_back_or_made_from_the_fence_webhook() -> None:
    live = routed()
    live["webhooks"] = [w for w in live["webhooks"] if w["name"] != loosenings.RELEASE_WEBHOOK_NAME]
    for good in (routed(), None):
        fix = loosenings.repaired(live, good, SERVED)
        assert fix is not None and set(fix.why) == {f"{loosenings.RELEASE_WEBHOOK_NAME}:webhook"}
        made = loosenings.entry_webhook(fix.configuration, loosenings.RELEASE_WEBHOOK_NAME)
        assert (
            made == loosenings.entry_webhook(routed(), loosenings.RELEASE_WEBHOOK_NAME)
            or good is None
        )
        assert made is not None and made["clientConfig"]["service"]["path"] == "/fence-release"
        assert loosenings.configuration_loosenings(fix.configuration, SERVED) == {}


@pytest.mark.parametrize(
    "rules",
    [
        copy.deepcopy(RULES[:2]),
        [RULES[0], RULES[2]],
        [RULES[0], RULES[1], {**RULES[2], "operations": ["CREATE"]}],
    ],
)
def test_an_old_single_entry_that_stops_covering_releases_or_claims_gets_their_entry(
    rules: list[dict[str, Any]],
) -> None:
    """Without them, a release or a claim would not be checked as coming from its Pod."""
    live = configuration(rules=rules)
    assert (
        loosenings.loosenings(loosenings.fence_webhook(live), SERVED) == {}
    )  # artifacts still are
    fix = loosenings.repaired(live, configuration(), SERVED)
    assert fix is not None
    assert loosenings.configuration_loosenings(fix.configuration, SERVED) == {}
    added = [w["name"] for w in fix.configuration["webhooks"][1:]]
    assert added and set(added) <= {loosenings.RELEASE_WEBHOOK_NAME, loosenings.CLAIM_WEBHOOK_NAME}
