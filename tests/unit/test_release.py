"""A holder's voluntary release (FencedRelease), floor by floor: the pure rules
(``authority/handback.py``), the webhook's admission (``webhook/releases.py``), the reconciler's
pass on the in-memory authority (next holder at once with a greater token; a delayed release of
an older generation changes nothing; the releasing Pod is passed over until it asks again), and
the SDK's sans-IO plan (``client/release.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fencedlease.authority import handback
from fencedlease.authority.handback import HolderRelease
from fencedlease.authority.types import (
    FenceRead,
    Generation,
    LeaseRecord,
    LeaseState,
    LeaseView,
    TokenGrant,
)
from fencedlease.client.errors import RequestInfo
from fencedlease.client.plans import Reply, Request
from fencedlease.client.release import (
    Released,
    ReleasePending,
    ReleaseRefused,
    ReleaseRequest,
    plan,
)
from fencedlease.client.results import Unavailable
from fencedlease.controller.releases import release_from_body
from fencedlease.webhook import releases as admit
from tests.fakes import run_plan
from tests.unit.reviews import review
from tests.unit.test_reconciler import KEY, NS, World

# ------------------------------------------------------------------------------ pure rules


def view(lease_id: str = "g2", token: int = 42, uid: str | None = "uid-a") -> LeaseView:
    record = LeaseRecord(lease_id, "a", 30.0, token, LeaseState.HELD, holder_uid=uid)
    return LeaseView(record, token, token, expired=False, remaining_seconds=20.0)


def request(lease_id: str = "g2", token: int = 42, uid: str = "uid-a", **kw: Any) -> HolderRelease:
    return HolderRelease(NS, f"report-{lease_id}", "report", lease_id, token, "a", uid, **kw)


def test_only_the_current_generation_of_its_own_holder_is_released() -> None:
    assert handback.refusal(view(), request()) is None
    older = handback.refusal(view(), request("g1", 41))
    assert older is not None and "not current" in older and "g1" in older
    assert "token 41" in (handback.refusal(view(), request(token=41)) or "")
    assert "uid-a" in (handback.refusal(view(), request(uid="uid-b")) or "")
    assert "no generation" in (handback.refusal(None, request()) or "")


def test_a_released_pod_is_passed_over_only_while_its_release_took_effect() -> None:
    requests = [
        request(phase="Released"),
        request("g1", uid="uid-b", phase="Refused"),
        request("g3", uid="uid-c"),
    ]
    assert handback.passed_over(requests) == frozenset({"uid-a"})


# ------------------------------------------------------------------------------ admission


def request_review(
    resource: str, op: str, spec: dict[str, Any], user: dict[str, Any], **request: Any
) -> dict[str, Any]:
    """An AdmissionReview of a Pod's request object (``resource``) with ``spec``."""
    body = review(op, {"spec": spec}, user=user)
    kind = {"group": "fencedlease.io", "version": "v1alpha1", "resource": resource}
    body["request"].update(resource=kind, namespace=NS, **request)
    return body


def release_review(spec: dict[str, Any], user: dict[str, Any], op: str = "CREATE") -> Any:
    return request_review("fencedreleases", op, spec, user, name="report-g2")


SPEC = {
    "leaseRef": {"name": "report"},
    "leaseId": "g2",
    "fencingToken": 42,
    "holder": "a",
    "holderUID": "uid-a",
}


def pod_user(name: str = "a", uid: str = "uid-a", ns: str = NS) -> dict[str, Any]:
    return {
        "username": f"system:serviceaccount:{ns}:worker",
        "extra": {
            "authentication.kubernetes.io/pod-name": [name],
            "authentication.kubernetes.io/pod-uid": [uid],
        },
    }


GRANT = TokenGrant(NS, "report", "g2", "a", "uid-a")


def decide(spec: dict[str, Any], user: dict[str, Any], grant: TokenGrant | None) -> Any:
    body = release_review(spec, user)
    assert admit.is_release_review(body)
    parsed = admit.parse_release(body)
    assert isinstance(parsed, admit.ReleaseRequest)
    return admit.decide_release(parsed, grant)


def test_the_webhook_admits_a_release_only_from_the_pod_it_was_granted_to() -> None:
    assert decide(SPEC, pod_user(), GRANT).allowed
    # Not a Pod (an administrator, a stolen token used from elsewhere), another Pod, another
    # Pod under the holder's name, another namespace: holder_mismatch, no store read needed.
    for user in (
        {"username": "admin", "groups": ["system:masters"]},
        pod_user("b", "uid-b"),
        pod_user("a", "uid-new"),
        pod_user(ns="other"),
    ):
        verdict = decide(SPEC, user, GRANT)
        assert not verdict.allowed and verdict.code == "holder_mismatch", user
    # The Pod names itself, but the token was not granted to it, or not as this generation.
    assert decide(SPEC, pod_user(), None).code == "unknown_token"
    assert decide(SPEC, pod_user(), replace(GRANT, holder_uid="uid-b")).code == "holder_mismatch"
    assert decide(SPEC, pod_user(), replace(GRANT, lease_id="g1")).code == "lease_mismatch"
    assert decide(SPEC, pod_user(), replace(GRANT, name="other")).code == "lease_mismatch"


