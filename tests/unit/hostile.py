"""What the hostile-review tests share (test_webhook_hostile.py, test_webhook_fuzz.py): the
codes a refusal may state, JSON-like values with any code point, a field replaced at a path,
and the check every answer passes."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

CODES = frozenset(
    {
        "applied",
        "unchanged",
        "duplicate",
        "stale_fence",
        "unknown_token",
        "lease_mismatch",
        "holder_mismatch",
        "invalid",
    }
)
"""What a refusal's message may start with: never ``unavailable`` with a healthy store."""

# Text with any code point, unpaired surrogates included (category Cs).
text = st.text(st.characters(codec=None, categories=None), max_size=12)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_like = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)


def mutate(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of ``body`` with ``value`` at ``path`` (keys and list indexes); a key on the way
    that holds no object or list is made an object."""
    out = copy.deepcopy(body)
    node: Any = out
    for key in path[:-1]:
        if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


def check_reply(reply: dict[str, Any]) -> None:
    """A well-formed AdmissionReview, JSON-encodable whatever came in (no UnicodeEncodeError
    downstream), whose refusal states one of :data:`CODES`."""
    json.dumps(reply)
    response = reply["response"]
    assert isinstance(response["uid"], str) and isinstance(response["allowed"], bool)
    if not response["allowed"]:
        message = response["status"]["message"]
        assert message.split(":", 1)[0] in CODES, message
