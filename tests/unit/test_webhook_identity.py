"""Who writes: the service-account username is parsed whole or not trusted (issue 31)."""

from __future__ import annotations

import pytest

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.webhook.reviews import POD_NAME_EXTRA, parse_identity

from .reviews import NS, answer, art, checker, grant, review


def _user(username: str) -> dict[str, object]:
    return {"username": username, "extra": {POD_NAME_EXTRA: ["pod-a"]}}


@pytest.mark.parametrize(
    "username",
    [
        "system:serviceaccount:elsewhere:pub:x",  # a third part once skipped the namespace check
        "system:serviceaccount:elsewhere",
        "system:serviceaccount::pub",
        "system:serviceaccount:Elsewhere:pub",
        "system:serviceaccount:elsewhere:",
    ],
)
async def test_a_username_the_parser_cannot_read_is_no_pod(username: str) -> None:
    identity = parse_identity(_user(username))
    assert not identity.is_pod and identity.pod_namespace is None
    store = AsyncMemoryStore()
    t = grant(store, "pod-a")  # the grant's holder is the Pod the extra names
    ok, msg = answer(
        await checker(store, allow_non_pod=False).review(
            review("CREATE", art(t), user=_user(username))
        )
    )
    assert not ok and msg.startswith("holder_mismatch"), msg
    assert "not a Pod-bound service-account token" in msg


async def test_a_pod_of_another_namespace_is_refused() -> None:
    identity = parse_identity(_user("system:serviceaccount:elsewhere:pub"))
    assert identity.is_pod and identity.pod_namespace == "elsewhere"
    store = AsyncMemoryStore()
    t = grant(store, "pod-a")
    ok, msg = answer(
        await checker(store, allow_non_pod=False).review(
            review("CREATE", art(t), user=_user("system:serviceaccount:elsewhere:pub"))
        )
    )
    assert not ok and "is not in the namespace" in msg, msg
    ok, msg = answer(
        await checker(store, allow_non_pod=False).review(
            review("CREATE", art(t), user=_user(f"system:serviceaccount:{NS}:pub"))
        )
    )
    assert ok, msg
