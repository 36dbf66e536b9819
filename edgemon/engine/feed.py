"""The slack feed: what the players measured, per live stream, as the engine reads it.

For each stream of a device, the audio its player holds now, when its playback starts (or
started), and when its player was last heard from. A reader ages an entry itself: a stream's
slack falls one millisecond per millisecond once its playback has started, and not before. A
pause or a player's own stall moves its play start later; its Reporter says so with the next
chunk, so until then the feed understates that player's slack (never overstates it). The
daemon publishes it (`edgemon.daemon.slack_feed`, docs/protocol.md); the simulator feeds it to
its policies.

Pure: it reads the streams and computes nothing they do not already keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.engine.stream import DRAINING, LIVE

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.engine.stream import Stream


@dataclass(frozen=True, slots=True)
class SlackEntry:
    """One stream in the feed, at `t_ms` on its device's clock."""

    stream: str
    slack_ms: float
    """The audio its player holds ahead of playback (negative: concealing an underrun)."""
    play_start_ms: float
    """When its playback starts or started (infinite: not known yet)."""
    t_ms: float
    heard_ms: float = -math.inf
    """When its player's last event happened (the measurement's age is `t_ms` minus it)."""

    @property
    def playing(self) -> bool:
        """Its playback had started at `t_ms`."""
        return self.play_start_ms <= self.t_ms

    def slack_at(self, now_ms: float) -> float:
        """The slack this entry implies at `now_ms` (≥ `t_ms`), nothing arriving meanwhile."""
        return self.slack_ms - max(0.0, now_ms - max(self.t_ms, self.play_start_ms))


def slack_feed(streams: Iterable[Stream], now_ms: float) -> tuple[SlackEntry, ...]:
    """Every stream of `streams` with audio (live, or draining its final chunk) at `now_ms`."""
    return tuple(
        SlackEntry(s.id, s.slack_at(now_ms), s.start, now_ms, s.t_last_event)
        for s in streams
        if s.phase is LIVE or s.phase is DRAINING
    )
