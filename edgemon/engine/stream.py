"""One stream's state, updated in O(1) per event (docs/semantics.md)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Final

from edgemon.engine.headroom import INF, below, headroom, slack

if TYPE_CHECKING:
    from edgemon.engine.reorder_buffer import Held

EWMA_ALPHA = 0.3
#: Chunks of a stream closer than this are pieces of one delivery (a transport that split one
#: server chunk into several reads), not a gap between deliveries: the gap EWMAs skip them
#: (docs/semantics.md, "Slack, ETA, headroom"). Real TTS chunks are 80 ms of audio or more.
BURST_GAP_MS = 20.0


class Phase(Enum):
    """Where a stream is in its life (docs/semantics.md, "Live streams")."""

    WAITING = "waiting"  # start seen, no chunk yet
    LIVE = "live"  # playing, a next chunk is awaited
    DRAINING = "draining"  # final chunk applied, playing out


# The phases as module constants, for the per-event path: on Python 3.11 reading a member
# from its class (`Phase.LIVE`) costs ~70 ns, a module constant a few.
WAITING: Final = Phase.WAITING
LIVE: Final = Phase.LIVE
DRAINING: Final = Phase.DRAINING


class Stream:
    """Mutable per-stream state; the device drives it and keeps the counts in step."""

    __slots__ = (
        "buffered",
        "chunks",
        "due",
        "expected",
        "first_audio_ms",
        "gap_ewma",
        "held",
        "id",
        "last_seq",
        "longest_gap_ms",
        "margin",
        "margin_from_start",
        "min_slack",
        "phase",
        "rebuffer",
        "risk",
        "start",
        "start_silence_ms",
        "t_last_chunk",
        "t_last_event",
        "t_start_event",
        "underrun_ms",
        "underrun_provisional",
        "underrun_published",
        "underrun_since",
        "underruns",
        "unsafe",
    )

    def __init__(
        self,
        stream_id: str,
        *,
        t_ms: float,
        rebuffer: bool,
        margin: float,
        margin_from_start: float | None,
        started_by_event: bool,
        play_start_ms: float | None,
    ) -> None:
        self.id = stream_id
        self.phase = WAITING
        self.rebuffer = rebuffer
        self.margin = margin
        self.margin_from_start = margin_from_start
        self.start: float = INF if play_start_ms is None else play_start_ms
        self.buffered = 0.0
        self.expected = INF
        self.last_seq = -1
        self.t_last_chunk = t_ms
        self.t_last_event = t_ms
        self.t_start_event = t_ms if started_by_event else None
        self.first_audio_ms: float | None = None
        #: Start event to playback start, fixed by the first chunk (None: no start event).
        self.start_silence_ms: float | None = None
        self.gap_ewma: float | None = None
        self.chunks = 0
        self.min_slack: float | None = None
        #: Begin of the current underrun on the device's clock (its exact instant `u`).
        self.underrun_since: float | None = None
        #: Not yet confirmed by the device's event time (semantics.md): a late chunk may undo it.
        self.underrun_provisional = False
        #: `UnderrunBegan` was emitted for it (edgemon's clock reached `u` live).
        self.underrun_published = False
        #: Confirmed underruns (the record).
        self.underruns = 0
        self.underrun_ms = 0.0
        #: The longest confirmed underrun that has ended (docs/semantics.md, "Service level").
        self.longest_gap_ms = 0.0
        self.risk = False
        self.unsafe = False
        self.due = INF  # instant of this stream's entry in its device's timer heap
        self.held: Held | None = None  # chunks that arrived ahead of a missing seq

    # ------------------------------------------------------------------ queries
    def slack_at(self, t: float) -> float:
        """Slack at `t` (valid from the last event on)."""
        return slack(t, self.buffered, self.start, rebuffer=self.rebuffer)

    def eta_at(self, t: float) -> float:
        """Time from `t` until the next chunk is expected."""
        return max(0.0, self.expected - t)

    def headroom_at(self, t: float) -> float:
        """Slack minus ETA at `t`."""
        return headroom(t, self.buffered, self.start, self.expected, rebuffer=self.rebuffer)

    @property
    def empties_at(self) -> float:
        """When the buffered audio has played out (`start + B`)."""
        return self.start + self.buffered

    def expires_at(self, idle_timeout_ms: float) -> float:
        """When the stream is removed as `expired` if nothing more arrives."""
        if self.phase is WAITING:
            return self.t_last_event + idle_timeout_ms
        return max(self.t_last_event, self.empties_at) + idle_timeout_ms

    def flags_at(self, now: float, hysteresis_ms: float) -> tuple[bool, bool, float]:
        """Right-limit `(at risk, within hysteresis band, next instant either changes)`.

        The two thresholds share one curve, so this is `headroom.below` for both, fused.
        """
        if self.phase is not LIVE:
            return False, False, INF
        margin = self.margin
        buffered = self.buffered
        start = self.start
        expected = self.expected
        if self.rebuffer and margin <= 0.0:
            risk, risk_change = below(now, margin, buffered, start, expected, rebuffer=True)
            unsafe, unsafe_change = below(
                now, margin + hysteresis_ms, buffered, start, expected, rebuffer=True
            )
            return risk, unsafe, risk_change if risk_change < unsafe_change else unsafe_change
        lasts = start + buffered  # the buffer lasts until then
        high = margin + hysteresis_ms  # thresholds: margin (risk) ≤ margin + hysteresis
        falls = lasts - margin
        if falls < expected:  # the plateau S + B − E is below the margin
            return True, True, INF
        if now < falls:
            risk, change = False, falls
        else:
            risk, change = True, INF
        other = lasts - high
        if other < expected:
            return risk, True, change
        if now < other:
            unsafe = False
        else:
            unsafe, other = True, INF
        return risk, unsafe, change if change < other else other
