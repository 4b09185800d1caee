"""Which resource kinds a FencePolicy may declare fenced, and what a policy declares (pure).

A FencePolicy (cluster-scoped, ``fencedlease.io/v1alpha1``) lists ``{apiGroup, resources}``
like a webhook rule, and optionally a namespace selector (docs/fenced-objects.md). The CRD's
validation rules refuse the kinds below at ``kubectl apply``; :func:`refusal` is the same list
for the code (a policy stored before a rule existed is reported, never registered).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FORBIDDEN_GROUPS = frozenset(
    {
        "fencedlease.io",  # the fence itself
        "admissionregistration.k8s.io",  # webhook configurations: fencing them can lock all out
        "apiextensions.k8s.io",
        "apiregistration.k8s.io",
        "coordination.k8s.io",  # every Lease: leader election of kube and of the fence
        "rbac.authorization.k8s.io",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "certificates.k8s.io",
        "discovery.k8s.io",  # EndpointSlices copy their Service's labels
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "internal.apiserver.k8s.io",
        "node.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
        "policy",  # PodDisruptionBudgets gate evictions (node drains)
    }
)
"""API groups no FencePolicy may declare: fencing them could wedge the cluster or the fence."""

FORBIDDEN_CORE = frozenset(
    {
        "pods",  # created by controllers from templates that may carry the label
        "nodes",
        "namespaces",
        "events",
        "endpoints",  # copy their Service's labels, written by the endpoints controller
        "bindings",
        "serviceaccounts",
        "persistentvolumes",
        "componentstatuses",
    }
)
"""Core (``""`` group) resources no FencePolicy may declare."""

MAX_POLICY_NAME = 63
"""A policy's webhook is named ``<policy>.objects.fencedlease.io``."""
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_GROUP = re.compile(r"([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*")


def refusal(group: str, resource: str) -> str | None:
    """Why ``resource`` of ``group`` may not be fenced (``None``: it may)."""
    if group in FORBIDDEN_GROUPS:
        return f"API group {group!r} cannot be fenced (it could wedge the cluster or the fence)"
    if group == "" and resource in FORBIDDEN_CORE:
        return f"core resource {resource!r} cannot be fenced (it could wedge the cluster)"
    if group and (len(group) > 253 or not _GROUP.fullmatch(group)):
        return f"apiGroup {group[:80]!r} is not a DNS subdomain (wildcards are not allowed)"
    if not _RESOURCE.fullmatch(resource):
        return (
            f"resource {resource[:80]!r} must be a plural resource name (no wildcard, no "
            "subresource: status and scale are not fenced)"
        )
    return None


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_key_refusal(key: object) -> str | None:
    """Why ``key`` is not a Kubernetes label key (``[prefix/]name``: prefix a DNS subdomain
    of at most 253 characters, name at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both
    ends); ``None``: it is."""
    if not isinstance(key, str):
        return "a label key must be a string"
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return f"label key {key[:80]!r}: its prefix must be a DNS subdomain (at most 253)"
    if not _LABEL_NAME.fullmatch(name):
        return (
            f"label key {key[:80]!r} is not a valid label key (at most 63 of A-Z, a-z, 0-9, "
            "'-', '_', '.', beginning and ending alphanumeric, after an optional prefix/)"
        )
    return None


def label_value_refusal(value: object) -> str | None:
    """Why ``value`` is not a Kubernetes label value (``None``: it is)."""
    if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value):
        shown = value[:80] if isinstance(value, str) else type(value).__name__
        return (
            f"label value {shown!r} is not valid (at most 63 of A-Z, a-z, 0-9, '-', '_', '.', "
            "beginning and ending alphanumeric, or empty)"
        )
    return None


def selector_refusal(selector: object) -> str | None:
    """Why ``selector`` is not a label selector the API server accepts in a webhook's
    ``namespaceSelector`` (the rules of ``metav1.LabelSelector`` validation); ``None``: it
    is. Pure."""
    if not isinstance(selector, Mapping):
        return "must be a label selector (matchLabels, matchExpressions)"
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        return "matchLabels must be a map of label keys to values"
    for key, value in labels.items():
        why = label_key_refusal(key) or label_value_refusal(value)
        if why is not None:
            return f"matchLabels: {why}"
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return "matchExpressions must be a list"
    for index, expression in enumerate(expressions):
        why = _expression_refusal(expression)
        if why is not None:
            return f"matchExpressions[{index}]: {why}"
    return None


def _expression_refusal(expression: object) -> str | None:
    if not isinstance(expression, Mapping):
        return "must be {key, operator, values}"
    why = label_key_refusal(expression.get("key"))
    if why is not None:
        return why
    operator = expression.get("operator")
    if operator not in OPERATORS:
        return f"operator must be one of {', '.join(OPERATORS)}"
    values = expression.get("values") or []
    if not isinstance(values, list):
        return "values must be a list"
    if operator in ("In", "NotIn") and not values:
        return f"values must be non-empty for {operator}"
    if operator in ("Exists", "DoesNotExist") and values:
        return f"values must be empty for {operator}"
    for value in values:
        why = label_value_refusal(value)
        if why is not None:
            return why
    return None


@dataclass(frozen=True, slots=True)
class Declared:
    """What one FencePolicy declares: ``(apiGroup, resource)`` pairs and a namespace selector
    (``{}``: every namespace)."""

    name: str
    resources: tuple[tuple[str, str], ...]
    namespace_selector: dict[str, Any] = field(default_factory=dict)
    generation: int | None = None


def parse(body: Mapping[str, Any]) -> Declared | str:
    """A stored FencePolicy → what it declares, or why it cannot be honoured (pure)."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_POLICY_NAME:
        return f"metadata.name must be at most {MAX_POLICY_NAME} characters"
    spec = body.get("spec")
    if not isinstance(spec, Mapping):
        return "spec is required"
    entries = spec.get("resources")
    if not isinstance(entries, list) or not entries:
        return "spec.resources must list at least one {apiGroup, resources}"
    pairs: list[tuple[str, str]] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            return "spec.resources entries must be objects"
        group = entry.get("apiGroup", "")
        names = entry.get("resources")
        if not isinstance(group, str) or not isinstance(names, list) or not names:
            return "each spec.resources entry needs apiGroup (string) and resources (list)"
        for resource in names:
            if not isinstance(resource, str):
                return "resources must be strings"
            why = refusal(group, resource)
            if why is not None:
                return why
            if (group, resource) not in pairs:
                pairs.append((group, resource))
    selector = spec.get("namespaceSelector") or {}
    why = selector_refusal(selector)
    if why is not None:
        return f"spec.namespaceSelector: {why}"
    generation = meta.get("generation")
    return Declared(
        name,
        tuple(pairs),
        {k: v for k, v in selector.items() if k in ("matchLabels", "matchExpressions") and v},
        generation if isinstance(generation, int) else None,
    )


def declared_kinds(policies: Mapping[str, Declared | str]) -> frozenset[tuple[str, str]]:
    """Every ``(apiGroup, resource)`` some valid policy declares."""
    return frozenset(
        pair
        for found in policies.values()
        if isinstance(found, Declared)
        for pair in found.resources
    )
