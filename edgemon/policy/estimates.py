"""What a server can estimate of its players: how much audio each holds.

A player (docs/client.md, and the players of the closed loop) starts after its first chunk,
with a prebuffer sized to the wait the server announced for the second chunk (its frames
times the step estimate then) plus a cushion; from then on it plays one frame of audio per
frame of time. So the server can estimate what a stream's player holds:

    held ≈ audio of the chunks sent − (now − first chunk sent)     (the peers' estimated lead)
           + the announced wait beyond the first chunk's audio + the player's prebuffer

(`prebuffer_ms`: its cushion and the delivery to it). The peers stop at the first line, a
lower bound for a player that started later. A player that paused, stalled or waited longer
holds more than this, one that started sooner less; only the players' own reports (edgemon's
daemon) know.

Pure and clock-free: `Deadlines` owns a `PlayerEstimates` and shows it the running streams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.policy.values import Running


def sent_frames(emitted: int, first: int, later: int) -> int:
    """Frames in the chunks a stream that emitted `emitted` has sent: a first chunk of
    `first` frames, then chunks of `later` (0: the rest is one last chunk)."""
    if emitted < first:
        return 0
    return first + ((emitted - first) // later * later if later > 0 else 0)


def next_frames(emitted: int, first: int, later: int) -> int:
    """The frames a stream that emitted `emitted` still makes before its next chunk is sent
    (`later` 0: 0 once its first chunk is out)."""
    if emitted < first:
        return first - emitted
    return later - (emitted - first) % later if later > 0 else 0


class PlayerEstimates:
    """The step announced to each running stream at its first chunk, and what its player
    is estimated to hold."""

    __slots__ = ("_announced", "first_frames", "frame_ms", "prebuffer_ms", "second_frames")

    def __init__(
        self, first_frames: int, second_frames: int, prebuffer_ms: float, frame_ms: float
    ) -> None:
        self.first_frames = first_frames
        self.second_frames = second_frames
        self.prebuffer_ms = prebuffer_ms
        self.frame_ms = frame_ms
        self._announced: dict[str, float] = {}  # stream -> the step announced at its first chunk

    def see(self, running: Sequence[Running], announced_ms: float) -> None:
        """The running streams now; one first seen with its first chunk out is taken to have
        been announced `announced_ms` (the step the server announces now)."""
        seen = self._announced
        self._announced = {
            r.id: seen.get(r.id, announced_ms) for r in running if r.first_chunk_ms is not None
        }

    def sent_frames(self, emitted: int) -> int:
        """Frames in the chunks a stream that emitted `emitted` has sent."""
        return sent_frames(emitted, self.first_frames, self.second_frames)

    def least_held_ms(self, now_ms: float, running: Sequence[Running]) -> float | None:
        """The least audio a running stream's player is estimated to hold (None while no
        stream seen has sent a chunk)."""
        least: float | None = None
        first_audio = self.first_frames * self.frame_ms
        for r in running:
            step = self._announced.get(r.id)
            if step is None or r.first_chunk_ms is None:
                continue
            lead = self.sent_frames(r.emitted_frames) * self.frame_ms - (now_ms - r.first_chunk_ms)
            held = lead + max(0.0, self.second_frames * step - first_audio) + self.prebuffer_ms
            if least is None or held < least:
                least = held
        return least
