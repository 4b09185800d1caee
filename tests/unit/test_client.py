"""Pure parts of fencedlease.client: parsing, result classification, the request plan and its
retry rules, grant files, the grant scope, the ``token`` command."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from fencedlease.client import (
    Applied,
    DirectoryGrant,
    Duplicate,
    Grant,
    GrantAbsent,
    GrantLost,
    GrantScope,
    GrantState,
    Rejected,
    RetryPolicy,
    StaleFence,
    Unavailable,
    fence_code,
    read_grant_dir,
    under_grant,
)
from fencedlease.client.cli import main as token_main
from fencedlease.client.errors import RequestInfo
from fencedlease.client.plans import Reply, Request, Sleep
from fencedlease.client.publish import PublishRequest, plan
from tests.client_fakes import run_plan

NOW = dt.datetime(2026, 7, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_importing_the_client_does_not_load_the_operator() -> None:
    code = (
        "import sys, fencedlease.client, fencedlease.client.cli;"
        "heavy = {'kopf', 'kubernetes_asyncio', 'aetcd', 'grpc', 'aiohttp', 'pydantic',"
        " 'fencedlease.controller', 'fencedlease.webhook', 'fencedlease.models'};"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ('admission webhook "fence.fencedlease.io" denied the request: stale_fence: token 41 '
         "is below the high-water mark 42", "stale_fence"),
        ("duplicate: operation op-1 was already applied", "duplicate"),
        ('admission webhook "x" denied the request: holder_mismatch: token 5', "holder_mismatch"),
        ('FencedArtifact.fencedlease.io "c" is invalid: spec: Invalid value: "object": '
         "stale_fence: spec.fencingToken may not decrease", "stale_fence"),
        ('fencedartifacts.fencedlease.io "c" is forbidden: User "u" cannot update', None),
        ("the object has been modified; please apply your changes", None),
    ],
)  # fmt: skip
def test_fence_code(message: str, code: str | None) -> None:
    assert fence_code(message) == code


REQ = PublishRequest("ns", "cat", "lease", 42, "obj", "op-1")


def reply(status: int, message: str = "", body: Any = None) -> Reply:
    if body is None:
        body = {"kind": "Status", "message": message, "code": status}
    return Reply(RequestInfo("PUT", "https://x/cat"), status, body)


def drive(replies: list[Reply], retry: RetryPolicy | None = None) -> tuple[Any, list[Any]]:
    """Run the plan against canned replies (one per Request); return the result and the steps."""
    return run_plan(plan(REQ, retry or RetryPolicy(attempts=3, jitter=False)), replies)


def artifact(version: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """FencedArtifact ``ns/cat`` as the API server returns it."""
    return {
        "apiVersion": "fencedlease.io/v1alpha1",
        "kind": "FencedArtifact",
        "metadata": {"name": "cat", "namespace": "ns", "resourceVersion": version},
        "spec": REQ.spec() if spec is None else spec,
        "status": {"x": 1},
    }


STORED = artifact("7", spec={})
WRITTEN = artifact("8")


def test_plan_creates_when_absent_and_replaces_with_the_version_read() -> None:
    result, steps = drive([reply(404), reply(201, body=WRITTEN)])
    assert isinstance(result, Applied) and result.version == "8"
    assert [s.method for s in steps] == ["GET", "POST"]
    assert steps[1].body["spec"]["operationId"] == "op-1"
    result, steps = drive([reply(200, body=STORED), reply(200, body=WRITTEN)])
    assert isinstance(result, Applied)
    put = steps[1]
    assert isinstance(put, Request) and put.method == "PUT"
    assert put.body["metadata"]["resourceVersion"] == "7" and "status" not in put.body
    assert put.body["spec"] == REQ.spec()


@pytest.mark.parametrize(
    ("status", "message", "expected", "code"),
    [
        (403, "denied the request: stale_fence: token 41", StaleFence, "stale_fence"),
        (403, "denied the request: duplicate: op", Duplicate, "duplicate"),
        (403, "denied the request: unknown_token: 9", Rejected, "unknown_token"),
        (403, "denied the request: lease_mismatch: 9", Rejected, "lease_mismatch"),
        (403, "denied the request: holder_mismatch: 9", Rejected, "holder_mismatch"),
        (422, "denied the request: invalid: spec.objectRef", Rejected, "invalid"),
        (403, 'User "x" cannot update resource', Rejected, "forbidden"),
        (401, "Unauthorized", Rejected, "unauthorized"),
        (422, "Invalid value: stale_fence: spec.fencingToken may not decrease", StaleFence,
         "stale_fence"),
    ],
)  # fmt: skip
def test_definitive_answers_are_not_retried(
    status: int, message: str, expected: type[Duplicate | Rejected | StaleFence], code: str
) -> None:
    result, steps = drive([reply(200, body=STORED), reply(status, message)])
    assert isinstance(result, expected) and result.code == code
    assert [type(s).__name__ for s in steps] == [
        "Request",
        "Request",
    ]  # one read, one write, no sleep


def test_transient_failures_are_retried_with_bounded_backoff() -> None:
    failures = [
        reply(503, "denied the request: unavailable: etcd"),
        reply(500, 'Internal error occurred: failed calling webhook "x"'),
        reply(0, "connection refused"),
    ]
    replies = [r for f in failures for r in (reply(200, body=STORED), f)]
    result, steps = drive(replies, RetryPolicy(attempts=3, base_delay=0.1, jitter=False))
    assert isinstance(result, Unavailable) and result.attempts == 3
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == [0.1, 0.2]
    # A transient failure then a stale answer: stops at the stale answer.
    result, steps = drive(
        [
            reply(200, body=STORED),
            failures[0],
            reply(200, body=STORED),
            reply(403, "stale_fence: x"),
        ]
    )
    assert isinstance(result, StaleFence) and len(steps) == 5


def test_conflicts_are_re_read_unless_a_version_was_expected() -> None:
    result, steps = drive(
        [reply(200, body=STORED), reply(409, "the object has been modified"),
         reply(200, body=STORED), reply(200, body=WRITTEN)]
    )  # fmt: skip
    assert isinstance(result, Applied) and len([s for s in steps if isinstance(s, Request)]) == 4
    gen_req = PublishRequest("ns", "cat", "lease", 42, "obj", "op-1", expected_version="3")
    gen = plan(gen_req, RetryPolicy(jitter=False))
    step = next(gen)
    step = gen.send(reply(200, body=STORED))
    assert isinstance(step, Request) and step.body["metadata"]["resourceVersion"] == "3"
    with pytest.raises(StopIteration) as done:
        gen.send(reply(409, "the object has been modified"))
    assert isinstance(done.value.value, Rejected) and done.value.value.code == "conflict"


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(base_delay=1, max_delay=3, jitter=False)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [1, 2, 3, 3]
    assert all(0 <= RetryPolicy().delay(n) <= 3 for n in range(1, 10))


# ------------------------------------------------------------------------------ grants


def write_grant(d: Path, token: str, until: dt.datetime, state: str = "held") -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "token").write_text(token)
    (d / "lease-id").write_text("a7")
    (d / "valid-until").write_text(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    (d / "state").write_text(state)


def test_grant_files(tmp_path: Path) -> None:
    assert read_grant_dir(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    for name in ("token", "lease-id", "valid-until", "state"):
        (tmp_path / "empty" / name).write_text("")  # what the kubelet shows before a grant
    assert read_grant_dir(tmp_path / "empty") is None
    write_grant(tmp_path / "g", "41", NOW + dt.timedelta(seconds=30))
    g = read_grant_dir(tmp_path / "g", "report-july")
    assert g is not None and (g.token, g.lease_id, g.lease) == (41, "a7", "report-july")
    assert g.status(NOW) is GrantState.HELD and g.remaining(NOW) == 30
    assert g.status(NOW + dt.timedelta(seconds=30)) is GrantState.EXPIRED
    assert g.remaining(NOW + dt.timedelta(seconds=31)) == 0
    lost = Grant(41, "a7", NOW + dt.timedelta(seconds=30), "lost")
    assert lost.status(NOW) is GrantState.LOST and lost.remaining(NOW) == 0
    with pytest.raises(GrantLost):
        lost.check(now=NOW)


@pytest.mark.parametrize(
    ("token", "offset", "state", "code", "stdout"),
    [
        ("42", 60, "held", 0, "42"),
        ("42", 60, "lost", 4, ""),
        ("42", -5, "held", 5, ""),
        ("", 60, "", 3, ""),
    ],
)
def test_token_command_exit_codes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    token: str,
    offset: int,
    state: str,
    code: int,
    stdout: str,
) -> None:
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset)
    write_grant(tmp_path, token, until, state)
    assert token_main(["token", "--dir", str(tmp_path), "--require-held"]) == code
    assert capsys.readouterr().out.strip() == stdout
    assert token_main(["token", "--dir", str(tmp_path), "--lease", "l"]) == code
    out = capsys.readouterr().out
    if token:
        assert f"token={token}" in out and "lease=l" in out
    if code == 0:
        assert token_main(["token", "--dir", str(tmp_path), "--min-remaining", "3600"]) == 5


# ------------------------------------------------------------------------------ scope


class FakeSource:
    """A grant source driven by the test (no files, no API)."""

    lease: str | None = "l"

    def __init__(self, grant: Grant | None) -> None:
        self.grant = grant
        self.changed = threading.Event()
        self.achanged: asyncio.Event | None = None

    def describe(self) -> str:
        return "fake"

    def read(self) -> Grant | None:
        return self.grant

    async def aread(self) -> Grant | None:
        return self.grant

    def set(self, grant: Grant | None) -> None:
        self.grant = grant
        self.changed.set()
        if self.achanged is not None:
            self.achanged.set()

    def watch(self, stop: threading.Event | None = None) -> Iterator[Grant | None]:
        stop = stop or threading.Event()
        yield self.grant
        while not stop.is_set():
            if self.changed.wait(0.05):
                self.changed.clear()
                yield self.grant

    async def awatch(self, stop: asyncio.Event | None = None) -> AsyncIterator[Grant | None]:
        self.achanged = asyncio.Event()
        yield self.grant
        while stop is None or not stop.is_set():
            await self.achanged.wait()
            self.achanged.clear()
            yield self.grant


def held(token: int = 41, seconds: float = 60, state: str = "held") -> Grant:
    return Grant(
        token,
        f"id-{token}",
        dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds),
        state,
        "l",
    )


def test_scope_refuses_to_start_without_a_grant() -> None:
    with pytest.raises(GrantAbsent), GrantScope(FakeSource(None)):
        pass
    with pytest.raises(GrantLost), GrantScope(FakeSource(held(state="lost"))):
        pass


def test_sync_scope_notices_loss_and_renewal() -> None:
    source = FakeSource(held())
    with GrantScope(source) as scope:
        assert scope.token == 41 and scope.check().token == 41
        source.set(held(seconds=120))  # a renewal: same generation
        assert not scope.lost.wait(0.3)
        assert scope.remaining() > 100
        source.set(held(token=42))  # a new generation: ours is gone
        assert scope.lost.wait(5)
        with pytest.raises(GrantLost, match="new generation"):
            scope.check()


def test_sync_scope_notices_the_deadline() -> None:
    with GrantScope(FakeSource(held(seconds=0.3))) as scope:
        assert scope.lost.wait(5) and "deadline" in scope.reason


async def test_async_scope_cancels_the_work_when_the_grant_is_lost() -> None:
    source = FakeSource(held())
    started = asyncio.Event()
    finished = False

    @under_grant(source)
    async def work(scope: GrantScope) -> None:
        nonlocal finished
        started.set()
        await asyncio.sleep(30)
        finished = True

    task = asyncio.create_task(work())
    await asyncio.wait_for(started.wait(), 5)
    source.set(held(state="lost"))
    with pytest.raises(GrantLost, match="lost"):
        await asyncio.wait_for(task, 5)
    assert not finished


async def test_async_scope_lets_finished_work_return() -> None:
    source = FakeSource(held())

    @under_grant(source)
    async def work(scope: GrantScope, x: int) -> int:
        return scope.token + x

    assert await work(1) == 42


def test_directory_watch_sees_a_new_generation(tmp_path: Path) -> None:
    write_grant(tmp_path, "41", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60))
    for use_watchfiles in (True, False):
        source = DirectoryGrant(tmp_path, "l", poll_interval=0.1, use_watchfiles=use_watchfiles)
        stop = threading.Event()
        seen: list[int | None] = []

        def consume(src: DirectoryGrant = source, out: list[int | None] = seen) -> None:
            for g in src.watch(stop):
                out.append(g.token if g else None)
                if g is not None and g.token == 42:
                    stop.set()

        t = threading.Thread(target=consume)
        t.start()
        deadline = dt.datetime.now() + dt.timedelta(seconds=10)
        while not seen and dt.datetime.now() < deadline:
            stop.wait(0.05)
        write_grant(tmp_path, "42", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60))
        t.join(10)
        stop.set()
        assert seen[0] == 41 and seen[-1] == 42, (use_watchfiles, seen)
        write_grant(tmp_path, "41", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60))


@pytest.mark.parametrize("use_watchfiles", [True, False])
async def test_directory_awatch_sees_a_new_generation(tmp_path: Path, use_watchfiles: bool) -> None:
    write_grant(tmp_path, "41", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60))
    source = DirectoryGrant(tmp_path, "l", poll_interval=0.1, use_watchfiles=use_watchfiles)
    stop, first = asyncio.Event(), asyncio.Event()
    seen: list[int | None] = []

    async def consume() -> None:
        async for g in source.awatch(stop):
            seen.append(g.token if g else None)
            first.set()
            if g is None or g.token == 42:
                stop.set()
                return

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 10)
    write_grant(tmp_path, "42", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60))
    await asyncio.wait_for(task, 10)
    assert seen == [41, 42]


def test_wait_for_grant_and_the_sync_decorator(tmp_path: Path) -> None:
    from fencedlease.client import wait_for_grant

    source = DirectoryGrant(tmp_path, "l", poll_interval=0.05, use_watchfiles=False)
    with pytest.raises(GrantAbsent):
        wait_for_grant(source, timeout=0.3)
    timer = threading.Timer(
        0.2,
        write_grant,
        (tmp_path, "7", dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60)),
    )
    timer.start()
    assert wait_for_grant(source, timeout=10).token == 7

    @under_grant(source)
    def work(scope: GrantScope, suffix: str) -> str:
        scope.check()
        return f"{scope.token}{suffix}"

    assert work("!") == "7!"


def test_lease_status_grant_turns_lost_when_another_holder_shows() -> None:
    from fencedlease.client import LeaseStatusGrant

    source = LeaseStatusGrant("l", pod="w-a", namespace="ns", client=object())
    until = "2099-01-01T00:00:00Z"
    mine = {"status": {"phase": "Held", "holder": "w-a", "fencingToken": 5, "leaseId": "x",
                       "expireTime": until}}  # fmt: skip
    other = {"status": {"phase": "Held", "holder": "w-b", "fencingToken": 6, "leaseId": "y",
                        "expireTime": until}}  # fmt: skip
    assert source._parse({"status": {}}) is None
    g = source._parse(mine)
    assert g is not None and g.held and g.token == 5
    lost = source._parse(other)
    assert lost is not None and lost.token == 5 and lost.status() is GrantState.LOST


def test_lease_status_grant_takes_the_deadline_from_the_holder_pod() -> None:
    """The status shows the grant but no per-renewal deadline: that is the Pod's annotation."""
    from fencedlease.client import LeaseStatusGrant

    source = LeaseStatusGrant("l", pod="w-a", namespace="ns", client=object())
    mine = {"status": {"phase": "Held", "holder": "w-a", "fencingToken": 5, "leaseId": "x"}}
    assert source._needs_pod(mine)
    pod = {"metadata": {"annotations": {
        "token.fencedlease.io/l": "5", "lease-id.fencedlease.io/l": "x",
        "valid-until.fencedlease.io/l": "2099-01-01T00:00:00Z", "state.fencedlease.io/l": "held",
    }}}  # fmt: skip
    g = source._parse(mine, pod)
    assert g is not None and g.held and g.valid_until.year == 2099
    fresh = LeaseStatusGrant("l", pod="w-a", namespace="ns", client=object())
    assert fresh._parse(mine, {"metadata": {}}) is None  # no deadline shown: no grant yet