def test_the_webhook_checks_creates_only_and_refuses_malformed_ones() -> None:
    update = admit.parse_release(release_review(SPEC, pod_user(), op="UPDATE"))
    assert not isinstance(update, admit.ReleaseRequest) and update.allowed
    bad = admit.parse_release(release_review({**SPEC, "fencingToken": "x"}, pod_user()))
    assert not isinstance(bad, admit.ReleaseRequest) and bad.code == "invalid"
    assert not admit.is_release_review({"request": {"resource": {"resource": "fencedartifacts"}}})


async def test_the_checker_answers_a_release_review_with_one_store_read() -> None:
    class Store:
        reads: list[tuple[str, str, int]] = []

        async def grant_and_mark(self, namespace: str, name: str, token: int) -> FenceRead:
            self.reads.append((namespace, name, token))
            return FenceRead(GRANT, None, Generation(token))

    store = Store()
    reply = await admit.review_release(store, release_review(SPEC, pod_user()), 1.0)
    assert reply["response"]["allowed"] and store.reads == [(NS, "report", 42)]
    reply = await admit.review_release(store, release_review(SPEC, pod_user("b", "u")), 1.0)
    assert not reply["response"]["allowed"] and len(store.reads) == 1


# ------------------------------------------------------------------------------ the pass


class StatusWrites:
    def __init__(self) -> None:
        self.written: list[tuple[str, dict[str, Any]]] = []

    async def patch_release_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self.written.append((name, status))
        return True


def file_release(w: World, lease_id: str, token: int, holder: str, uid: str) -> str:
    """The watch shows a FencedRelease (as the webhook admitted it)."""
    name = f"report-{lease_id}"
    body = {
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "leaseRef": {"name": "report"},
            "leaseId": lease_id,
            "fencingToken": token,
            "holder": holder,
            "holderUID": uid,
        },
    }
    found = release_from_body(body)
    assert found is not None
    assert w.reconciler.releases.requests.upsert(found)
    return name


def world() -> tuple[World, StatusWrites]:
    w = World()
    writes = StatusWrites()
    w.reconciler.releases.kube = writes
    return w, writes


async def held_by_a() -> tuple[World, StatusWrites, dict[str, Any]]:
    """Pods ``a`` and ``b`` (older first): ``a`` is granted; its status."""
    w, writes = world()
    w.pod("a", "2026-01-01T00:00:01Z")
    w.pod("b", "2026-01-01T00:00:02Z")
    await w.run()
    return w, writes, dict(w.status)


async def test_a_release_hands_the_lease_to_the_next_pod_at_once_with_a_greater_token() -> None:
    w, writes, first = await held_by_a()
    assert first["holder"] == "a"
    name = file_release(w, first["leaseId"], first["fencingToken"], "a", "uid-a")
    await w.run()  # no time passes: no expiry involved
    s = w.status
    assert s["holder"] == "b" and s["fencingToken"] > first["fencingToken"]
    assert writes.written == [(name, {**writes.written[0][1], "phase": "Released", "reason": ""})]
    assert "Released" in w.kube.reasons() and w.state("a") == "lost"


async def test_a_delayed_release_of_an_older_generation_changes_nothing() -> None:
    w, writes, first = await held_by_a()
    w.pod("a", "2026-01-01T00:00:01Z", ready=False)  # A stalls; its lease expires
    w.clock.advance(31)
    await w.run()
    second = dict(w.status)
    assert second["holder"] == "b" and second["fencingToken"] > first["fencingToken"]
    # A wakes up and releases the generation it had: refused, B keeps its lease and token.
    w.pod("a", "2026-01-01T00:00:01Z")
    name = file_release(w, first["leaseId"], first["fencingToken"], "a", "uid-a")
    await w.run()
    assert writes.written[-1][0] == name and writes.written[-1][1]["phase"] == "Refused"
    assert "not current" in writes.written[-1][1]["reason"]
    view = await w.store.read(NS, "report")
    assert view is not None and view.record.state is LeaseState.HELD
    assert (view.record.lease_id, view.token) == (second["leaseId"], second["fencingToken"])
    assert w.status["holder"] == "b" and w.state("b") == "held"


