"""A stream's reorder buffer: chunks that arrived ahead of a missing `seq` (SPEC §2.8).

Chunks of a stream are applied in `seq` order. One that arrives after a hole waits here until
the missing chunk arrives (then all that follow in order are applied) or until it has waited
`allowed_lateness_ms` (then the hole before it is declared a gap). The buffer is bounded: a
stream that runs further ahead than `MAX_HELD` chunks has its holes declared gaps at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from edgemon.engine.events import ChunkEvent

#: Most chunks one stream may hold back while waiting for a missing one.
MAX_HELD: Final = 32


class Held:
    """Chunks of one stream waiting for a missing `seq`, with when each arrived (device clock)."""

    __slots__ = ("arrived", "chunks")

    def __init__(self) -> None:
        self.chunks: dict[int, ChunkEvent] = {}
        self.arrived: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, event: ChunkEvent, at: float) -> bool:
        """Hold `event`, arrived at `at`; False if that `seq` is held already (a duplicate)."""
        if event.seq in self.chunks:
            return False
        self.chunks[event.seq] = event
        self.arrived[event.seq] = at
        return True

    def first_arrival(self) -> float:
        """When the lowest held chunk arrived: the hole before it waits from then."""
        return self.arrived[min(self.chunks)]

    def take(self, seq: int) -> ChunkEvent | None:
        """The held chunk of `seq`, taken out, if there is one."""
        self.arrived.pop(seq, None)
        return self.chunks.pop(seq, None)

    def take_first(self) -> ChunkEvent:
        """The lowest held chunk, taken out."""
        event = self.chunks.pop(min(self.chunks))
        del self.arrived[event.seq]
        return event

    def drain(self) -> list[ChunkEvent]:
        """Every held chunk in `seq` order, taken out."""
        chunks = [self.chunks[seq] for seq in sorted(self.chunks)]
        self.chunks.clear()
        self.arrived.clear()
        return chunks
