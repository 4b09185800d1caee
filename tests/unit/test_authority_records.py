"""Stored records parse strictly: a wrong type is an error, never coerced (issue 31, the class
of "a number parsed from outside")."""

from __future__ import annotations

import json

import pytest

from fencedlease.authority.types import HighWaterMark, LeaseRecord, TokenGrant

RECORD: dict[str, object] = {
    "lease_id": "a",
    "holder": "pod",
    "duration_seconds": 10,
    "token": 7,
    "retained": [5],
}
GRANT: dict[str, object] = {
    "namespace": "ns",
    "name": "l",
    "lease_id": "a",
    "holder": "pod",
    "holder_uid": "u",
}


def _raw(base: dict[str, object], **changes: object) -> bytes:
    return json.dumps({**base, **changes}).encode()


def test_well_formed_records_parse() -> None:
    assert LeaseRecord.from_json(_raw(RECORD)).token == 7
    assert LeaseRecord.from_json(_raw(RECORD, token=None)).token is None
    assert TokenGrant.from_json(_raw(GRANT)).holder_uid == "u"
    assert HighWaterMark.from_json(b'{"token": 9, "operation_ids": ["x"]}').token == 9


@pytest.mark.parametrize(
    "changes",
    [
        {"token": "7"},
        {"token": 7.5},
        {"token": True},
        {"token": -1},
        {"retained": [5.0]},
        {"retained": "5"},
        {"renewals": "1"},
        {"duration_seconds": "10"},
        {"duration_seconds": True},
        {"holder": None},
        {"lease_id": 3},
    ],
)
def test_a_lease_record_of_the_wrong_shape_does_not_parse(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LeaseRecord.from_json(_raw(RECORD, **changes))


@pytest.mark.parametrize(
    "raw",
    [
        _raw(GRANT, namespace=None),  # str(None) was "None": a grant of lease "None/l"
        _raw(GRANT, holder=7),
        _raw(GRANT, holder_uid=7),
        b"[1, 2]",
        b'"grant"',
    ],
)
def test_a_token_grant_of_the_wrong_shape_does_not_parse(raw: bytes) -> None:
    with pytest.raises((ValueError, KeyError)):
        TokenGrant.from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"token": "9"}',
        b'{"token": 9.5}',
        b'{"token": true}',
        b'{"token": 9, "operation_ids": [1]}',
    ],
)
def test_a_mark_of_the_wrong_shape_does_not_parse(raw: bytes) -> None:
    with pytest.raises(ValueError):
        HighWaterMark.from_json(raw)
