"""The slicer that keeps scrapes out of the deadline task's way (`edgemon.adapters.exposition`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from edgemon.adapters.exposition import Slicer


@pytest.mark.asyncio
async def test_no_slice_starts_just_before_a_transition() -> None:
    """With a transition 1 ms away (within `clear_ms`), the slicer does not hand back to the
    scrape until the transition's task has run; with none near, it returns after one turn."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    due = loop.time() + 0.001
    loop.call_at(due, lambda: fired.append(loop.time()))

    def until_deadline() -> float | None:
        return None if fired else (due - loop.time()) * 1000.0

    slicer = Slicer(0.0, until_deadline=until_deadline, clear_ms=2.0)
    await slicer()
    assert fired  # the transition ran before the next slice could start
    await slicer()
    assert slicer.yields == 2


@pytest.mark.asyncio
async def test_the_wait_is_bounded() -> None:
    """A transition that never fires (a stuck deadline) holds a scrape for `max_wait_s` per
    slice, then lets it go on: each of three slices waits (it asks for the deadline again and
    again for at least `max_wait_s`) and returns (within a generous 5 s, liveness only: how
    long beyond `max_wait_s` is the machine's load, not judged)."""
    asked: list[float] = []

    def stuck() -> float:
        asked.append(time.perf_counter())
        return 0.0  # due now, for ever

    slicer = Slicer(0.0, until_deadline=stuck, max_wait_s=0.05)
    for n in range(1, 4):
        before = len(asked)
        began = time.perf_counter()
        async with asyncio.timeout(5):
            await slicer()
        assert slicer.yields == n
        assert len(asked) - before >= 2  # waited and asked again, not once and gone
        assert time.perf_counter() - began >= 0.05  # it did hold the slice back
