"""A watch stream silent past its inactivity timeout is dropped and resumed from the version
it had reached (Kopf's ``settings.watching.inactivity_timeout``, kept in our ListWatch:
docs/design.md), without a relist; a stream that keeps talking is not cut.

The streams are scripted (:class:`Stalling`): one hangs after its last chunk, as a TCP
connection whose peer vanished without a reset does; the timeout is the only thing that ends
it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fencedlease.watching import ListWatch, Watched

from .test_pod_watch import FakeApi, Response, lines, pod_list, run_until_exhausted

BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}}


class Stalling:
    """A watch body: ``chunks``, each ``gap`` seconds after the one before, then (``hang``)
    nothing more, ever: the connection is open and dead."""

    def __init__(self, chunks: Sequence[bytes], gap: float = 0.0, hang: bool = True) -> None:
        self.chunks, self.gap, self.hang = chunks, gap, hang

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            if self.gap:
                await asyncio.sleep(self.gap)
            yield chunk
        if self.hang:
            await asyncio.Event().wait()


def stalling(chunks: Sequence[bytes], gap: float = 0.0, hang: bool = True) -> Response:
    response = Response(200)
    response.content = Stalling(chunks, gap, hang)  # type: ignore[assignment]
    return response


def watch(fake: FakeApi, inactivity: float) -> tuple[ListWatch, list[Any]]:
    seen: list[Any] = []
    loop = ListWatch(
        fake,
        Watched("", "v1", "pods", "ns"),
        seen.append,
        inactivity_timeout=inactivity,
        pause=lambda failures: 0.0,
    )
    return loop, seen


async def test_a_silent_stream_is_resumed_from_its_version_without_a_relist() -> None:
    fake = FakeApi(lists=[pod_list("10", "a")], streams=[stalling(lines(BOOKMARK))])
    loop, seen = watch(fake, inactivity=0.2)
    await run_until_exhausted(loop, fake)
    # listed once; the first watch from the list's version went silent after a bookmark and
    # was dropped; the next one resumes from the bookmark's version
    assert fake.asked() == [("list", None), ("watch", "10"), ("watch", "12")]
    assert loop.silences == 1 and loop.lists == 1
    assert fake.responses[0].released  # the dead connection is given back
    assert [e["type"] for e in seen] == [None]


async def test_a_stream_silent_from_the_start_is_resumed_from_the_list() -> None:
    fake = FakeApi(lists=[pod_list("10", "a")], streams=[stalling([])])
    loop, _ = watch(fake, inactivity=0.2)
    await run_until_exhausted(loop, fake)
    assert fake.asked() == [("list", None), ("watch", "10"), ("watch", "10")]
    assert loop.silences == 1


async def test_a_stream_that_keeps_talking_is_not_cut() -> None:
    """Bookmarks a tenth of the timeout apart, for three timeouts in all: each one pushes the
    deadline on; the stream ends by itself (the server's timeout), then resumes."""
    bookmarks = [
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(11 + i)}}}
        for i in range(30)
    ]
    fake = FakeApi(
        lists=[pod_list("10", "a")], streams=[stalling(lines(*bookmarks), gap=0.1, hang=False)]
    )
    loop, _ = watch(fake, inactivity=1.0)
    await run_until_exhausted(loop, fake)
    assert loop.silences == 0
    assert fake.asked() == [("list", None), ("watch", "10"), ("watch", "40")]
