"""A stream's reorder buffer: chunks that arrived ahead of a missing `seq` (docs/semantics.md).

Chunks of a stream are applied in `seq` order. One that arrives after a hole waits here until
the missing chunk arrives (then all that follow in order are applied) or until it has waited
`allowed_lateness_ms` (then the hole before it is declared a gap). The buffer is bounded: a
stream that runs further ahead than `MAX_HELD` chunks has its holes declared gaps at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from edgemon.engine.headroom import INF

if TYPE_CHECKING:
    from edgemon.engine.events import ChunkEvent

#: Most chunks one stream may hold back while waiting for a missing one.
MAX_HELD: Final = 32


class Held:
    """Chunks of one stream waiting for a missing `seq`, with when each arrived (device clock)
    and the device's lateness horizon then (`LatenessState.horizon`): an underrun the chunk
    ends is not ended before that horizon."""

    __slots__ = ("arrived", "chunks", "floors")

    def __init__(self) -> None:
        self.chunks: dict[int, ChunkEvent] = {}
        self.arrived: dict[int, float] = {}
        self.floors: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, event: ChunkEvent, at: float, floor: float = -INF) -> bool:
        """Hold `event`, arrived at `at` with the horizon at `floor`; False if that `seq` is
        held already (a duplicate)."""
        if event.seq in self.chunks:
            return False
        self.chunks[event.seq] = event
        self.arrived[event.seq] = at
        self.floors[event.seq] = floor
        return True

    def first_arrival(self) -> float:
        """When the lowest held chunk arrived: the hole before it waits from then."""
        return self.arrived[min(self.chunks)]

    def earliest_end(self) -> float:
        """The earliest instant a held chunk may end an underrun at (INF if none held)."""
        floors = self.floors
        return min(
            (max(e.t_ms, floors[seq]) for seq, e in self.chunks.items()),
            default=INF,
        )

    def take(self, seq: int) -> tuple[ChunkEvent, float] | None:
        """The held chunk of `seq` and its floor, taken out, if there is one."""
        event = self.chunks.pop(seq, None)
        if event is None:
            return None
        del self.arrived[seq]
        return event, self.floors.pop(seq)

    def take_first(self) -> tuple[ChunkEvent, float]:
        """The lowest held chunk and its floor, taken out."""
        pair = self.take(min(self.chunks))
        assert pair is not None
        return pair

    def drain(self) -> list[tuple[ChunkEvent, float]]:
        """Every held chunk with its floor, in `seq` order, taken out."""
        pairs = [(self.chunks[seq], self.floors[seq]) for seq in sorted(self.chunks)]
        self.chunks.clear()
        self.arrived.clear()
        self.floors.clear()
        return pairs
