"""A device's throttle (docs/semantics.md), decided from two counts the streams keep up to date.

Each live stream has two right-limit flags, "at risk" (`headroom < margin`) and "unsafe"
(`headroom < margin + hysteresis`); the throttle state counts how many of the device's streams
have each (`ThrottleState.note`), so the decision (`ThrottleState.decide`) never scans the
streams. ON on any risk; OFF when none is unsafe once the minimum on-time has passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from edgemon.engine.outputs import ThrottleChanged

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.stream import Stream

#: Most at-risk stream ids a throttle object lists (docs/protocol.md).
MAX_LISTED_STREAMS: Final = 16


class ThrottleState:
    """A device's throttle: a part a `Device` holds, owning the two counts, whether something
    changed that the decision of the current instant must see, and the throttle itself."""

    __slots__ = ("dirty", "on", "risk_count", "since", "unsafe_count")

    def __init__(self) -> None:
        #: How many of the device's streams are at risk / unsafe.
        self.risk_count = 0
        self.unsafe_count = 0
        #: Something changed that the throttle decision of the current instant must see.
        self.dirty = False
        #: Whether the throttle is on, and since when (device-clock ms) if so.
        self.on = False
        self.since = 0.0

    def note(self, stream: Stream, *, risk: bool, unsafe: bool) -> None:
        """Set a stream's two flags, keeping the counts."""
        if risk != stream.risk:
            self.risk_count += 1 if risk else -1
            stream.risk = risk
            self.dirty = True
        if unsafe != stream.unsafe:
            self.unsafe_count += 1 if unsafe else -1
            stream.unsafe = unsafe
            self.dirty = True

    def decide(self, now: float, min_on_ms: float) -> bool:
        """semantics.md from the two counts: ON on any risk, OFF when none unsafe after the
        minimum on-time. Whether the throttle changed (`since` still holds the onset after
        an OFF)."""
        self.dirty = False
        if not self.on:
            if self.risk_count:
                self.on = True
                self.since = now
                return True
        elif not self.unsafe_count and now >= self.since + min_on_ms:
            self.on = False
            return True
        return False

    def release(self) -> bool:
        """Turn the throttle off whatever the streams say (edgemon is stopping); whether it
        was on."""
        if self.on:
            self.on = False
            return True
        return False


def throttle_change(
    device_id: str, now: float, *, active: bool, live: Iterable[Stream], margin_ms: float
) -> ThrottleChanged:
    """The throttle object at `now`: the `live` streams' lowest headroom and, while active,
    the at-risk ones, lowest headroom first."""
    ranked = sorted((s.headroom_at(now), s.id, s.risk) for s in live)  # ids are unique
    at_risk = [sid for _, sid, risk in ranked if risk] if active else []
    return ThrottleChanged(
        device=device_id,
        t_ms=now,
        active=active,
        streams=tuple(at_risk[:MAX_LISTED_STREAMS]),
        min_headroom_ms=ranked[0][0] if ranked else None,
        margin_ms=margin_ms,
    )
