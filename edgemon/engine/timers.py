"""A device's timers: one heap on the device's clock, and firing it in time order.

Each entry is `(instant, priority, id, what)`: a stream (its next crossing, expiry or
completion), a late-delivery wait (`ConfirmDeadline`, `HoldEnd`), the end of the throttle's minimum
on-time or a sample. At equal instants priority -1 (held chunks: messages) comes first, then 0
(timers), then 1 (samples); the throttle is decided once, after every change at the instant.
A stream's superseded entries stay in the heap, stale, until they surface or a compaction.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Final

from edgemon.engine.headroom import INF
from edgemon.engine.state import DeviceState
from edgemon.engine.stream import Stream

if TYPE_CHECKING:
    from edgemon.engine.lateness import ConfirmDeadline, HoldEnd
    from edgemon.engine.outputs import Output

#: Timer kinds besides streams and late-delivery waits.
MIN_ON: Final = "min_on"
SAMPLE: Final = "sample"

Timer = tuple[float, int, int, "Stream | str | ConfirmDeadline | HoldEnd"]


class TimerHeap(DeviceState):
    """The part of a `Device` that keeps and fires its timers (a base class of `Device`)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def advance_horizon(self, reached: float, wall_ms: float) -> None: ...
        def _wake(self, stream: Stream, now: float, out: list[Output]) -> None: ...
        def _timer(
            self, what: ConfirmDeadline | HoldEnd, now: float, out: list[Output]
        ) -> None: ...
        def _decide_throttle(self, now: float, out: list[Output]) -> None: ...
        def _sample(self, now: float, out: list[Output]) -> None: ...

    def next_timer(self) -> float:
        """The device-clock instant of the earliest pending timer (INF if none).

        Stale stream entries (superseded by a later push, or of a removed stream) are dropped
        from the top first, so the engine never schedules a wake-up that has nothing to do.
        """
        timers = self.timers
        while timers:
            due, _, _, what = timers[0]
            if type(what) is Stream and what.due != due:  # NaN once removed: never equal
                heappop(timers)
                continue
            return due
        return INF

    def catch_up(self, at: float, out: list[Output]) -> None:
        """Fire every timer due strictly before `at` (messages at `at` come before its timers)."""
        while self.timers and self.timers[0][0] < at:
            self.fire(out)

    def fire(self, out: list[Output]) -> float:
        """Fire all timers at the earliest pending instant, decide the throttle, then sample."""
        timers = self.timers
        instant = timers[0][0]
        wall = instant + self.clock.offset_ms
        self.clock.reach(instant, wall)
        self.advance_horizon(instant, wall)
        while timers and timers[0][0] == instant and timers[0][1] <= 0:
            what = heappop(timers)[3]
            if type(what) is Stream:
                if what.due == instant:  # else superseded, or removed (due is NaN)
                    self._wake(what, instant, out)
            elif isinstance(what, str):
                self.dirty = True  # the minimum on-time ran out
            else:
                assert not isinstance(what, Stream)
                self._timer(what, instant, out)
        if self.dirty:
            self._decide_throttle(instant, out)
        if timers and timers[0][0] == instant and timers[0][3] == SAMPLE:
            heappop(timers)
            self._sample(instant, out)
        return instant

    def decide_now(self, out: list[Output]) -> None:
        """Decide the throttle at the current instant, once its messages have all been applied."""
        instant = self.clock.floor_ms
        if self.timers and self.timers[0][0] <= instant:
            self.fire(out)  # timers at this very instant come first, then the decision
        elif self.dirty:
            self._decide_throttle(instant, out)

    def _push(
        self, due: float, priority: int, what: Stream | str | ConfirmDeadline | HoldEnd
    ) -> None:
        self._next_timer_id += 1
        timers = self.timers
        heappush(timers, (due, priority, self._next_timer_id, what))
        if len(timers) > self._compact_above:
            self._compact()

    def _compact(self) -> None:
        """Drop superseded entries buried in the heap (in place: `fire` may hold the list).

        A healthy stream's next crossing lies far ahead and moves later with every chunk, so
        superseded entries would otherwise pile up until their instants came. Rebuilding
        when the heap doubles keeps it within twice its live entries, O(1) amortised.
        """
        timers = self.timers
        timers[:] = [e for e in timers if type(e[3]) is not Stream or e[3].due == e[0]]
        heapify(timers)
        self._compact_above = 2 * len(timers) + 64
