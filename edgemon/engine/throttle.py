"""A device's throttle (docs/semantics.md), decided from two counts the streams keep up to date.

Each live stream has two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`); the device counts how many of its streams have each, so
the decision never scans the streams. ON on any risk; OFF when none is unsafe once the
minimum on-time has passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from edgemon.engine.outputs import ThrottleChanged
from edgemon.engine.state import DeviceState
from edgemon.engine.timers import MIN_ON

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream

#: Most at-risk stream ids a throttle object lists (docs/protocol.md).
MAX_LISTED_STREAMS: Final = 16


class Throttle(DeviceState):
    """The part of a `Device` that decides its throttle (a base class of `Device`)."""

    __slots__ = ()

    if TYPE_CHECKING:

        @property
        def margin(self) -> float: ...
        def live_streams(self) -> list[Stream]: ...

    def _set_flags(self, stream: Stream, *, risk: bool, unsafe: bool) -> None:
        if risk != stream.risk:
            self._risk_count += 1 if risk else -1
            stream.risk = risk
            self.dirty = True
        if unsafe != stream.unsafe:
            self._unsafe_count += 1 if unsafe else -1
            stream.unsafe = unsafe
            self.dirty = True

    def _decide_throttle(self, now: float, out: list[Output]) -> None:
        """semantics.md from the two counts: ON on any risk, OFF when none unsafe after min-on."""
        self.dirty = False
        if not self.throttle_on:
            if self._risk_count:
                self.throttle_on = True
                self.throttle_since = now
                self.stats.throttle_engagements += 1
                min_on = self.config.slack.min_on_ms
                if min_on > 0:
                    self.timers.push(now + min_on, 0, MIN_ON)
                out.append(self._throttle_change(now))
        elif not self._unsafe_count and now >= self.throttle_since + self.config.slack.min_on_ms:
            self.throttle_on = False
            self.stats.throttle_ms += now - self.throttle_since
            out.append(self._throttle_change(now))

    def release(self, now: float, out: list[Output]) -> None:
        """Turn the throttle off at `now` whatever the streams say (edgemon is stopping)."""
        if self.throttle_on:
            self.throttle_on = False
            self.stats.throttle_ms += now - self.throttle_since
            out.append(self._throttle_change(now))

    def _throttle_change(self, now: float) -> ThrottleChanged:
        ranked = sorted((s.headroom_at(now), s.id) for s in self.live_streams())
        at_risk = [sid for _, sid in ranked if self.streams[sid].risk] if self.throttle_on else []
        return ThrottleChanged(
            device=self.id,
            t_ms=now,
            active=self.throttle_on,
            streams=tuple(at_risk[:MAX_LISTED_STREAMS]),
            min_headroom_ms=ranked[0][0] if ranked else None,
            margin_ms=self.margin,
        )
