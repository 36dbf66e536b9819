"""The slicer that keeps scrapes out of the deadline task's way (`edgemon.adapters.exposition`)."""

from __future__ import annotations

import asyncio

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
    """A transition that never fires (a stuck deadline) holds a scrape for `max_wait_s` at most
    per slice, not forever (a generous bound: 50 ms of sleeps in 5 s)."""
    slicer = Slicer(0.0, until_deadline=lambda: 0.0, max_wait_s=0.05)
    async with asyncio.timeout(5):
        await slicer()
