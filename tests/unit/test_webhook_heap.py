"""The webhook process settles its heap once it serves (``settle_heap``): what startup left
alive is frozen out of the collector's walks, and the youngest generation is collected less
often (docs/performance.md, "The fenced write: nearly free": full collections paused every
review in flight for 80 to 250 ms)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from fencedlease.webhook.wiring import GEN0_THRESHOLD, settle_heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    """This test process's collector as it was, whatever the test did to it."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settle_heap_freezes_what_startup_left_and_raises_the_youngest_threshold(
    restored_gc: None,
) -> None:
    gc.unfreeze()
    startup = [{"module": i} for i in range(1000)]  # containers alive since "startup"
    _, gen1, gen2 = gc.get_threshold()

    frozen = settle_heap()

    assert frozen >= len(startup) and gc.get_freeze_count() == frozen
    assert gc.get_threshold() == (GEN0_THRESHOLD, gen1, gen2)
    assert GEN0_THRESHOLD > 700  # CPython's default, which collected every few reviews
    walked: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            walked.append(len(gc.get_objects(generation=2)))

    gc.callbacks.append(count)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(count)
    assert walked and walked[0] < frozen  # a full collection no longer walks startup's heap


def test_cyclic_garbage_made_after_settling_is_still_collected(restored_gc: None) -> None:
    settle_heap()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
