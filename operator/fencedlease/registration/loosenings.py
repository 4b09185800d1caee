"""When a webhook configuration fences every FencedArtifact write: the guard's rules (pure).

The guard (:mod:`fencedlease.registration.guard`) does not pin the configuration to a snapshot:
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
from urllib.parse import urlsplit, urlunsplit

from fencedlease.models import ARTIFACTS, CLAIMS, GROUP, RELEASES, VERSION

WEBHOOK_NAME = "fence.fencedlease.io"
RELEASE_WEBHOOK_NAME = "release.fencedlease.io"
CLAIM_WEBHOOK_NAME = "claim.fencedlease.io"
NAME_LABEL = "kubernetes.io/metadata.name"
REQUIRED_RESOURCES = (ARTIFACTS, f"{ARTIFACTS}/status")
REQUIRED_OPERATIONS = ("CREATE", "UPDATE")
Rules = tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class Entry:
    """One of the fence's webhook entries: its name, the path it calls on the webhook
    Service, and each resource group and the operations it must see."""

    name: str
    path: str
    rules: Rules

    def webhook_rules(self) -> list[dict[str, Any]]:
        """The entry's ``rules`` as a webhook configuration gives them: one rule per resource
        group, this API group and version, namespaced."""
        return [
            {
                "apiGroups": [GROUP],
                "apiVersions": [VERSION],
                "operations": list(operations),
                "resources": list(resources),
                "scope": "Namespaced",
            }
            for resources, operations in self.rules
        ]


FENCE = Entry(WEBHOOK_NAME, "/fence", ((REQUIRED_RESOURCES, REQUIRED_OPERATIONS),))
RELEASE = Entry(RELEASE_WEBHOOK_NAME, "/fence-release", (((RELEASES,), ("CREATE",)),))
CLAIM = Entry(CLAIM_WEBHOOK_NAME, "/fence-claim", (((CLAIMS,), ("CREATE", "DELETE")),))
ENTRIES = (FENCE, RELEASE, CLAIM)
"""The fence's entries, one per review kind and path (the webhook routes by path)."""
REQUIRED_RULES: Rules = tuple(rule for entry in ENTRIES for rule in entry.rules)
"""Everything the fence must see: what the one entry of an earlier configuration covers."""
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


def rules_cover(rules: Any, required: Rules = FENCE.rules) -> bool:
    """Whether some rule matches each required resource and operation."""
    if not isinstance(rules, list):
        return False
    for resources, operations in required:
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
    return entry_webhook(configuration, WEBHOOK_NAME)


