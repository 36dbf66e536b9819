"""What a chunk's arrival tells about its stream (docs/semantics.md, "Slack, ETA, headroom").

Its audio and times, the gap since the stream's previous chunk (the stream's and the
device's gap EWMAs), when the next chunk is expected, and the device's arrival statistics:
slack at arrival, chunk gaps, time to first audio and start silence. The device decides
whether and when a chunk is applied (`edgemon.engine.applier`); this is the arithmetic, O(1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.headroom import INF
from edgemon.engine.stream import BURST_GAP_MS, EWMA_ALPHA
from edgemon.protocol import NOT_STARTED_MS

#: The weight an EWMA keeps of its old value.
KEEP = 1 - EWMA_ALPHA

if TYPE_CHECKING:
    from edgemon.engine.events import ChunkEvent
    from edgemon.engine.stats import DeviceStats
    from edgemon.engine.stream import Stream


def take_chunk(  # noqa: C901, PLR0912 - one pass over a chunk, on the hot path
    stream: Stream,
    event: ChunkEvent,
    gap: bool,
    stats: DeviceStats,
    device_gap: float | None,
    default_gap_ms: float,
) -> float | None:
    """Count `event` into `stream` (`gap`: it follows a declared gap, so the total audio it
    reports replaces the sum); return the device's gap EWMA `device_gap`, updated. (The
    arguments may come by position: a call with keywords costs more, once per chunk.)"""
    t = event.t_ms
    if stream.chunks:
        # What the chunk tells before its audio counts: slack at arrival, the gap.
        played = t - stream.start
        before = stream.buffered - played if played > 0.0 else stream.buffered
        if stream.rebuffer and before < 0.0:
            before = 0.0
            stream.start = t - stream.buffered  # the stalled player resumes now
        lowest = stream.min_slack
        if lowest is None or before < lowest:
            stream.min_slack = before
        stats.slack_at_arrival.observe(before)
        since = t - stream.t_last_chunk
        if since < 0.0:
            since = 0.0
        stats.chunk_gap.observe(since)
        if since >= BURST_GAP_MS:  # else a piece of the same delivery: no gap between them
            ewma = stream.gap_ewma
            stream.gap_ewma = since if ewma is None else EWMA_ALPHA * since + KEEP * ewma
            device_gap = since if device_gap is None else EWMA_ALPHA * since + KEEP * device_gap
    else:
        if stream.start == INF:
            stream.start = t
        if stream.t_start_event is not None:
            stream.first_audio_ms = t - stream.t_start_event
            stats.time_to_first_audio.observe(stream.first_audio_ms)
    if event.play_start_ms is not None:
        stream.start = event.play_start_ms
    if (
        stream.start_silence_ms is None
        and stream.t_start_event is not None
        and stream.start < NOT_STARTED_MS
    ):
        # The first chunk that knows the play start fixes the start silence: the first one,
        # unless its player had not started yet ("not yet": docs/protocol.md).
        stream.start_silence_ms = silence = max(0.0, stream.start - stream.t_start_event)
        stats.start_silence.observe(silence)
    if gap and event.audio_total_ms is not None:
        stream.buffered = event.audio_total_ms
    else:
        stream.buffered += event.audio_ms
    stream.chunks += 1
    stream.last_seq = event.seq
    stream.t_last_chunk = t
    if t > stream.t_last_event:
        stream.t_last_event = t
    stats.chunks += 1
    stats.audio_ms += event.audio_ms
    eta = event.eta_ms
    if eta is None:
        eta = stream.gap_ewma
        if eta is None:
            eta = device_gap
            if eta is None:
                eta = default_gap_ms
    stream.expected = t + eta
    return device_gap
