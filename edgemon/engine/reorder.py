"""A stream's reorder buffer: chunks that arrived ahead of a missing `seq` (SPEC §2.8).

Chunks of a stream are applied in `seq` order. One that arrives after a hole waits here until
the missing chunk arrives (then both are applied, in order) or until its deadline, one
`allowed_lateness_ms` after the first chunk was held (then the hole is declared a gap). The
buffer is bounded: a stream that runs further ahead than `MAX_HELD` chunks has its hole
declared a gap at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from edgemon.engine.events import ChunkEvent

#: Most chunks one stream may hold back while waiting for a missing one.
MAX_HELD: Final = 32


class Held:
    """Chunks of one stream waiting for a missing `seq`, and until when (device clock)."""

    __slots__ = ("chunks", "until")

    def __init__(self, until: float) -> None:
        self.chunks: dict[int, ChunkEvent] = {}
        self.until = until

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, event: ChunkEvent) -> bool:
        """Hold `event`; False if a chunk of that `seq` is held already (a duplicate)."""
        if event.seq in self.chunks:
            return False
        self.chunks[event.seq] = event
        return True

    def next_after(self, seq: int) -> ChunkEvent | None:
        """The held chunk that follows `seq` directly, taken out, if there is one."""
        return self.chunks.pop(seq + 1, None)

    def drain(self) -> list[ChunkEvent]:
        """Every held chunk in `seq` order, taken out."""
        chunks = [self.chunks[seq] for seq in sorted(self.chunks)]
        self.chunks.clear()
        return chunks
