"""A device's timers: one heap on the device's clock, in time order.

Each entry is `(instant, priority, id, what)`: a stream (its next crossing, expiry or
completion), a late-delivery wait (`ConfirmDeadline`, `HoldEnd`: `edgemon.engine.lateness`),
the end of the throttle's minimum on-time or a sample. At equal instants priority -1 (held
chunks: messages) comes first, then 0 (timers), then 1 (samples); the device fires them
(`Device.fire`) and decides the throttle once, after every change at the instant. A
stream's superseded entries stay in the heap, stale, until they surface or a compaction.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Final

from edgemon.engine.headroom import INF
from edgemon.engine.stream import Stream

#: Timer kinds besides streams and late-delivery waits.
MIN_ON: Final = "min_on"
SAMPLE: Final = "sample"


class ConfirmDeadline:
    """The confirmation deadline of a stream's provisional underrun at `u`: when it is
    confirmed for want of late chunks."""

    __slots__ = ("stream", "u")

    def __init__(self, stream: Stream, u: float) -> None:
        self.stream = stream
        self.u = u


class HoldEnd:
    """When a stream's held chunks may have waited long enough (a gap is declared then)."""

    __slots__ = ("stream",)

    def __init__(self, stream: Stream) -> None:
        self.stream = stream


Timer = tuple[float, int, int, "Stream | str | ConfirmDeadline | HoldEnd"]


class TimerHeap:
    """A device's pending timers: a part a `Device` holds, owning its heap. `heap[0]` is the
    earliest entry (the device reads it on its hot path)."""

    __slots__ = ("_compact_above", "_next_id", "heap")

    def __init__(self) -> None:
        self.heap: list[Timer] = []
        self._next_id = 0
        self._compact_above = 64

    def __len__(self) -> int:
        return len(self.heap)

    def next_due(self) -> float:
        """The device-clock instant of the earliest pending timer (INF if none).

        Stale stream entries (superseded by a later push, or of a removed stream) are dropped
        from the top first, so the engine never schedules a wake-up that has nothing to do.
        """
        heap = self.heap
        while heap:
            due, _, _, what = heap[0]
            if type(what) is Stream and what.due != due:  # NaN once removed: never equal
                heappop(heap)
                continue
            return due
        return INF

    def pop(self) -> Stream | str | ConfirmDeadline | HoldEnd:
        """Take the earliest entry off the heap; what it is for."""
        return heappop(self.heap)[3]

    def push(
        self, due: float, priority: int, what: Stream | str | ConfirmDeadline | HoldEnd
    ) -> None:
        """Arm a timer at device instant `due`."""
        self._next_id += 1
        heap = self.heap
        heappush(heap, (due, priority, self._next_id, what))
        if len(heap) > self._compact_above:
            self._compact()

    def _compact(self) -> None:
        """Drop superseded entries buried in the heap (in place: a firing may hold the list).

        A healthy stream's next crossing lies far ahead and moves later with every chunk, so
        superseded entries would otherwise pile up until their instants came. Rebuilding
        when the heap doubles keeps it within twice its live entries, O(1) amortised.
        """
        heap = self.heap
        heap[:] = [e for e in heap if type(e[3]) is not Stream or e[3].due == e[0]]
        heapify(heap)
        self._compact_above = 2 * len(heap) + 64
