"""The device's throttle state on its own: the counts, the decision, min-on, release."""

from __future__ import annotations

from edgemon.engine.stream import Stream
from edgemon.engine.throttle import ThrottleState, throttle_change


def a_stream(stream_id: str) -> Stream:
    """A bare stream, whose flags the throttle state keeps."""
    return Stream(
        stream_id, t_ms=0.0, rebuffer=False, margin=0.0, margin_from_start=None,
        started_by_event=False, play_start_ms=None,
    )  # fmt: skip


def test_on_at_any_risk_off_when_none_unsafe_after_min_on() -> None:
    """One stream at risk turns it on (and marks the instant dirty until decided); when the
    stream is only unsafe it stays on; once neither, it turns off only after min-on."""
    state = ThrottleState()
    stream = a_stream("s")
    assert not state.decide(0.0, 100.0)
    state.note(stream, risk=True, unsafe=True)
    assert (state.dirty, state.risk_count, state.unsafe_count) == (True, 1, 1)
    assert state.decide(10.0, 100.0)
    assert (state.on, state.since, state.dirty) == (True, 10.0, False)
    state.note(stream, risk=False, unsafe=True)
    assert not state.decide(20.0, 100.0)
    state.note(stream, risk=False, unsafe=False)
    assert (state.risk_count, state.unsafe_count) == (0, 0)
    assert not state.decide(109.0, 100.0)
    assert state.decide(110.0, 100.0)
    assert (state.on, state.since) == (False, 10.0)


def test_noting_unchanged_flags_changes_nothing() -> None:
    """Setting a stream's flags to what they are already keeps the counts and is not a
    change the decision must see; `release` turns it off once, only when on."""
    state = ThrottleState()
    stream = a_stream("s")
    state.note(stream, risk=False, unsafe=False)
    assert (state.dirty, state.risk_count, state.unsafe_count) == (False, 0, 0)
    assert not state.release()
    state.note(stream, risk=True, unsafe=True)
    state.decide(0.0, 0.0)
    assert state.release()
    assert not state.on
    assert not state.release()


def test_the_throttle_object_lists_at_risk_streams_lowest_headroom_first() -> None:
    """Active: at-risk ids by headroom (ties by id); inactive: none listed, but the lowest
    headroom still reported."""
    streams = [a_stream(sid) for sid in ("b", "a", "c")]
    for stream, buffered in zip(streams, (50.0, 50.0, 10.0), strict=True):
        stream.start, stream.buffered, stream.chunks = 0.0, buffered, 1
    streams[0].risk = streams[1].risk = True
    on = throttle_change("d", 0.0, active=True, live=streams, margin_ms=5.0)
    assert on.streams == ("a", "b")
    assert on.min_headroom_ms == streams[2].headroom_at(0.0)
    off = throttle_change("d", 0.0, active=False, live=streams, margin_ms=5.0)
    assert (off.streams, off.min_headroom_ms) == ((), on.min_headroom_ms)
