"""A device's reorder buffers at work (docs/semantics.md): when held chunks are applied.

A chunk that arrives ahead of a missing `seq` waits in its stream's buffer
(`edgemon.engine.reorder_buffer.Held`) until the missing one arrives, until it has waited
`allowed_lateness_ms` (the hole before it is then a declared gap), or until the buffer
overflows or the stream ends (every hole is a gap). `Reordering` says which held chunks
are due, in order, and declares the gaps; the device applies each chunk it yields
(`edgemon.engine.applier`), and the next one is chosen after that chunk has counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from edgemon.engine.outputs import GapDeclared
from edgemon.engine.reorder_buffer import MAX_HELD, Held
from edgemon.engine.stream import DRAINING
from edgemon.engine.timers import HoldEnd

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.engine.events import ChunkEvent
    from edgemon.engine.lateness import LatenessState
    from edgemon.engine.outputs import Output
    from edgemon.engine.stream import Stream
    from edgemon.engine.timers import TimerHeap

#: A held chunk to apply now, with the lateness horizon when it arrived.
Due = tuple["ChunkEvent", float]


class Reordering:
    """The waits of a device's reorder buffers: a part its `Applier` holds. It shares the
    device's streams (a stream no longer among them has its held chunks dropped), its late
    delivery (the waits and the horizon) and its timer heap; the buffers are the streams'."""

    __slots__ = ("_device_id", "_lateness", "_streams", "_timers")

    def __init__(
        self,
        device_id: str,
        *,
        streams: dict[str, Stream],
        lateness: LatenessState,
        timers: TimerHeap,
    ) -> None:
        self._device_id = device_id
        self._streams = streams
        self._lateness = lateness
        self._timers = timers

    def hold(
        self, stream: Stream, event: ChunkEvent, at: float
    ) -> Literal["accepted", "duplicate", "full"]:
        """Keep a chunk that arrived at `at` ahead of a missing `seq`, and arm its wait.
        "full": more than `MAX_HELD` are held, the holes are gaps now (apply `flush`)."""
        held = stream.held
        if held is None:
            held = stream.held = Held()
        if not held.add(event, at, self._lateness.horizon):
            return "duplicate"
        if len(held) > MAX_HELD:
            return "full"
        self._timers.push(self._lateness.hold_due(held), -1, HoldEnd(stream))
        return "accepted"

    def release(self, stream: Stream, at: float, out: list[Output]) -> Iterator[Due]:
        """The held chunks that now follow in `seq` order, one at a time."""
        held = stream.held
        assert held is not None
        while (due := held.take(stream.last_seq + 1)) is not None:
            if self._gone(stream):
                held.drain()
                break
            yield due
        self._left(stream, held, at, out)

    def waited(self, stream: Stream, now: float) -> bool:
        """A `HoldEnd` of `stream` came at `now`: whether its lowest held chunk has waited
        long enough (then apply `expire`). If the wait moved (a clock offset or a reload
        changed it), it is armed again."""
        held = stream.held
        if held is None:
            return False
        due = self._lateness.hold_due(held)
        if due <= now:
            return True
        self._timers.push(due, -1, HoldEnd(stream))
        return False

    def expire(self, stream: Stream, now: float, out: list[Output]) -> Iterator[Due]:
        """Holes whose next chunk has waited `allowed_lateness_ms` are gaps: each declared,
        then the chunks after it, in order."""
        held = stream.held
        assert held is not None
        lateness = self._lateness
        while len(held) and lateness.hold_due(held) <= now:
            event, floor = held.take_first()
            out.append(
                GapDeclared(self._device_id, stream.id, now, stream.last_seq + 1, event.seq - 1)
            )
            yield event, floor
            if self._gone(stream):
                held.drain()
                break
            while (follows := held.take(stream.last_seq + 1)) is not None:
                yield follows
        self._left(stream, held, now, out)

    def flush(self, stream: Stream, at: float, out: list[Output]) -> Iterator[Due]:
        """No more waiting (an `end`, an expiry or too many held): every held chunk, in
        order, each hole before one declared a gap."""
        held = stream.held
        assert held is not None
        for event, floor in held.drain():  # still held meanwhile: nothing confirmed half-way
            if self._gone(stream):
                break
            if event.seq > stream.last_seq + 1:
                out.append(
                    GapDeclared(self._device_id, stream.id, at, stream.last_seq + 1, event.seq - 1)
                )
            yield event, floor
        stream.held = None
        self._lateness.recheck(stream, at, out)

    def _gone(self, stream: Stream) -> bool:
        """The stream takes no more chunks: its final one came, or it was removed."""
        return stream.phase is DRAINING or stream.id not in self._streams

    def _left(self, stream: Stream, held: Held, now: float, out: list[Output]) -> None:
        """After applying held chunks: none left, the stream's underrun may be confirmed
        now; else the wait for the lowest one left is armed."""
        if not len(held):
            stream.held = None
            self._lateness.recheck(stream, now, out)
        else:
            self._timers.push(self._lateness.hold_due(held), -1, HoldEnd(stream))
