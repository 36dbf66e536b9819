"""What a chunk's arrival tells about its stream, on its own: audio, times, gap estimates, the
expected next chunk and the arrival statistics (docs/semantics.md, "Slack, ETA, headroom")."""

from __future__ import annotations

from edgemon.engine.arrival import take_chunk
from edgemon.engine.events import ChunkEvent
from edgemon.engine.stats import DeviceStats
from edgemon.engine.stream import Stream

from engine_parts import a_stream


def chunk(t: float, seq: int, audio: float, **fields: float | None) -> ChunkEvent:
    """A chunk of stream `s`."""
    return ChunkEvent(stream="s", t_ms=t, seq=seq, audio_ms=audio, **fields)  # type: ignore[arg-type]


def test_a_first_chunk_starts_playback_and_counts_the_wait_for_it() -> None:
    """A stream started by an event at 100 gets its first chunk at 150: playback starts then,
    time to first audio and start silence are 50, no slack at arrival is counted, and the
    next chunk is expected at its ETA."""
    stream = Stream(
        "s", t_ms=100.0, rebuffer=False, margin=0.0, margin_from_start=None,
        started_by_event=True, play_start_ms=None,
    )  # fmt: skip
    stats = DeviceStats()
    device_gap = take_chunk(
        stream, chunk(150.0, 0, 300.0, eta_ms=100.0), gap=False, stats=stats, device_gap=None,
        default_gap_ms=200.0,
    )  # fmt: skip
    assert device_gap is None
    assert (stream.start, stream.buffered, stream.chunks, stream.last_seq) == (150.0, 300.0, 1, 0)
    assert (stream.expected, stream.t_last_chunk, stream.first_audio_ms) == (250.0, 150.0, 50.0)
    assert (stats.time_to_first_audio.total, stats.start_silence.total) == (50.0, 50.0)
    assert (stats.slack_at_arrival.count, stats.chunks, stats.audio_ms) == (0, 1, 300.0)


def take(
    stream: Stream, event: ChunkEvent, stats: DeviceStats, device_gap: float | None = None
) -> float | None:
    """`take_chunk` of a chunk in `seq` order, with a default gap of 200 ms."""
    return take_chunk(
        stream, event, gap=False, stats=stats, device_gap=device_gap, default_gap_ms=200.0
    )


def test_later_chunks_count_slack_and_gaps_and_move_both_gap_estimates() -> None:
    """Each later chunk records the slack it found and the gap since the previous one; the
    gap moves the stream's and the device's EWMAs, and a chunk without an ETA is expected
    after the stream's estimate (the device's, then the default, while it has none)."""
    stream, stats = a_stream("s"), DeviceStats()
    assert take(stream, chunk(0.0, 0, 300.0), stats) is None
    assert stream.expected == 200.0
    assert take(stream, chunk(200.0, 1, 300.0), stats) == 200.0
    assert (stream.gap_ewma, stream.min_slack, stream.expected) == (200.0, 100.0, 400.0)
    device_gap = take(stream, chunk(300.0, 2, 300.0), stats, device_gap=500.0)
    assert device_gap == 0.3 * 100.0 + 0.7 * 500.0
    assert stream.gap_ewma == 0.3 * 100.0 + 0.7 * 200.0
    assert stream.expected == 300.0 + stream.gap_ewma
    assert (stats.slack_at_arrival.total, stats.chunk_gap.total) == (100.0 + 300.0, 300.0)
    fresh = a_stream("t")
    take(fresh, chunk(0.0, 0, 100.0), stats, device_gap=150.0)
    assert fresh.expected == 150.0


def test_pieces_of_one_delivery_leave_the_estimates_alone_and_a_gap_takes_the_total() -> None:
    """A chunk 10 ms after the previous one is a piece of the same delivery: counted as a
    gap of 10 but not moving the EWMAs. A chunk after a declared gap that reports the total
    audio sent takes that total, not the sum."""
    stream, stats = a_stream("s"), DeviceStats()
    take(stream, chunk(0.0, 0, 300.0), stats)
    device_gap = take(stream, chunk(10.0, 1, 50.0), stats)
    assert (device_gap, stream.gap_ewma, stats.chunk_gap.total) == (None, None, 10.0)
    take_chunk(
        stream, chunk(400.0, 5, 100.0, audio_total_ms=900.0), gap=True, stats=stats,
        device_gap=None, default_gap_ms=200.0,
    )  # fmt: skip
    assert (stream.buffered, stream.last_seq, stream.chunks) == (900.0, 5, 3)


def test_a_player_not_started_yet_is_not_consumed_and_its_start_silence_waits() -> None:
    """A prebuffering player reports play start 2^53 ("not yet") with its first chunk: its
    audio is not consumed and no start silence is counted; the chunk that gives its real
    start, 900 after the start event, fixes the start silence at 900, and a later move of
    the play start (a pause) leaves it there."""
    stream = Stream(
        "s", t_ms=100.0, rebuffer=False, margin=0.0, margin_from_start=None,
        started_by_event=True, play_start_ms=None,
    )  # fmt: skip
    stats = DeviceStats()
    take(stream, chunk(150.0, 0, 400.0, play_start_ms=float(2**53)), stats)
    assert (stream.start_silence_ms, stats.start_silence.count) == (None, 0)
    assert stream.slack_at(5_000.0) == 400.0
    take(stream, chunk(1_000.0, 1, 400.0, play_start_ms=1_000.0), stats)
    assert (stream.start_silence_ms, stats.start_silence.total) == (900.0, 900.0)
    take(stream, chunk(2_000.0, 2, 400.0, play_start_ms=1_500.0), stats)
    assert (stream.start_silence_ms, stats.start_silence.count) == (900.0, 1)
