"""When a webhook configuration fences every FencedArtifact write: the guard's rules (pure).

The guard (:mod:`fencedlease.webhook.guard`) does not pin the configuration to a snapshot:
Helm, Argo CD or Flux may change it freely as long as it still sends every FencedArtifact
CREATE and UPDATE (spec and status) in every namespace the operator serves to the fence
webhook and fails closed. What breaks that is a *loosening*, and only loosenings are reverted
(``docs/operations.md``, "The webhook-configuration guard"):

- ``failurePolicy`` other than ``Fail`` (a webhook outage would let writes through);
- ``rules`` that no longer cover ``fencedartifacts`` and ``fencedartifacts/status`` for CREATE
  and UPDATE, ``fencedreleases`` for CREATE and ``fencedclaims`` for CREATE and DELETE in
  ``fencedlease.io/v1alpha1`` (wildcards count): without the last two, a holder's release or a
  worker's claim would not be checked as coming from its Pod;
- a ``namespaceSelector`` that can exclude a served namespace: it may only use the
  ``kubernetes.io/metadata.name`` label, which the API server sets and nobody can change, and
  must select the served namespace (every namespace, for a cluster-wide operator);
- any ``objectSelector`` or ``matchConditions`` (a writer could label or shape its object
  out of the fence);
- a ``clientConfig`` that calls somewhere else (``caBundle`` may change: CA rotation);
- the fence webhook missing from the configuration.

Everything else (``timeoutSeconds``, ``caBundle``, labels, annotations, other webhooks, a
wider selector) is the owner's to change.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fencedlease.models import ARTIFACTS, CLAIMS, GROUP, RELEASES, VERSION

WEBHOOK_NAME = "fence.fencedlease.io"
NAME_LABEL = "kubernetes.io/metadata.name"
REQUIRED_RESOURCES = (ARTIFACTS, f"{ARTIFACTS}/status")
REQUIRED_OPERATIONS = ("CREATE", "UPDATE")
REQUIRED_RULES = (
    (REQUIRED_RESOURCES, REQUIRED_OPERATIONS),
    ((RELEASES,), ("CREATE",)),
    ((CLAIMS,), ("CREATE", "DELETE")),
)
"""Each resource group and the operations the fence webhook must see of it."""
GUARDED = (
    "clientConfig",
    "rules",
    "failurePolicy",
    "namespaceSelector",
    "objectSelector",
    "matchConditions",
)
"""The webhook fields a loosening can change (and a repair may write)."""
REVERTED_ANNOTATION = "fencedlease.io/guard-reverted"
"""On the configuration: the values the guard last reverted, as JSON ``{field: value}``.
A guard that finds them safe under its own settings re-applies them (see :func:`reapplied`)."""


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the configuration must cover: the served namespace (``None``: every namespace),
    and where the webhook must call (``clientConfig`` without ``caBundle``; ``None``: the
    first configuration seen decides)."""

    namespace: str | None = None
    target: Mapping[str, Any] | None = None


