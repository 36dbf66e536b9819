"""The slack feed: what the players measured, per live stream, as the engine reads it.

edgemon's answer to the server's estimate of its players' buffers (issue 40): for each stream
of a device, the audio its player holds now and when its playback starts (or started). A
reader ages an entry itself: a stream's slack falls one millisecond per millisecond once its
playback has started, and not before. A pause or a player's own stall moves its play start
later; its Reporter says so with the next chunk, so until then the feed understates that
player's slack (never overstates it).

Pure: it reads the device's streams and computes nothing the device does not already keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.engine.stream import DRAINING, LIVE

if TYPE_CHECKING:
    from edgemon.engine.device import Device


@dataclass(frozen=True, slots=True)
class SlackEntry:
    """One stream in the feed, at `t_ms` on its device's clock."""

    stream: str
    slack_ms: float
    """The audio its player holds ahead of playback (negative: concealing an underrun)."""
    play_start_ms: float
    """When its playback starts or started (infinite: not known yet)."""
    t_ms: float

    @property
    def playing(self) -> bool:
        """Its playback had started at `t_ms`."""
        return self.play_start_ms <= self.t_ms

    def slack_at(self, now_ms: float) -> float:
        """The slack this entry implies at `now_ms` (≥ `t_ms`), nothing arriving meanwhile."""
        return self.slack_ms - max(0.0, now_ms - max(self.t_ms, self.play_start_ms))


def slack_feed(device: Device, now_ms: float) -> tuple[SlackEntry, ...]:
    """Every stream of `device` with audio (live, or draining its final chunk) at `now_ms`."""
    return tuple(
        SlackEntry(s.id, s.slack_at(now_ms), s.start, now_ms)
        for s in device.streams.values()
        if s.phase is LIVE or s.phase is DRAINING
    )
