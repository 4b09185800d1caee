"""``kube.request_json``: an answer is a JSON object or an :class:`ApiException` with the
status, whatever the server (or something in between) sent."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from fencedlease import kube


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body, self.reason = status, body, "Reason"
        self.released = False

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        self.released = True


class FakeApi:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, dict[str, str]]] = []

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Answer:
        self.calls.append((method, path, kwargs["header_params"]))
        return self.answer


async def test_a_json_object_is_the_answer() -> None:
    api = FakeApi(Answer(200, b'{"metadata": {"resourceVersion": "7"}}'))
    found = await kube.request_json(api, "PUT", "/x", {"a": 1})  # type: ignore[arg-type]
    assert found == {"metadata": {"resourceVersion": "7"}}
    assert api.calls == [
        ("PUT", "/x", {"Accept": "application/json", "Content-Type": "application/json"})
    ]
    assert api.answer.released


@pytest.mark.parametrize("body", [b"<html>proxy error</html>", b"[1, 2]", b"", b'"text"'])
async def test_a_2xx_answer_that_is_not_a_json_object_is_an_api_error(body: bytes) -> None:
    api = FakeApi(Answer(200, body))
    with pytest.raises(ApiException) as caught:
        await kube.request_json(api, "GET", "/x")  # type: ignore[arg-type]
    assert caught.value.status == 200 and "not a JSON object" in str(caught.value.reason)


async def test_an_error_status_keeps_its_status_and_body() -> None:
    api = FakeApi(Answer(409, b'{"kind": "Status", "reason": "Conflict"}'))
    with pytest.raises(ApiException) as caught:
        await kube.request_json(api, "PUT", "/x", {})  # type: ignore[arg-type]
    assert caught.value.status == 409 and "Conflict" in cast(str, caught.value.body)
    assert api.answer.released
