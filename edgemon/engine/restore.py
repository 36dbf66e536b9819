"""A device taking its streams back from a snapshot (`edgemon.engine.snapshot`).

A snapshot holds what events built up; what can be derived (risk flags, counts, timers) is
recomputed here, from the instant the device's clock resumes at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.lateness import ConfirmDeadline, HoldEnd
from edgemon.engine.state import DeviceState
from edgemon.engine.stream import Phase
from edgemon.engine.timers import MIN_ON

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream


class Restore(DeviceState):
    """The part of a `Device` that adopts restored streams (a base class of `Device`)."""

    __slots__ = ()

    if TYPE_CHECKING:

        def _margin_for(self, from_start: float | None) -> float: ...
        def _refresh(
            self, stream: Stream, now: float, out: list[Output], *, timer: bool = False
        ) -> None: ...

    def adopt(self, stream: Stream) -> None:
        """Take a restored stream; its margin follows the configuration in force now."""
        stream.margin = self._margin_for(stream.margin_from_start)
        self.streams[stream.id] = stream
        if stream.phase is Phase.LIVE:
            self.live += 1
        if stream.underrun_since is not None and not stream.underrun_provisional:
            self.lateness.open_underruns[stream.id] = stream
        if stream.underrun_provisional and stream.underrun_since is not None:
            self.lateness.provisional[stream.id] = stream
            u = stream.underrun_since
            self.timers.push(self.lateness.lateness_due(u), 0, ConfirmDeadline(stream, u))
        if stream.held is not None:
            self.timers.push(self.lateness.hold_due(stream.held), -1, HoldEnd(stream))

    def restore_timers(self, at: float) -> None:
        """Recompute flags, counts and timers of adopted streams from instant `at` on."""
        for stream in list(self.streams.values()):
            self._refresh(stream, at, [])
        min_on_until = self.throttle.since + self.config.slack.min_on_ms
        if self.throttle.on and min_on_until > at:
            self.timers.push(min_on_until, 0, MIN_ON)
        self.throttle.dirty = True
