"""What each event does to a device's streams, on its own: the result of each event, and
chunks ahead of a missing `seq` held and applied in order (docs/semantics.md)."""

from __future__ import annotations

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.engine.events import ChunkEvent, EndEvent, StartEvent
from edgemon.engine.outputs import GapDeclared, StreamEnded
from edgemon.engine.timers import HoldEnd

from engine_parts import Parts


def chunk(seq: int, t: float) -> ChunkEvent:
    """A chunk of stream `s`."""
    return ChunkEvent(stream="s", t_ms=t, seq=seq, audio_ms=300.0)


def test_each_event_has_its_result() -> None:
    """start, chunk and end are accepted once; repeated they are duplicates, and so is a
    late chunk of the removed stream; an end of a stream never seen is an unknown stream."""
    parts = Parts()
    apply, out = parts.applier.apply, parts.out
    assert apply(StartEvent(stream="s", t_ms=0.0), 0.0, out) == "accepted"
    assert apply(StartEvent(stream="s", t_ms=0.0), 0.0, out) == "duplicate"
    assert apply(chunk(0, 10.0), 10.0, out) == "accepted"
    assert parts.lifecycle.live == 1
    assert apply(chunk(0, 10.0), 20.0, out) == "duplicate"
    assert apply(EndEvent(stream="s", t_ms=30.0), 30.0, out) == "accepted"
    assert [o.reason for o in out if isinstance(o, StreamEnded)] == ["completed"]
    assert apply(EndEvent(stream="s", t_ms=30.0), 40.0, out) == "duplicate"
    assert apply(chunk(1, 50.0), 50.0, out) == "duplicate"
    assert apply(EndEvent(stream="x", t_ms=30.0), 60.0, out) == "unknown_stream"
    assert (parts.lifecycle.live, parts.streams) == (0, {})


def test_a_chunk_ahead_is_held_then_applied_in_order_or_after_a_gap() -> None:
    """Chunk 2 before 1 waits (counted as accepted); chunk 1 brings it along. Chunk 4 then
    waits for 3, which never comes: when its wait ends, 3 is declared a gap and 4 applied."""
    parts = Parts()
    apply, out = parts.applier.apply, parts.out
    apply(chunk(0, 0.0), 0.0, out)
    assert apply(chunk(2, 10.0), 10.0, out) == "accepted"
    stream = parts.streams["s"]
    assert (stream.last_seq, stream.chunks) == (0, 1)
    assert apply(chunk(1, 20.0), 20.0, out) == "accepted"
    assert (stream.last_seq, stream.chunks, stream.held) == (2, 3, None)
    apply(chunk(4, 30.0), 30.0, out)
    waits = [(at, what) for at, what in parts.due() if isinstance(what, HoldEnd)]
    assert [at for at, _ in waits] == [1_010.0, 1_030.0]  # chunk 2's wait, moot now
    for at, wait in waits:
        parts.applier.timer(wait, at, out)
    assert [o for o in out if isinstance(o, GapDeclared)] == [GapDeclared("d", "s", 1_030.0, 3, 3)]
    assert (stream.last_seq, stream.chunks, stream.held) == (4, 4, None)


def test_without_lateness_a_chunk_after_a_hole_is_a_gap_at_once() -> None:
    """With `allowed_lateness_ms` 0 nothing waits: chunk 2 after chunk 0 is applied as a gap."""
    parts = Parts(EngineConfig(slack=SlackPolicy(allowed_lateness_ms=0.0)))
    parts.applier.apply(chunk(0, 0.0), 0.0, parts.out)
    assert parts.applier.apply(chunk(2, 10.0), 10.0, parts.out) == "gap"
    assert parts.streams["s"].last_seq == 2