def target(client_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where a ``clientConfig`` calls: everything but the CA bundle."""
    out = {k: copy.deepcopy(v) for k, v in (client_config or {}).items() if k != "caBundle"}
    service = out.get("service")
    if isinstance(service, dict):
        service.setdefault("port", 443)  # the API server's default, as stored
    return out


def _requirement_covers(key: Any, operator: Any, values: Any, namespace: str | None) -> bool:
    if key != NAME_LABEL:
        return False  # any other label can be set or removed by whoever owns the namespace
    values = list(values or [])
    if operator == "Exists":
        return True
    if namespace is None:
        return False  # In / NotIn by name leaves some namespace out
    if operator == "In":
        return namespace in values
    if operator == "NotIn":
        return False  # it excludes a namespace today or a new one tomorrow
    return False  # DoesNotExist: matches nothing


def selector_covers(selector: Mapping[str, Any] | None, namespace: str | None) -> bool:
    """Whether ``selector`` selects the served namespace (``None``: every namespace) whatever
    labels anyone gives it."""
    if not isinstance(selector, Mapping):
        return selector is None
    labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(expressions, list):
        return False
    for key, value in labels.items():
        if key != NAME_LABEL or namespace is None or value != namespace:
            return False
    for expression in expressions:
        if not isinstance(expression, Mapping):
            return False
        if not _requirement_covers(
            expression.get("key"), expression.get("operator"), expression.get("values"), namespace
        ):
            return False
    return True


def _resource_matches(patterns: list[Any], resource: str) -> bool:
    main, _, sub = resource.partition("/")
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        p_main, _, p_sub = pattern.partition("/")
        if not sub and not p_sub and p_main in ("*", main):
            return True
        if sub and p_sub in ("*", sub) and p_main in ("*", main):
            return True
    return False


def rules_cover(rules: Any) -> bool:
    """Whether some rule matches each required resource and operation."""
    if not isinstance(rules, list):
        return False
    for resources, operations in REQUIRED_RULES:
        for resource in resources:
            for operation in operations:
                if not any(_rule_matches(rule, resource, operation) for rule in rules):
                    return False
    return True


def _rule_matches(rule: Any, resource: str, operation: str) -> bool:
    if not isinstance(rule, Mapping):
        return False

    def has(field: str, wanted: str) -> bool:
        values = rule.get(field) or []
        return isinstance(values, list) and (wanted in values or "*" in values)

    return (
        has("apiGroups", GROUP)
        and has("apiVersions", VERSION)
        and has("operations", operation)
        and _resource_matches(list(rule.get("resources") or []), resource)
        and rule.get("scope") in (None, "*", "Namespaced")
    )


def fence_webhook(configuration: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The fence webhook's entry in a configuration (``None``: not there)."""
    for webhook in (configuration or {}).get("webhooks") or []:
        if isinstance(webhook, dict) and webhook.get("name") == WEBHOOK_NAME:
            return webhook
    return None


def loosenings(webhook: Mapping[str, Any] | None, coverage: Coverage) -> dict[str, str]:
    """Each guarded field of ``webhook`` that opens an unfenced path, with why (empty: none)."""
    if webhook is None:
        return {"webhook": f"the {WEBHOOK_NAME} webhook is missing"}
    found: dict[str, str] = {}
    if webhook.get("failurePolicy", "Fail") != "Fail":
        found["failurePolicy"] = f"failurePolicy is {webhook.get('failurePolicy')}, not Fail"
    if not rules_cover(webhook.get("rules")):
        found["rules"] = "rules no longer cover " + "; ".join(
            f"{', '.join(resources)} for {' and '.join(operations)}"
            for resources, operations in REQUIRED_RULES
        )
    if not selector_covers(webhook.get("namespaceSelector"), coverage.namespace):
        served = coverage.namespace or "every namespace"
        found["namespaceSelector"] = f"namespaceSelector can exclude {served}"
    if _non_empty(webhook.get("objectSelector")):
        found["objectSelector"] = "an objectSelector lets a writer label its object out"
    if webhook.get("matchConditions"):
        found["matchConditions"] = "matchConditions can skip writes"
    if coverage.target is not None and target(webhook.get("clientConfig")) != target(
        coverage.target
    ):
        found["clientConfig"] = "clientConfig calls somewhere else than the fence webhook"
    return found


def _non_empty(selector: Any) -> bool:
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        return True
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def minimum(coverage: Coverage) -> dict[str, Any]:
    """The narrowest safe value of each guarded field (``clientConfig`` only if known)."""
    values: dict[str, Any] = {
        "rules": [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": list(operations),
                "resources": list(resources),
                "scope": "Namespaced",
            }
            for resources, operations in REQUIRED_RULES
        ],
        "failurePolicy": "Fail",
        "namespaceSelector": (
            {"matchLabels": {NAME_LABEL: coverage.namespace}} if coverage.namespace else {}
        ),
        "objectSelector": {},
        "matchConditions": None,
    }
    if coverage.target is not None:
        values["clientConfig"] = copy.deepcopy(dict(coverage.target))
    return values