def entry_webhook(configuration: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    """The webhook ``name`` of a configuration (``None``: not there)."""
    for webhook in (configuration or {}).get("webhooks") or []:
        if isinstance(webhook, dict) and webhook.get("name") == name:
            return webhook
    return None


def entry_target(fence_target: Mapping[str, Any] | None, entry: Entry) -> dict[str, Any] | None:
    """Where ``entry`` must call: the fence webhook's target on ``entry``'s path."""
    if fence_target is None:
        return None
    out = copy.deepcopy(dict(fence_target))
    if isinstance(out.get("service"), dict):
        out["service"]["path"] = entry.path
    elif isinstance(out.get("url"), str):
        parts = urlsplit(out["url"])
        out["url"] = urlunsplit(parts._replace(path=entry.path))
    return out


def entry_loosenings(
    configuration: Mapping[str, Any] | None, coverage: Coverage, entry: Entry
) -> dict[str, str]:
    """What opens an unfenced path for ``entry``'s reviews (empty: none). A release or claim
    entry may be missing when the fence webhook covers its rules safely: a configuration
    written before the webhook routed by path, whose one entry sends all three kinds to
    ``/fence`` (answered there until 0.3)."""
    own = entry_webhook(configuration, entry.name)
    if own is None and entry is not FENCE:
        fence = fence_webhook(configuration)
        if (
            fence is not None
            and not loosenings(fence, coverage)
            and rules_cover(fence.get("rules"), entry.rules)
        ):
            return {}
    return loosenings(own, coverage, entry)


def configuration_loosenings(
    configuration: Mapping[str, Any] | None, coverage: Coverage
) -> dict[str, str]:
    """Every entry's loosenings, keyed ``field`` (the fence webhook) or ``<entry>:field``."""
    found: dict[str, str] = {}
    for entry in ENTRIES:
        prefix = "" if entry is FENCE else f"{entry.name}:"
        for field, why in entry_loosenings(configuration, coverage, entry).items():
            found[prefix + field] = why
    return found


def loosenings(
    webhook: Mapping[str, Any] | None, coverage: Coverage, entry: Entry = FENCE
) -> dict[str, str]:
    """Each guarded field of ``webhook`` that opens an unfenced path, with why (empty: none)."""
    if webhook is None:
        return {"webhook": f"the {entry.name} webhook is missing"}
    found: dict[str, str] = {}
    if webhook.get("failurePolicy", "Fail") != "Fail":
        found["failurePolicy"] = f"failurePolicy is {webhook.get('failurePolicy')}, not Fail"
    if not rules_cover(webhook.get("rules"), entry.rules):
        found["rules"] = f"{entry.name} rules no longer cover " + "; ".join(
            f"{', '.join(resources)} for {' and '.join(operations)}"
            for resources, operations in entry.rules
        )
    if not selector_covers(webhook.get("namespaceSelector"), coverage.namespace):
        served = coverage.namespace or "every namespace"
        found["namespaceSelector"] = f"namespaceSelector can exclude {served}"
    if _non_empty(webhook.get("objectSelector")):
        found["objectSelector"] = "an objectSelector lets a writer label its object out"
    if webhook.get("matchConditions"):
        found["matchConditions"] = "matchConditions can skip writes"
    wanted = entry_target(coverage.target, entry)
    if wanted is not None and target(webhook.get("clientConfig")) != target(wanted):
        found["clientConfig"] = f"{entry.name} clientConfig calls somewhere else than {entry.path}"
    return found


def _non_empty(selector: Any) -> bool:
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        return True
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def minimum(coverage: Coverage, entry: Entry = FENCE) -> dict[str, Any]:
    """The narrowest safe value of each guarded field (``clientConfig`` only if known)."""
    values: dict[str, Any] = {
        "rules": entry.webhook_rules(),
        "failurePolicy": "Fail",
        "namespaceSelector": (
            {"matchLabels": {NAME_LABEL: coverage.namespace}} if coverage.namespace else {}
        ),
        "objectSelector": {},
        "matchConditions": None,
    }
    wanted = entry_target(coverage.target, entry)
    if wanted is not None:
        values["clientConfig"] = wanted
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
    """``live`` with each loosened field of the fence's entries set back: to its value in the
    last safe configuration ``good``, or else to :func:`minimum`; a missing entry is put back
    from ``good`` (or, a release or claim entry, made from the fence webhook). ``None``:
    nothing loosened. Keys of ``reverted`` and ``why``: ``field`` for the fence webhook,
    ``<entry>:field`` for the others.

    Only those fields change; everything else of ``live`` (other webhooks, ``timeoutSeconds``,
    ``caBundle``, labels, annotations) stays as its owner set it."""
    out = copy.deepcopy(dict(live))
    reverted: dict[str, Any] = {}
    why: dict[str, str] = {}
    for entry in ENTRIES:
        found = entry_loosenings(out, coverage, entry)
        if not found:
            continue
        prefix = "" if entry is FENCE else f"{entry.name}:"
        fixed = _repair_entry(out, good, coverage, entry, found)
        if fixed is None:
            continue
        why.update({prefix + k: v for k, v in found.items()})
        reverted.update({prefix + k: v for k, v in fixed.items()})
    if not why:
        return None
    recorded = {k: v for k, v in reverted.items() if k in GUARDED}
    return Repair(_with_reverted(out, recorded), reverted, why)


def _repair_entry(
    out: dict[str, Any],
    good: Mapping[str, Any] | None,
    coverage: Coverage,
    entry: Entry,
    why: dict[str, str],
) -> dict[str, Any] | None:
    """Repair ``entry`` in ``out`` in place; what it reverted (``None``: nothing could be)."""
    webhook = entry_webhook(out, entry.name)
    known = entry_webhook(good, entry.name)
    if webhook is None:
        made = known if known is not None else _made_from_fence(out, coverage, entry)
        if made is None:
            return None  # nothing known to restore it from
        out.setdefault("webhooks", []).append(copy.deepcopy(made))
        return {} if entry is FENCE else {"webhook": None}
    fallback = minimum(coverage, entry)
    reverted: dict[str, Any] = {}
    for field in why:
        value: Any
        if known is not None and field not in loosenings(known, coverage, entry):
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
    return reverted or None


def _made_from_fence(
    configuration: Mapping[str, Any], coverage: Coverage, entry: Entry
) -> dict[str, Any] | None:
    """A release or claim entry made from a safe fence webhook (its target on the entry's
    path, the entry's rules); ``None`` for the fence webhook itself or without a safe one."""
    fence = fence_webhook(configuration)
    if entry is FENCE or fence is None or loosenings(fence, coverage):
        return None
    made = copy.deepcopy(fence)
    made["name"] = entry.name
    made.update(minimum(coverage, entry))
    made.pop("matchConditions", None)
    bundle = (fence.get("clientConfig") or {}).get("caBundle")
    config = entry_target(target(fence.get("clientConfig")), entry) or {}
    if bundle:
        config["caBundle"] = bundle
    made["clientConfig"] = config
    return made


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
