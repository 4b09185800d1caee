"""Kubernetes API errors are translated once, in the adapter (``kube.py``): every answer outside
2xx becomes a typed error (``NotFound``, ``Conflict``, ``Invalid``, ``Forbidden``, else
``ApiError``), and nothing above the adapters' floor tells outcomes apart by HTTP status
(docs/design.md, the adapters row)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import kube

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "fencedlease"

LOOPS_LEFT: set[str] = set()
"""List/watch loops being unified elsewhere (one shared loop): they still catch the client
library's exception to count a failed round, never to tell outcomes apart."""


@pytest.mark.parametrize(
    ("status", "typed"),
    [
        (403, kube.Forbidden),
        (404, kube.NotFound),
        (409, kube.Conflict),
        (422, kube.Invalid),
        (500, kube.ApiError),
        (None, kube.ApiError),
    ],
)
async def test_an_api_error_is_translated_once_into_its_type(
    status: int | None, typed: type[kube.ApiError]
) -> None:
    raw = ApiException(status=status, reason="Why")
    raw.body = b'{"kind": "Status"}'

    async def call() -> None:
        raise raw

    with pytest.raises(typed) as caught:
        await kube.api_call(call())
    assert type(caught.value) is typed
    assert caught.value.status == status
    assert (caught.value.reason, caught.value.body) == ("Why", b'{"kind": "Status"}')
    assert kube.translated(caught.value) is caught.value  # never translated twice


async def test_unless_answers_none_for_its_statuses_and_raises_the_others_typed() -> None:
    async def fails(status: int) -> Any:
        raise ApiException(status=status, reason="x")

    assert await kube.unless(kube.GONE, fails(404)) is None
    assert await kube.unless(kube.GONE_OR_CHANGED, fails(422)) is None
    with pytest.raises(kube.Forbidden):
        await kube.unless(kube.GONE, fails(403))


def _raw_status_sites(path: Path) -> list[str]:
    """Where ``path`` imports the client library's exception or compares a caught
    exception's ``.status``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "kubernetes_asyncio.client.exceptions"
        ):
            found.append(f"line {node.lineno}: imports ApiException")
        if isinstance(node, ast.ExceptHandler) and node.name:
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Compare)
                    and isinstance(inner.left, ast.Attribute)
                    and inner.left.attr == "status"
                    and isinstance(inner.left.value, ast.Name)
                    and inner.left.value.id == node.name
                ):
                    found.append(f"line {inner.lineno}: compares {node.name}.status")
    return found


def test_nothing_above_the_adapters_tells_api_errors_apart_by_status() -> None:
    above = [
        p
        for p in sorted(OPERATOR.rglob("*.py"))
        if p.relative_to(OPERATOR).parts[0] in ("controller", "webhook", "app.py")
    ]
    assert above, OPERATOR
    sites = {
        str(p.relative_to(OPERATOR)): found
        for p in above
        if (found := _raw_status_sites(p)) and str(p.relative_to(OPERATOR)) not in LOOPS_LEFT
    }
    assert sites == {}


def test_the_check_finds_a_raw_status_site(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from kubernetes_asyncio.client.exceptions import ApiException\n"
        "async def f(call):\n"
        "    try:\n"
        "        await call\n"
        "    except ApiException as exc:\n"
        "        if exc.status == 404:\n"
        "            return None\n"
        "        raise\n"
    )
    assert _raw_status_sites(module) == [
        "line 1: imports ApiException",
        "line 6: compares exc.status",
    ]
