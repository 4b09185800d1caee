"""Fuzzing the fence check: whatever reaches ``/fence``, the answer is a well-formed
AdmissionReview that states a code, is JSON-encodable, and is never ``unavailable`` (with a
healthy store, only a bug could be).  Includes deep nesting and unpaired surrogates."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fencedlease.authority.memory import AsyncMemoryStore
from fencedlease.webhook import reviews

from .hostile import check_reply, json_like, mutate
from .reviews import art, checker, grant, review

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
