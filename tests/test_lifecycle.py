"""The streams' lives on their own (docs/semantics.md): creation within the limit, each
stream's one next instant, expiry, completion, and removal with its summary and tombstone."""

from __future__ import annotations

from edgemon.engine.config import DeviceOverride, EngineConfig, Limits
from edgemon.engine.events import ChunkEvent, StartEvent
from edgemon.engine.outputs import StreamEnded, UnderrunConfirmed, UnderrunEnded
from edgemon.engine.reorder_buffer import Held
from edgemon.engine.stream import Phase
from edgemon.engine.timers import ConfirmDeadline

from engine_parts import Parts


def test_a_stream_begins_within_the_limit_with_its_margin_and_player() -> None:
    """A start event's margin and the operator's player are the stream's; a buried id comes
    back; past the device's stream limit no stream is made."""
    config = EngineConfig(
        limits=Limits(max_streams_per_device=2), devices={"d": DeviceOverride(player="rebuffer")}
    )
    parts = Parts(config)
    lifecycle = parts.lifecycle
    lifecycle.tombstones.bury("a", 0.0, keep_ms=1_000.0, cap=8)
    a = lifecycle.new_stream("a", 10.0, start=StartEvent(stream="a", t_ms=10.0, margin_ms=40.0))
    assert a is not None
    assert (parts.streams, a.margin, a.rebuffer, a.t_start_event) == ({"a": a}, 40.0, True, 10.0)
    assert "a" not in lifecycle.tombstones
    b = lifecycle.new_stream("b", 20.0, start=None)
    assert b is not None
    assert (b.margin, b.t_start_event, parts.stats.streams_started) == (80.0, None, 2)
    assert lifecycle.new_stream("c", 30.0, start=None) is None
    assert list(parts.streams) == ["a", "b"]


def test_removal_settles_the_underrun_and_buries_the_id_with_a_summary() -> None:
    """A live stream that ran dry at 100 (provisional, found at 150) and is removed at 200:
    the underrun is confirmed and ended, the stream leaves the live count and the counts
    the throttle is decided from, its id is buried, and its summary is emitted."""
    parts = Parts()
    lifecycle, out = parts.lifecycle, parts.out
    parts.applier.apply(ChunkEvent(stream="s", t_ms=0.0, seq=0, audio_ms=100.0), 0.0, out)
    stream = parts.streams["s"]
    assert (lifecycle.live, stream.risk, parts.throttle.risk_count) == (1, True, 1)
    lifecycle.refresh(stream, 150.0, out, timer=True)
    assert (stream.underrun_since, stream.underrun_provisional) == (100.0, True)
    lifecycle.remove(stream, "cancelled", 200.0, out)
    assert out == [
        UnderrunConfirmed("d", "s", 100.0, 200.0, published=False),
        UnderrunEnded("d", "s", 200.0, 100.0),
        StreamEnded(
            device="d", stream="s", t_ms=200.0, reason="cancelled", chunks=1, audio_ms=100.0,
            underruns=1, underrun_ms=100.0, min_slack_ms=None, time_to_first_audio_ms=None,
            start_silence_ms=None, longest_gap_ms=100.0, outcome="good",
        ),
    ]  # fmt: skip
    assert (parts.streams, lifecycle.live, parts.throttle.risk_count) == ({}, 0, 0)
    assert "s" in lifecycle.tombstones
    assert parts.stats.finished["cancelled"] == 1
    # Its stream timer is stale now; the underrun's old deadline is left to find it gone.
    ((at, deadline),) = parts.due()
    assert at == 1_100.0
    assert isinstance(deadline, ConfirmDeadline)


def test_each_stream_waits_for_its_one_next_instant() -> None:
    """A waiting stream's next instant is its expiry, and it is removed as expired then; a
    draining one's is when it has played out, and it is removed as completed then."""
    parts = Parts()
    lifecycle, out = parts.lifecycle, parts.out
    waiting = lifecycle.new_stream("w", 0.0, start=StartEvent(stream="w", t_ms=0.0))
    assert waiting is not None
    lifecycle.refresh(waiting, 0.0, out)
    parts.applier.apply(
        ChunkEvent(stream="f", t_ms=0.0, seq=0, audio_ms=100.0, final=True), 0.0, out
    )
    draining = parts.streams["f"]
    assert draining.phase is Phase.DRAINING
    assert parts.due() == [(100.0, draining), (30_000.0, waiting)]
    assert not lifecycle.wake(draining, 100.0, out)
    assert not lifecycle.wake(waiting, 30_000.0, out)
    assert [(o.stream, o.reason, o.t_ms) for o in out if isinstance(o, StreamEnded)] == [
        ("f", "completed", 100.0),
        ("w", "expired", 30_000.0),
    ]
    assert parts.streams == {}


def test_an_expiring_stream_with_held_chunks_is_not_idle() -> None:
    """At its expiry a stream that holds chunks waiting for a missing one is not removed:
    `wake` tells the device to apply them instead."""
    parts = Parts()
    stream = parts.lifecycle.new_stream("s", 0.0, start=StartEvent(stream="s", t_ms=0.0))
    assert stream is not None
    stream.held = Held()
    stream.held.add(ChunkEvent(stream="s", t_ms=0.0, seq=3, audio_ms=100.0), 0.0)
    assert parts.lifecycle.wake(stream, 30_000.0, parts.out)
    assert (parts.streams, parts.out) == ({"s": stream}, [])
