"""Per-device cumulative counters and histograms (what the metrics exporter reads)."""

from __future__ import annotations

from collections import Counter

from edgemon.engine.histogram import (
    CHUNK_GAP_MS,
    LONGEST_GAP_MS,
    SLACK_AT_ARRIVAL_MS,
    START_SILENCE_MS,
    TIME_TO_FIRST_AUDIO_MS,
    Histogram,
)

#: `end` reasons kept as they are in `edgemon_streams_finished_total{reason}`; others fold.
FINISH_REASONS = frozenset({"completed", "cancelled", "error", "expired"})


def fold_reason(reason: str) -> str:
    """Bound the `reason` label: known reasons stay, anything else is `other`."""
    return reason if reason in FINISH_REASONS else "other"


class DeviceStats:
    """Monotonic totals for one device (all times in milliseconds)."""

    __slots__ = (
        "audio_ms",
        "chunk_gap",
        "chunks",
        "finished",
        "longest_gap",
        "slack_at_arrival",
        "slo",
        "start_silence",
        "streams_started",
        "throttle_engagements",
        "throttle_ms",
        "time_to_first_audio",
        "underrun_ms",
        "underruns",
        "underruns_retracted",
    )

    def __init__(self) -> None:
        self.chunks = 0
        self.audio_ms = 0.0
        self.streams_started = 0
        self.finished: Counter[str] = Counter()
        self.underruns = 0  # confirmed (docs/semantics.md)
        self.underruns_retracted = 0  # announced live, then shown never to have happened
        self.underrun_ms = 0.0
        self.throttle_engagements = 0
        self.throttle_ms = 0.0
        self.slack_at_arrival = Histogram(SLACK_AT_ARRIVAL_MS)
        self.chunk_gap = Histogram(CHUNK_GAP_MS)
        self.time_to_first_audio = Histogram(TIME_TO_FIRST_AUDIO_MS)
        #: A start event (the request) to its playback start: what the listener waited.
        self.start_silence = Histogram(START_SILENCE_MS)
        #: Each ended stream's longest gap (streams that played audio), and its outcome
        #: (docs/semantics.md, "Service level").
        self.longest_gap = Histogram(LONGEST_GAP_MS)
        self.slo: Counter[str] = Counter()
