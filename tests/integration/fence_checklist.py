"""The article's checklist, written once and run against every fence (docs/fences.md).

A fence under test is adapted to :class:`FenceUnderTest`: ``stage`` writes immutable output
(harmless: nothing shows it), ``publish`` makes a staged reference visible under a token through
the fence, ``visible`` says what readers see, ``version`` is what a same-token writer prepares
against, ``recover`` is the crash recovery (the garbage collector of staged output).  The
scenarios (no sleeps: each interleaving is a sequence of awaited steps, the "pause" is simply
that nothing of the paused writer runs until the test resumes it):

* :func:`paused_writer` — A (41) publishes, pauses past its expiry, B (42) publishes, A resumes:
  ``stale_fence``, B stays visible;
* :func:`late_41_after_42` — A's token-41 request is delivered after B's 42: ``stale_fence``;
* :func:`duplicated_current_token` — the same operation twice: ``Applied`` then ``Duplicate``;
* :func:`reordered_same_token` — two same-token writes prepared against one version, delivered
  in reverse: the second is refused (``version_conflict``), the pointer never moves back;
* :func:`crash_between_staging_and_publication` — staged output of a crashed writer is never
  visible and recovery removes it, never what a pointer references;
* :func:`concurrent_writers` — N writers with N tokens at once: the highest stays visible;
* :func:`bad_tokens` — non-numeric, negative, zero, bool and float tokens change nothing.

Every result is one of ``Applied | Duplicate | StaleFence | Rejected`` (fencedlease.client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fencedlease.client import Applied, Duplicate, Rejected, StaleFence
from fencedlease.client.fences import FenceResult


class FenceUnderTest:
    """What each fence is adapted to (``fence_adapters.py``); :meth:`publish` passes its
    options to the adapter's :meth:`_send`."""

    name: str
    remembers_operations: bool
    """``True``: a retry of an operation older than the last one is still a ``Duplicate``
    (FencedArtifact remembers only the last ``operationId``)."""

    async def tokens(self, resource: str, n: int) -> list[int]:
        """``n`` tokens of successive grants for ``resource`` (ascending)."""
        raise NotImplementedError

    async def stage(self, resource: str, token: Any, data: str) -> str:
        """Immutable output of the writer holding ``token`` (invisible until published)."""
        raise NotImplementedError

    async def publish(
        self,
        resource: str,
        token: Any,
        ref: str,
        *,
        operation_id: str | None = None,
        expected_version: Any = None,
    ) -> FenceResult:
        return await self._send(
            resource, token, ref, operation_id=operation_id, expected_version=expected_version
        )

    async def _send(self, resource: str, token: Any, ref: str, **options: Any) -> FenceResult:
        """Publish with ``options`` ``operation_id`` and ``expected_version`` (both given)."""
        raise NotImplementedError

    async def visible(self, resource: str) -> str | None:
        raise NotImplementedError

    async def version(self, resource: str) -> Any:
        raise NotImplementedError

    async def staged(self) -> set[str]:
        raise NotImplementedError

    async def recover(self) -> None:
        raise NotImplementedError


async def paused_writer(f: FenceUnderTest, r: str) -> None:
    (t41,) = await f.tokens(r, 1)
    a1 = await f.publish(r, t41, await f.stage(r, t41, "a-1"), operation_id="a-1")
    assert isinstance(a1, Applied), a1
    a2_ref = await f.stage(r, t41, "a-2")  # A prepares its next output, then pauses (GC, VM stop)
    (t42,) = await f.tokens(r, 1)  # A's lease expired; B is granted 42
    assert t42 > t41
    b_ref = await f.stage(r, t42, "b")
    b = await f.publish(r, t42, b_ref, operation_id="b")
    assert isinstance(b, Applied), b
    before = await f.version(r)
    a2 = await f.publish(r, t41, a2_ref, operation_id="a-2")  # A resumes
    assert isinstance(a2, StaleFence), a2
    assert a2.token == t41 and "stale_fence" in a2.message, a2
    assert await f.visible(r) == b_ref
    assert await f.version(r) == before


async def late_41_after_42(f: FenceUnderTest, r: str) -> None:
    t41, t42 = await f.tokens(r, 2)
    a_ref = await f.stage(r, t41, "a")  # A sent this under 41; the network holds it
    b_ref = await f.stage(r, t42, "b")
    assert isinstance(await f.publish(r, t42, b_ref, operation_id="b"), Applied)
    before = await f.version(r)
    late = await f.publish(r, t41, a_ref, operation_id="a")  # delivered now
    assert isinstance(late, StaleFence), late
    assert await f.visible(r) == b_ref
    assert await f.version(r) == before