@dataclass(frozen=True, slots=True)
class Repair:
    """The configuration to write, and what it reverted (field → the value it replaced)."""

    configuration: dict[str, Any]
    reverted: dict[str, Any]
    why: dict[str, str]


def repaired(
    live: Mapping[str, Any], good: Mapping[str, Any] | None, coverage: Coverage
) -> Repair | None:
    """``live`` with each loosened field of the fence webhook set back: to its value in the
    last safe configuration ``good``, or else to :func:`minimum`. ``None``: nothing loosened.

    Only those fields change; everything else of ``live`` (other webhooks, ``timeoutSeconds``,
    ``caBundle``, labels, annotations) stays as its owner set it."""
    out = copy.deepcopy(dict(live))
    webhook = fence_webhook(out)
    why = loosenings(webhook, coverage)
    if not why:
        return None
    known = fence_webhook(good)
    if webhook is None:
        if known is None:
            return None  # nothing known to restore it from
        out.setdefault("webhooks", []).append(copy.deepcopy(known))
        return Repair(_with_reverted(out, {}), {}, why)
    fallback = minimum(coverage)
    reverted: dict[str, Any] = {}
    for field in why:
        value: Any
        if known is not None and field not in loosenings(known, coverage):
            value = copy.deepcopy(known.get(field))
        elif field in fallback:
            value = copy.deepcopy(fallback[field])
        else:
            continue  # e.g. no safe clientConfig known: cannot repair that field
        reverted[field] = copy.deepcopy(webhook.get(field))
        if field == "clientConfig":
            bundle = (webhook.get("clientConfig") or {}).get("caBundle")
            value = dict(value or {})
            if bundle:
                value["caBundle"] = bundle
        if value is None:
            webhook.pop(field, None)
        else:
            webhook[field] = value
    if not reverted:
        return None
    return Repair(_with_reverted(out, reverted), reverted, why)


def _with_reverted(configuration: dict[str, Any], reverted: dict[str, Any]) -> dict[str, Any]:
    metadata = configuration.setdefault("metadata", {})
    annotations = dict(metadata.get("annotations") or {})
    if reverted:
        annotations[REVERTED_ANNOTATION] = json.dumps(reverted, sort_keys=True)
    metadata["annotations"] = annotations
    return configuration


def reverted_values(configuration: Mapping[str, Any]) -> dict[str, Any]:
    """What a guard last reverted on this configuration (empty when nothing or unreadable)."""
    raw = ((configuration.get("metadata") or {}).get("annotations") or {}).get(REVERTED_ANNOTATION)
    if not raw:
        return {}
    try:
        found = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if k in GUARDED}


def reapplied(live: Mapping[str, Any], coverage: Coverage) -> dict[str, Any] | None:
    """``live`` with the values a guard reverted put back, when they are safe under
    ``coverage`` — e.g. ``helm upgrade --set watchNamespace=team-a`` narrowed the selector, the
    previous (cluster-wide) controller reverted it during the rollout, and the new controller,
    which serves only ``team-a``, finds the narrowed selector safe. ``None``: nothing to put
    back (or it would still loosen: then the record stays, for whoever investigates)."""
    values = reverted_values(live)
    webhook = fence_webhook(live)
    if not values or webhook is None or loosenings(webhook, coverage):
        return None
    out = copy.deepcopy(dict(live))
    candidate = fence_webhook(out)
    assert candidate is not None
    for field, value in values.items():
        if field == "clientConfig":
            continue  # where the webhook calls is never taken from an annotation
        if value is None:
            candidate.pop(field, None)
        else:
            candidate[field] = copy.deepcopy(value)
    if loosenings(candidate, coverage) or candidate == webhook:
        return None
    annotations = dict((out.get("metadata") or {}).get("annotations") or {})
    annotations.pop(REVERTED_ANNOTATION, None)
    out.setdefault("metadata", {})["annotations"] = annotations
    return out
