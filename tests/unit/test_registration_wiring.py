"""Which processes watch FencePolicies (registration/wiring.py): one watch, in a process with
a controller (its fenced-object watches follow the declared kinds) or in one that registers
its webhook by URL (its entries); a webhook-only process of the chart watches none."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fencedlease.registration.wiring import needs_policies
from fencedlease.settings import Settings


@pytest.mark.parametrize(
    ("registration", "controller", "webhook", "watches"),
    [
        ("none", True, False, True),  # the chart's controller (guard or not)
        ("none", True, True, True),  # role=all with the chart
        ("none", False, True, False),  # the chart's webhook Deployment: admission only
        ("url", True, True, True),  # local mode (role=all)
        ("url", False, True, True),  # a webhook process registering itself by URL
    ],
)
def test_one_policy_watch_where_a_part_needs_it(
    registration: str, controller: bool, webhook: bool, watches: bool
) -> None:
    settings = Settings(webhook_registration=registration)
    assert needs_policies(settings, controller=controller, webhook=webhook) is watches


def test_fence_policies_are_watched_in_one_place_built_once_per_process() -> None:
    """One FencePolicy watch: only :class:`PolicyWatch` lists and watches the kind (no other
    module of the operator or of local mode names it), and only the composition root builds
    one, once (it feeds the declared kinds and the configuration's keeper)."""
    root = Path(__file__).resolve().parents[2]
    sources = [
        *sorted((root / "operator" / "fencedlease").rglob("*.py")),
        *sorted((root / "local" / "src" / "fencedlease").rglob("*.py")),
    ]
    naming = {
        str(path.relative_to(root))
        for path in sources
        if "FENCE_POLICIES" in path.read_text() or '"fencepolicies"' in path.read_text()
    }
    assert naming == {
        "operator/fencedlease/models.py",
        "operator/fencedlease/registration/fencepolicies.py",
    }
    built = [
        str(path.relative_to(root))
        for path in sources
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "PolicyWatch"
    ]
    assert built == ["operator/fencedlease/app.py"]
