"""Which processes watch FencePolicies (registration/wiring.py): one watch, in a process with
a controller (its fenced-object watches follow the declared kinds) or in one that registers
its webhook by URL (its entries); a webhook-only process of the chart watches none."""

from __future__ import annotations

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