async def test_the_releasing_pod_is_not_granted_again_until_it_asks_again() -> None:
    w, _ = world()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    first = dict(w.status)
    name = file_release(w, first["leaseId"], first["fencingToken"], "a", "uid-a")
    await w.run()
    assert w.status["phase"] == "Released" and w.state("a") == "lost"
    w.clock.advance(60)
    await w.run()  # the only candidate, still passed over
    assert w.status["phase"] == "Released"
    # Asking again: its FencedRelease is deleted (the SDK's rejoin, or its Pod went).
    assert w.reconciler.releases.requests.remove(NS, name) == KEY
    await w.run()
    assert w.status["holder"] == "a" and w.status["fencingToken"] > first["fencingToken"]


async def test_a_release_naming_another_pods_uid_ends_nothing() -> None:
    w, writes = world()
    w.pod("a", "2026-01-01T00:00:01Z")
    await w.run()
    first = dict(w.status)
    file_release(w, first["leaseId"], first["fencingToken"], "a", "uid-imposter")
    await w.run()
    assert writes.written[-1][1]["phase"] == "Refused"
    assert w.status["holder"] == "a" and w.status["fencingToken"] == first["fencingToken"]


# ------------------------------------------------------------------------------ the SDK plan

REQ = ReleaseRequest("report", "g2", 42, pod="a", pod_uid="uid-a", namespace=NS, wait=1.0, poll=0.5)
INFO = RequestInfo("POST", "https://api")


def drive(req: ReleaseRequest, replies: list[tuple[int, Any]]) -> tuple[Any, list[Any]]:
    return run_plan(plan(req), [Reply(INFO, code, body) for code, body in replies])


def test_the_plan_creates_the_request_then_reads_the_operators_answer() -> None:
    result, steps = drive(REQ, [(201, {}), (200, {"status": {"phase": "Released"}})])
    assert isinstance(result, Released) and result.token == 42
    create = steps[0]
    assert isinstance(create, Request) and create.method == "POST"
    assert create.body["spec"] == {
        "leaseRef": {"name": "report"},
        "leaseId": "g2",
        "fencingToken": 42,
        "holder": "a",
        "holderUID": "uid-a",
    }
    assert create.body["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
    result, _ = drive(REQ, [(409, {}), (200, {"status": {"phase": "Refused", "reason": "x"}})])
    assert result == ReleaseRefused("not_current", "x")


def test_each_outcome_of_the_plan() -> None:
    denied = {
        "kind": "Status",
        "message": 'admission webhook "x" denied the request: holder_mismatch: no',
    }
    result, _ = drive(REQ, [(403, denied)])
    assert isinstance(result, ReleaseRefused) and result.reason == "holder_mismatch"
    result, _ = drive(REQ, [(503, {"kind": "Status", "message": "down"})])
    assert isinstance(result, Unavailable) and result.status_code == 503
    result, _ = drive(REQ, [(201, {}), (200, {}), (200, {})])
    assert result == ReleasePending("report-g2")
    result, steps = drive(replace(REQ, wait=0), [(201, {})])
    assert result == ReleasePending("report-g2") and len(steps) == 1


def test_a_release_event_pokes_its_lease_when_it_waits_or_is_deleted() -> None:
    from fencedlease.controller.releases import ReleaseRequests

    requests, poked = ReleaseRequests(), list[Any]()
    body = {"metadata": {"namespace": NS, "name": "report-g2"}, "spec": SPEC}
    requests.on_event({"type": "ADDED", "object": body}, poked.append)
    assert poked == [KEY] and len(requests.pending(KEY)) == 1
    requests.decided(requests.pending(KEY)[0], "Released")
    requests.on_event({"type": "MODIFIED", "object": body}, poked.append)  # our status, late
    assert poked == [KEY] and requests.passed_over(KEY) == frozenset({"uid-a"})
    requests.on_event({"type": "DELETED", "object": body}, poked.append)  # it asks again
    assert poked == [KEY, KEY] and requests.passed_over(KEY) == frozenset()


def test_the_release_cli_says_one_line_and_exits_with_its_code(
    tmp_path: Any, capsys: Any, monkeypatch: Any
) -> None:
    from fencedlease.client.cli import main
    from fencedlease.client.cli_common import EXIT_ABSENT, EXIT_ERROR

    (tmp_path / "empty").mkdir()
    assert main(["release", "report", "--dir", str(tmp_path / "empty")]) == EXIT_ABSENT
    assert capsys.readouterr().err.startswith("absent: no grant in ")
    assert main(["release", "report", "--dir", str(tmp_path / "none")]) == EXIT_ERROR
    assert capsys.readouterr().err.endswith("/none does not exist\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = main(["release", "report", "--lease-id", "g2", "--token", "42", "--pod", "a"])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and err.startswith("error: ") and err.count("\n") == 1, err
