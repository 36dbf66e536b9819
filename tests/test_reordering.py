"""The reorder buffers' waits on their own (docs/semantics.md): a chunk ahead of a missing
`seq` waits, the chunks that follow in order are released, holes that waited long enough and
a flush are declared gaps. The test applies each chunk yielded, as the device does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine.events import ChunkEvent
from edgemon.engine.outputs import GapDeclared
from edgemon.engine.reorder_buffer import MAX_HELD
from edgemon.engine.timers import HoldEnd

from engine_parts import Parts, a_stream

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.engine.stream import Stream


def chunk(seq: int, t: float = 0.0) -> ChunkEvent:
    """A chunk of stream `s`."""
    return ChunkEvent(stream="s", t_ms=t, seq=seq, audio_ms=100.0)


def a_part(last_seq: int) -> tuple[Parts, Stream]:
    """Parts with stream `s`, whose chunks up to `last_seq` were applied."""
    parts, stream = Parts(), a_stream("s")
    stream.last_seq = last_seq
    parts.streams["s"] = stream
    return parts, stream


def applied(stream: Stream, due: Iterator[tuple[ChunkEvent, float]]) -> list[int]:
    """The `seq` of each chunk `due` yields, applied (its `seq` counted) before the next."""
    seqs = []
    for event, _ in due:
        stream.last_seq = event.seq
        seqs.append(event.seq)
    return seqs


def test_a_chunk_ahead_waits_until_the_missing_one_lets_it_follow() -> None:
    """Chunk 2 arrives at 10 after chunk 0: held, with its wait armed an allowed lateness
    later; held twice it is a duplicate. Once chunk 1 is applied, 2 follows and the buffer
    is gone."""
    parts, stream = a_part(0)
    reordering = parts.reordering
    assert reordering.hold(stream, chunk(2), 10.0) == "accepted"
    assert reordering.hold(stream, chunk(2), 20.0) == "duplicate"
    ((at, wait),) = parts.due()
    assert at == 1_010.0
    assert isinstance(wait, HoldEnd)
    assert not reordering.waited(stream, 500.0)
    stream.last_seq = 1
    assert applied(stream, reordering.release(stream, 30.0, parts.out)) == [2]
    assert (stream.held, parts.out) == (None, [])


def test_holes_that_waited_long_enough_are_declared_gaps() -> None:
    """Chunks 2 and 5 held at 0 after chunk 0: at 1000 both holes have waited the allowed
    lateness, so 1 and then 3–4 are declared gaps and 2 and 5 are applied, in order."""
    parts, stream = a_part(0)
    reordering = parts.reordering
    reordering.hold(stream, chunk(2), 0.0)
    reordering.hold(stream, chunk(5), 0.0)
    assert reordering.waited(stream, 1_000.0)
    assert applied(stream, reordering.expire(stream, 1_000.0, parts.out)) == [2, 5]
    assert parts.out == [GapDeclared("d", "s", 1_000.0, 1, 1), GapDeclared("d", "s", 1_000.0, 3, 4)]
    assert stream.held is None


def test_too_many_held_are_flushed_and_a_removed_stream_takes_no_more() -> None:
    """Holding more than `MAX_HELD` says "full"; a flush then declares the holes and yields
    every chunk in order, and stops at once when the stream is removed meanwhile."""
    parts, stream = a_part(0)
    reordering = parts.reordering
    seqs = range(2, 2 * MAX_HELD + 3, 2)  # MAX_HELD + 1 of them, a hole before each
    results = [reordering.hold(stream, chunk(seq), 0.0) for seq in seqs]
    assert results == ["accepted"] * MAX_HELD + ["full"]
    assert applied(stream, reordering.flush(stream, 50.0, parts.out)) == list(seqs)
    assert parts.out[:2] == [GapDeclared("d", "s", 50.0, 1, 1), GapDeclared("d", "s", 50.0, 3, 3)]
    assert len(parts.out) == MAX_HELD + 1
    assert stream.held is None
    for seq in (108, 109):
        reordering.hold(stream, chunk(seq), 60.0)
    for _event, _ in reordering.flush(stream, 70.0, parts.out):
        del parts.streams["s"]
    assert len(parts.out) == MAX_HELD + 2
    assert stream.held is None
