"""Which stored objects move a lease's mark (controller/objects.py, docs/fenced-objects.md):
only fenced ones, of a declared kind in a namespace the declaring policy selects."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fencedlease.authority import fencepolicy
from fencedlease.controller.objects import Commit, DeclaredKinds
from fencedlease.registration import fencepolicies


def policy(name: str, resources: list[dict[str, Any]], selector: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": resources}
    if selector is not None:
        spec["namespaceSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def kinds(*bodies: dict[str, Any], served: str | None = None) -> DeclaredKinds:
    found = DeclaredKinds(None, None, served)  # type: ignore[arg-type]
    found.policies = {str(b["metadata"]["name"]): fencepolicy.parse(b) for b in bodies}
    return found


CONFIGMAPS = {"apiGroup": "", "resources": ["configmaps"]}
SECRETS = {"apiGroup": "", "resources": ["secrets"]}


def test_an_unselected_namespace_or_undeclared_kind_is_not_fenced() -> None:
    declared = kinds(
        policy("team", [CONFIGMAPS, SECRETS], {"matchLabels": {"team": "pay"}}),
        policy("all", [{"apiGroup": "apps", "resources": ["deployments"]}]),
    )
    assert declared.fenced(("", "secrets"), "pay", {"team": "pay"})
    assert not declared.fenced(("", "secrets"), "other", {"team": "web"})
    assert not declared.fenced(("", "secrets"), "other", {})
    # a kind only another policy declares, for every namespace
    assert declared.fenced(("apps", "deployments"), "other", {})
    assert not declared.fenced(("apps", "statefulsets"), "pay", {"team": "pay"})


def test_expressions_bad_selectors_and_the_served_namespace() -> None:
    declared = kinds(
        policy("x", [CONFIGMAPS], {"matchExpressions": [{"key": "t", "operator": "Exists"}]}),
        policy("bad", [SECRETS], {"matchExpressions": [{"key": "t", "operator": "Bogus"}]}),
        served="mine",
    )
    assert declared.fenced(("", "configmaps"), "mine", {"t": "1"})
    assert not declared.fenced(("", "configmaps"), "mine", {})
    assert not declared.fenced(("", "configmaps"), "theirs", {"t": "1"})
    assert not declared.fenced(("", "secrets"), "mine", {"t": "1"})


def test_a_stored_token_is_parsed_as_strictly_as_a_request_token() -> None:
    def stored(raw: str) -> dict[str, Any]:
        meta = {
            "name": "x",
            "namespace": "n",
            "labels": {"fencedlease.io/lease": "l"},
            "annotations": {"fencedlease.io/token": raw},
        }
        return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}

    for bad in ("²", "05", "0", "-1", "9223372036854775808", "٣"):
        assert Commit.from_object(stored(bad)) is None, bad
    found = Commit.from_object(stored("42"))
    assert found is not None and found.token == 42


async def test_one_policy_watch_feeds_the_declared_kinds_and_refused_policies_declare_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process's one FencePolicy watch (registration/fencepolicies.py) tells the declared
    kinds' watches what each policy declares: a policy refused by discovery (a cluster-scoped
    kind) or by the API server (its entry) declares nothing, so its kinds are not watched."""

    async def scope(_: Any, group: str, resource: str) -> str:
        return "Cluster" if resource == "ingressclasses" else "Namespaced"

    async def watching(self: DeclaredKinds, kind: tuple[str, str]) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(fencepolicies, "resource_scope", scope)
    monkeypatch.setattr(DeclaredKinds, "_watch", watching)
    watch = fencepolicies.PolicyWatch(api=None)  # type: ignore[arg-type]
    declared = DeclaredKinds(None, None)  # type: ignore[arg-type]
    watch.follow(declared.declare)
    assert declared.kinds() == frozenset()  # nothing told before the list is complete
    for item in (
        policy("cm", [CONFIGMAPS]),
        policy("classes", [{"apiGroup": "networking.k8s.io", "resources": ["ingressclasses"]}]),
        policy("secrets", [SECRETS]),
    ):
        await watch._changed({"type": None, "object": item})
    await watch._listed(None, {("", "cm"), ("", "classes"), ("", "secrets")})
    assert declared.kinds() == {("", "configmaps"), ("", "secrets")}
    assert set(declared.watches) == {("", "configmaps"), ("", "secrets")}
    assert not declared.fenced(("networking.k8s.io", "ingressclasses"), "n", {})

    watch.reject("secrets", "webhooks[2].namespaceSelector: Invalid value")
    assert declared.kinds() == {("", "configmaps")}
    assert set(declared.watches) == {("", "configmaps")}
    assert not declared.fenced(("", "secrets"), "n", {})

    await watch._changed({"type": "DELETED", "object": policy("cm", [CONFIGMAPS])})
    assert declared.kinds() == frozenset() and declared.watches == {}
    await asyncio.sleep(0)  # the cancelled watches end
