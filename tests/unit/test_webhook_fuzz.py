"""Fuzzing the fence check: whatever reaches ``/fence``, the answer is a well-formed
AdmissionReview that states a code, is JSON-encodable, and is never ``unavailable`` (with a
healthy store, only a bug could be).  Includes deep nesting and unpaired surrogates."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.webhook import reviews

from .reviews import art, checker, grant, review

CODES: tuple[str, ...] = (
    "applied",
    "unchanged",
    "duplicate",
    "stale_fence",
    "unknown_token",
    "lease_mismatch",
)
CODES += ("holder_mismatch", "invalid")

# Text with any code point, unpaired surrogates included (category Cs).
text = st.text(st.characters(codec=None, categories=None), max_size=12)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_like = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)
PATHS = [
    ("apiVersion",),
    ("kind",),
    ("request",),
    ("request", "uid"),
    ("request", "operation"),
    ("request", "namespace"),
    ("request", "name"),
    ("request", "subResource"),
    ("request", "resource"),
    ("request", "userInfo"),
    ("request", "object"),
    ("request", "object", "metadata"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "fencingToken"),
    ("request", "object", "spec", "leaseRef"),
    ("request", "object", "spec", "objectRef"),
    ("request", "object", "spec", "operationId"),
    ("request", "oldObject"),
]


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def mutate(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


def check_reply(reply: dict[str, Any]) -> None:
    json.dumps(reply)  # encodable whatever came in (no UnicodeEncodeError downstream)
    response = reply["response"]
    assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
    if not response["allowed"]:
        message = response["status"]["message"]
        assert message.split(":", 1)[0] in CODES, message


STORE = AsyncMemoryStore()
TOKEN = grant(STORE)
BASE = review("UPDATE", art(TOKEN, "new", rv="3"), art(TOKEN - 1, "old", rv="3"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), json_like | st.integers(0, 300).map(nested))
def test_mutated_reviews_always_get_a_coded_answer(path: tuple[str, ...], value: Any) -> None:
    body = mutate(BASE, path, value)
    if reviews.too_deep(body):
        return  # the server answers 400 before the checker sees it (tested below)
    check_reply(asyncio.run(checker(STORE).review(body)))


@settings(max_examples=100, deadline=None)
@given(json_like)
def test_arbitrary_json_is_invalid_not_an_error(body: Any) -> None:
    reply = asyncio.run(checker(STORE).review(body))
    check_reply(reply)
    assert reply["response"]["allowed"] is False


def test_bodies_deeper_than_the_limit_are_refused_before_parsing_their_meaning() -> None:
    assert reviews.too_deep(mutate(BASE, ("request", "object", "spec"), nested(70)))
    assert not reviews.too_deep(mutate(BASE, ("request", "object", "spec"), nested(40)))
