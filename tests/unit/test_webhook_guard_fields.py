"""The chart guard restores what could loosen the fence, and lets a Helm upgrade of the
timeout or a CA rotation stand."""

from __future__ import annotations

import copy
from typing import Any

from fencedlease.webhook.guard import with_current_free_fields
from fencedlease.webhook.registration import difference


def configuration(**changes: Any) -> dict[str, Any]:
    webhook = {
        "name": "fence.fencedlease.io",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": "w", "namespace": "n"}, "caBundle": "AAA"},
        "rules": [{"operations": ["CREATE", "UPDATE"], "resources": ["fencedartifacts"]}],
        "failurePolicy": "Fail",
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": 5,
    }
    webhook.update(changes)
    return {"metadata": {"name": "cfg"}, "webhooks": [webhook]}


def test_timeout_and_ca_changes_stand() -> None:
    snapshot = configuration()
    current = configuration(timeoutSeconds=7)
    current["webhooks"][0]["clientConfig"]["caBundle"] = "BBB"
    desired = with_current_free_fields(snapshot, current)
    assert difference(current, desired) is None
    assert snapshot == configuration()  # pure


def test_loosening_is_still_restored() -> None:
    snapshot = configuration()
    for loosened in (
        configuration(failurePolicy="Ignore"),
        configuration(rules=[]),
        configuration(timeoutSeconds=7, failurePolicy="Ignore"),
    ):
        desired = with_current_free_fields(snapshot, copy.deepcopy(loosened))
        assert difference(loosened, desired) is not None
        assert desired["webhooks"][0]["failurePolicy"] == "Fail"
