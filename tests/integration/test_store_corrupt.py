"""Stored records that do not parse are neither trusted nor skipped: the store answers
``corrupt`` (a refusal), on the fence check and on grants (issue 31, the class pass)."""

from __future__ import annotations

import pytest

from fencedlease.authority.types import Acquired, LeaseKey, StoreUnavailable
from tests.integration.conftest import StoreFactory

pytestmark = pytest.mark.integration

NS = "default"


async def test_a_mark_that_does_not_parse_refuses_the_fence_check(make_store: StoreFactory) -> None:
    store = make_store()
    grant = await store.acquire(NS, "bad-mark", "pod", 30.0)
    assert isinstance(grant, Acquired)
    await store.client.put(store._hwm_key(LeaseKey(NS, "bad-mark")), b'{"token": "999"}')
    with pytest.raises(StoreUnavailable) as raised:
        await store.grant_and_mark(NS, "bad-mark", grant.token)
    assert raised.value.code == "corrupt"
    with pytest.raises(StoreUnavailable):
        await store.record_commit(NS, "bad-mark", grant.token)
    with pytest.raises(StoreUnavailable):
        await store.high_water_mark(NS, "bad-mark")


async def test_a_lease_record_that_does_not_parse_grants_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    raw = store._lease_key(LeaseKey(NS, "bad-lease"))
    record = b'{"lease_id": "a", "holder": "p", "duration_seconds": 1, "token": 7.5}'
    await store.client.put(raw, record)
    with pytest.raises(StoreUnavailable) as refused:
        await store.acquire(NS, "bad-lease", "pod", 30.0)
    assert refused.value.code == "corrupt"
    with pytest.raises(StoreUnavailable):
        await store.grant_and_mark(NS, "bad-lease", 7)
