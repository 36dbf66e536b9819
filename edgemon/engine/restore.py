"""A device taking its streams back from a snapshot (`edgemon.engine.snapshot`).

A snapshot holds what events built up; what can be derived (risk flags, counts, timers) is
recomputed by the device (`Device.restore_timers`), from the instant its clock resumes at.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.lifecycle import Lifecycle
from edgemon.engine.stream import Phase
from edgemon.engine.timers import ConfirmDeadline, HoldEnd

if TYPE_CHECKING:
    from edgemon.engine.stream import Stream


class Restore(Lifecycle):
    """A `Device` adopting restored streams (its base class; creating and removing them,
    `Lifecycle`, is this one's)."""

    __slots__ = ()

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
