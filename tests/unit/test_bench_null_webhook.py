"""The bench's null webhook (bench/null_webhook.py): the floor under any Python fence webhook.

It must answer a review the way the API server requires (the request's uid, allowed) and deny
only the bench's probe, which is how the bench knows the API server calls it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fencedlease.registration.selfregistration import desired_configuration
from fencedlease.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
null_webhook = pytest.importorskip("null_webhook")
api_rows = pytest.importorskip("api_rows")


def _review(operation_id: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f1c-uid",
            "operation": "UPDATE",
            "object": {"spec": {"operationId": operation_id, "fencingToken": 7}},
        },
    }


async def _answer(operation_id: str) -> dict[str, Any]:
    app = web.Application()
    app.add_routes([web.post(null_webhook.PATH, null_webhook.review)])
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(null_webhook.PATH, json=_review(operation_id))
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
    return body


async def test_it_allows_a_review_and_answers_its_uid() -> None:
    body = await _answer("op-1")
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"] == {"uid": "3f1c-uid", "allowed": True}


async def test_it_denies_the_benchs_probe() -> None:
    response = (await _answer(null_webhook.PROBE))["response"]
    assert response["uid"] == "3f1c-uid" and response["allowed"] is False
    assert "probe denied" in response["status"]["message"]


def test_it_is_registered_like_the_fence_webhook_for_its_own_kind_only() -> None:
    fence = desired_configuration(Settings(), 8443, "Q0E=")["webhooks"][0]
    (null,) = api_rows.null_configuration(9443, "Q0E=")["webhooks"]
    assert null["clientConfig"] == {
        "url": f"https://127.0.0.1:9443{null_webhook.PATH}",
        "caBundle": "Q0E=",
    }
    assert null["name"] != fence["name"]  # its calls are counted apart from the fence's
    (rule,) = null["rules"]
    assert rule["apiGroups"] == [api_rows.NULL_GROUP]
    assert rule["resources"] == [api_rows.NULL, f"{api_rows.NULL}/status"]
    for setting in ("failurePolicy", "sideEffects", "timeoutSeconds", "matchPolicy"):
        assert null[setting] == fence[setting]
