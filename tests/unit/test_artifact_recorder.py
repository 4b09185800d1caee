"""The artifact recorder and what it cannot verify (issue 31, "the class of defect").

An artifact the webhook never checked (bypassed, or let in by an older CRD) may show a spec
without a lease or an integer token, or a status someone else wrote.  Each is *unverified*:
reported with the ``UnverifiedToken`` Event and ``fencedlease_unverified_tokens_total`` (as a
lease's unverified status is), never given to the high-water mark, and the status is
rewritten from the verified token or cleared.  In-memory authority, no sleeps.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from fencedlease.authority.memory import AsyncMemoryStore, MemoryAuthority, MemoryKV
from fencedlease.authority.types import Acquired, Released
from fencedlease.controller.artifacts import ArtifactObject, ArtifactRecorder
from fencedlease.models import ARTIFACT_FINALIZER
from tests.fakes import FakeClock, RecordingKube

NS = "default"
CLEARED = {"acceptedFence": None, "acceptedAt": None, "observedGeneration": None}


def unverified(kind: str) -> float:
    value = REGISTRY.get_sample_value("fencedlease_unverified_tokens_total", {"kind": kind})
    return value or 0.0


def body(spec: Any, status: Any = None, *, uid: str = "uid-1") -> dict[str, Any]:
    out: dict[str, Any] = {
        "metadata": {
            "namespace": NS,
            "name": "report",
            "uid": uid,
            "resourceVersion": "7",
            "generation": 1,
            "finalizers": [ARTIFACT_FINALIZER],
        },
        "spec": spec,
    }
    if status is not None:
        out["status"] = status
    return out


def spec(token: Any, lease: Any = "job") -> dict[str, Any]:
    return {"leaseRef": {"name": lease}, "fencingToken": token, "objectRef": "s3://r"}


class World:
    def __init__(self) -> None:
        self.auth = MemoryAuthority(MemoryKV(revision=40), clock=FakeClock())
        self.kube = RecordingKube()
        self.recorder = ArtifactRecorder(AsyncMemoryStore(self.auth), self.kube)

    def grant(self) -> int:
        grant = self.auth.acquire(NS, "job", "pod-0", 10.0)
        assert isinstance(grant, Acquired)
        assert isinstance(self.auth.release(NS, "job", grant.lease_id, grant.token), Released)
        return grant.token

    def mark(self) -> int | None:
        mark = self.auth.high_water_mark(NS, "job")
        return None if mark is None else mark.token

    async def see(self, raw: dict[str, Any]) -> ArtifactObject:
        art = ArtifactObject.from_body(raw)
        self.recorder.upsert(art)
        assert await self.recorder.reconcile(art.key) is None
        return art

    def unverified_events(self) -> list[str]:
        return [m for _, _, reason, m in self.kube.events if reason == "UnverifiedToken"]


@pytest.mark.parametrize(
    ("raw_spec", "shown"),
    [
        (spec("12"), "'12' is not an integer"),
        (spec(12.5), "12.5 is not an integer"),
        (spec(True), "True is not an integer"),
        ({"fencingToken": 45, "objectRef": "s3://r"}, "spec.leaseRef.name"),
        (spec(45, lease=""), "spec.leaseRef.name"),
        ({"leaseRef": "job", "fencingToken": 45}, "spec.leaseRef.name"),
        ("not an object", "spec: not an object"),
    ],
)
async def test_a_spec_that_does_not_parse_is_reported_once_and_never_recorded(
    raw_spec: Any, shown: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 1: it was skipped without a word (no Event, no metric, no warning)."""
    world = World()
    world.grant()
    before = unverified("artifact")
    with caplog.at_level(logging.WARNING, logger="fencedlease.controller.artifacts"):
        await world.see(body(raw_spec))
        await world.see(body(raw_spec))  # the next pass says nothing new
    [message] = world.unverified_events()
    assert shown in message and "does not parse" in message
    assert unverified("artifact") == before + 1
    assert any("UnverifiedToken" in r.getMessage() for r in caplog.records)
    assert world.mark() is None  # nothing moved the mark
    assert world.kube.artifact_statuses == []  # and nothing claims it was accepted


async def test_a_forged_accepted_fence_on_an_unverified_token_is_reported_and_cleared() -> None:
    """Item 2: the forged status stayed, silently."""
    world = World()
    token = world.grant()
    forged = token + 100  # never issued
    before = unverified("artifact_status")
    await world.see(body(spec(forged), {"acceptedFence": forged, "acceptedAt": "x"}))
    reports = world.unverified_events()
    assert len(reports) == 2  # the spec's token, and the status that claims it was accepted
    assert any(f"status.acceptedFence {forged}" in m and "cleared" in m for m in reports)
    assert unverified("artifact_status") == before + 1
    assert world.kube.artifact_statuses == [(NS, "report", CLEARED)]
    assert world.mark() is None
    # The watch shows the cleared status: nothing more is said or written.
    await world.see(body(spec(forged), {}))
    assert len(world.unverified_events()) == 2
    assert len(world.kube.artifact_statuses) == 1
    # Forged again: reported anew (once per forgery) and cleared again.
    await world.see(body(spec(forged), {"acceptedFence": forged}))
    assert len(world.unverified_events()) == 3
    assert world.kube.artifact_statuses[-1] == (NS, "report", CLEARED)


async def test_a_forged_accepted_fence_on_a_spec_that_does_not_parse_is_cleared() -> None:
    world = World()
    await world.see(body(spec("9"), {"acceptedFence": 9}))
    assert len(world.unverified_events()) == 2
    assert world.kube.artifact_statuses == [(NS, "report", CLEARED)]


@pytest.mark.parametrize("accepted", [True, "45", 45.0, [45]])
async def test_an_accepted_fence_that_is_no_integer_is_reported_and_rewritten(
    accepted: Any,
) -> None:
    """Item 3: ``True`` counted as acceptedFence 1 (a bool is an int in Python)."""
    world = World()
    token = world.grant()
    before = unverified("artifact_status")
    art = await world.see(body(spec(token), {"acceptedFence": accepted}))
    assert art.accepted_fence is None  # never trusted
    [message] = world.unverified_events()
    assert "status.acceptedFence" in message and "rewritten" in message
    assert unverified("artifact_status") == before + 1
    [(_, _, status)] = world.kube.artifact_statuses
    assert status["acceptedFence"] == token
    assert world.mark() == token  # the verified spec token moved it, nothing else


async def test_a_boolean_accepted_fence_is_not_taken_for_token_one() -> None:
    """Item 3 at its sharpest: a verified token 1 and ``acceptedFence: true`` (== 1)."""
    art = ArtifactObject.from_body(body(spec(1), {"acceptedFence": True}))
    assert art.accepted_fence is None and art.status_error is not None
    assert ArtifactObject.from_body(body(spec(1), {"acceptedFence": 1})).accepted_fence == 1


async def test_a_verified_artifact_is_accepted_without_any_report() -> None:
    world = World()
    token = world.grant()
    await world.see(body(spec(token)))
    await world.see(body(spec(token), {"acceptedFence": token, "acceptedAt": "t"}))
    assert world.unverified_events() == []
    assert world.kube.reasons() == ["FenceAccepted"]
    assert len(world.kube.artifact_statuses) == 1
    assert world.mark() == token


async def test_a_status_that_is_not_an_object_is_reported_and_cleared() -> None:
    world = World()
    await world.see(body(spec(99), "forged"))  # 99: never issued
    assert any("status: not an object" in m for m in world.unverified_events())
    assert world.kube.artifact_statuses == [(NS, "report", CLEARED)]
