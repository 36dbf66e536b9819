"""The device's timer heap on its own: time order, priorities, stale stream entries."""

from __future__ import annotations

import math

from edgemon.engine.headroom import INF
from edgemon.engine.stream import Stream
from edgemon.engine.timers import MIN_ON, SAMPLE, TimerHeap


def a_stream(stream_id: str) -> Stream:
    """A bare stream, as a timer's subject."""
    return Stream(
        stream_id, t_ms=0.0, rebuffer=False, margin=0.0, margin_from_start=None,
        started_by_event=False, play_start_ms=None,
    )  # fmt: skip


def test_entries_come_by_instant_then_priority_then_push_order() -> None:
    """At one instant a held-chunk wait (-1) comes before timers (0), and those before a
    sample (1); timers at one instant and priority come in the order they were pushed."""
    timers = TimerHeap()
    assert timers.next_due() == INF
    timers.push(20.0, 1, SAMPLE)
    timers.push(20.0, 0, MIN_ON)
    timers.push(20.0, 0, "second")
    timers.push(20.0, -1, "held")
    timers.push(10.0, 1, "earlier")
    assert timers.next_due() == 10.0
    assert [timers.pop() for _ in range(len(timers))] == [
        "earlier", "held", MIN_ON, "second", SAMPLE,
    ]  # fmt: skip
    assert timers.next_due() == INF


def test_a_superseded_or_removed_streams_entries_are_dropped() -> None:
    """A stream re-armed later leaves its earlier entry stale: `next_due` skips it, and so
    does it for a removed stream (due NaN); compaction keeps only live entries in the heap."""
    timers = TimerHeap()
    moved, removed = a_stream("moved"), a_stream("removed")
    moved.due = 5.0
    timers.push(5.0, 0, moved)
    moved.due = 30.0
    timers.push(30.0, 0, moved)
    removed.due = 8.0
    timers.push(8.0, 0, removed)
    removed.due = math.nan
    assert timers.next_due() == 30.0
    assert len(timers) == 1
    for n in range(200):  # stale entries buried under a later live one
        moved.due = 100.0 + n
        timers.push(moved.due, 0, moved)
    assert len(timers) <= 2 * 1 + 64 + 1
    assert timers.next_due() == 299.0