async def duplicated_current_token(f: FenceUnderTest, r: str) -> None:
    (t,) = await f.tokens(r, 1)
    x_ref = await f.stage(r, t, "x")
    first = await f.publish(r, t, x_ref, operation_id="op-x")
    assert isinstance(first, Applied), first
    after_first = await f.version(r)
    again = await f.publish(r, t, x_ref, operation_id="op-x")
    assert isinstance(again, Duplicate), again
    assert again.operation_id == "op-x"
    assert await f.version(r) == after_first  # not applied twice
    y_ref = await f.stage(r, t, "y")
    assert isinstance(await f.publish(r, t, y_ref, operation_id="op-y"), Applied)
    if f.remembers_operations:
        late = await f.publish(r, t, x_ref, operation_id="op-x")  # x retried after y
        assert isinstance(late, Duplicate), late
    assert await f.visible(r) == y_ref or not f.remembers_operations


async def reordered_same_token(f: FenceUnderTest, r: str) -> None:
    (t,) = await f.tokens(r, 1)
    base = await f.publish(r, t, await f.stage(r, t, "base"), operation_id="base")
    assert isinstance(base, Applied), base
    v0 = await f.version(r)
    one, two = await f.stage(r, t, "one"), await f.stage(r, t, "two")  # both prepared against v0
    second = await f.publish(r, t, two, operation_id="two", expected_version=v0)
    assert isinstance(second, Applied), second
    v1 = await f.version(r)
    first = await f.publish(r, t, one, operation_id="one", expected_version=v0)  # arrives late
    assert isinstance(first, Rejected), first
    assert first.code in ("version_conflict", "conflict"), first
    assert await f.visible(r) == two  # never moved back
    assert await f.version(r) == v1


async def crash_between_staging_and_publication(f: FenceUnderTest, r: str) -> None:
    t41, t42 = await f.tokens(r, 2)
    orphan = await f.stage(r, t41, "a")  # A staged under 41, then crashed before publishing
    assert await f.visible(r) is None
    assert orphan in await f.staged()
    b_ref = await f.stage(r, t42, "b")  # B (42) takes over and publishes its own output
    assert isinstance(await f.publish(r, t42, b_ref, operation_id="b"), Applied)
    await f.recover()
    left = await f.staged()
    assert orphan not in left, "recovery left the crashed writer's staged output"
    assert b_ref in left, "recovery deleted the object the pointer references"
    assert await f.visible(r) == b_ref


async def concurrent_writers(f: FenceUnderTest, r: str, n: int = 6) -> None:
    tokens = await f.tokens(r, n)
    refs = [await f.stage(r, t, f"w{i}") for i, t in enumerate(tokens)]
    pairs = list(zip(tokens, refs, strict=True))
    results = await asyncio.gather(
        *(f.publish(r, t, ref, operation_id=f"w{i}") for i, (t, ref) in enumerate(pairs))
    )
    for result in results:
        assert isinstance(result, Applied | StaleFence), results
    assert isinstance(results[-1], Applied), results  # the highest token always lands
    assert await f.visible(r) == refs[-1], results


BAD_TOKENS: list[Any] = ["abc", "", "-3", -1, 0, True, 4.2, "4.2", None, 2**63]


async def bad_tokens(f: FenceUnderTest, r: str) -> None:
    (t,) = await f.tokens(r, 1)
    ref = await f.stage(r, t, "good")
    assert isinstance(await f.publish(r, t, ref, operation_id="good"), Applied)
    before = (await f.visible(r), await f.version(r))
    bad_ref = await f.stage(r, t, "bad")
    for token in BAD_TOKENS:
        try:
            result = await f.publish(r, token, bad_ref, operation_id="bad")
        except ValueError as exc:  # FenceInputError, or the Publisher's own check
            assert ("token" in str(exc) or "fence" in str(exc)) and "\n" not in str(exc), exc
        else:
            assert isinstance(result, Rejected), (token, result)
        assert (await f.visible(r), await f.version(r)) == before, token


Scenario = Callable[[FenceUnderTest, str], Awaitable[None]]

CHECKLIST: dict[str, Scenario] = {
    "paused_writer": paused_writer,
    "late_41_after_42": late_41_after_42,
    "duplicated_current_token": duplicated_current_token,
    "reordered_same_token": reordered_same_token,
    "crash_between_staging_and_publication": crash_between_staging_and_publication,
    "concurrent_writers": concurrent_writers,
    "bad_tokens": bad_tokens,
}
