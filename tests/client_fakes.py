"""Test helpers of the client alone (no operator import: ``make test-pythons`` runs the client's
tests in a venv holding only fencedlease-client)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any


def run_plan(steps: Generator[Any, Any, Any], replies: list[Any]) -> tuple[Any, list[Any]]:
    """Run a client plan (``publish.plan``, ``release.plan``, ``claims.plan``) against canned
    replies, one per request (a sleep is answered ``None``, nothing slept); the plan's result
    and every step it took."""
    queue, seen = list(replies), list[Any]()
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value, seen
        seen.append(step)
        answer = None if type(step).__name__ == "Sleep" else queue.pop(0)
