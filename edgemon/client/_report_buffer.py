"""A `Reporter`'s buffer: the events reported and not yet taken for sending.

`EventBuffer` keeps them oldest first, each with its index (the order of reporting), and is
bounded: when it holds `max_buffered` events, the oldest chunk goes (starts and ends stay; a
buffer of nothing else drops its oldest). A chunk event waiting here may take more pieces of
its stream reported within one flush window (`merge_into`): a transport that splits one
server chunk into several reads still shows edgemon one arrival. The Reporter calls it under
its lock; the buffer has no lock of its own.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgemon.client._events import Event

#: An event with its index (the order it was reported in).
Indexed = tuple[int, "Event"]


class EventBuffer:
    """Events waiting to be sent, oldest first, bounded; the chunks still open to merging."""

    __slots__ = (
        "_first_at",
        "_open_chunks",
        "_pending",
        "dropped",
        "events",
        "flush_s",
        "max_batch",
        "max_buffered",
        "merge",
        "merged",
        "next_idx",
    )

    def __init__(self, *, max_buffered: int, max_batch: int, flush_s: float, merge: bool) -> None:
        self.max_buffered = max_buffered
        self.max_batch = max_batch
        self.flush_s = flush_s
        self.merge = merge
        self._pending: deque[Indexed] = deque()
        # A stream's last chunk event while it waits here and may take more pieces:
        # stream -> (monotonic time of its first piece, the event).
        self._open_chunks: dict[str, tuple[float, Event]] = {}
        #: Index of the next event reported.
        self.next_idx = 0
        self._first_at = 0.0  # monotonic time the oldest waiting event was reported
        #: Events reported (merged chunks count once), dropped, and chunk calls merged.
        self.events = 0
        self.dropped = 0
        self.merged = 0

    def __len__(self) -> int:
        return len(self._pending)

    def oldest(self) -> int | None:
        """Index of the oldest waiting event; None when none waits."""
        return self._pending[0][0] if self._pending else None

    # ------------------------------------------------------------------ merging
    def merge_into(self, stream: str, now: float) -> Event | None:
        """The stream's chunk event a piece reported at `now` (monotonic) may join: one still
        waiting, whose first piece is within one flush window; else None."""
        if not self.merge:
            return None
        waiting = self._open_chunks.get(stream)
        if waiting is not None and now - waiting[0] <= self.flush_s:
            return waiting[1]
        return None

    def merged_piece(self, stream: str, *, final: bool) -> None:
        """A piece joined the stream's waiting chunk event; a final one closes it."""
        self.merged += 1
        if final:
            self._open_chunks.pop(stream, None)

    def add_chunk(self, stream: str, event: Event, now: float, *, final: bool) -> bool:
        """Append a new chunk event (open to merging unless final); whether to wake the
        flusher (see `add`)."""
        if final:
            self._open_chunks.pop(stream, None)
        elif self.merge:
            self._open_chunks[stream] = (now, event)
        return self.add(event)

    def close_stream(self, stream: str) -> None:
        """No piece joins the stream's waiting chunk event any more (a start or an end)."""
        self._open_chunks.pop(stream, None)

    # ------------------------------------------------------------------ the queue
    def add(self, event: Event) -> bool:
        """Append `event` (the oldest chunk goes when full); whether the flusher should wake:
        the buffer was empty, or holds a full batch now."""
        pending = self._pending
        wake = not pending
        if wake:
            self._first_at = time.monotonic()
        elif len(pending) >= self.max_buffered:
            self.drop_oldest()
        pending.append((self.next_idx, event))
        self.next_idx += 1
        self.events += 1
        return wake or len(pending) == self.max_batch

    def drop_oldest(self) -> None:
        """Drop the oldest waiting chunk (the oldest event when none is a chunk)."""
        pending = self._pending
        position = next((i for i, (_, e) in enumerate(pending) if e["type"] == "chunk"), 0)
        _, event = pending[position]
        del pending[position]
        self.dropped += 1
        waiting = self._open_chunks.get(event["stream"])
        if waiting is not None and waiting[1] is event:
            del self._open_chunks[event["stream"]]

    def due_in(self, *, urgent: bool) -> float:
        """Seconds until a batch is due: 0 when `urgent` or a full batch waits, else when the
        oldest waiting event has waited one flush window."""
        if urgent or len(self._pending) >= self.max_batch:
            return 0.0
        return self._first_at + self.flush_s - time.monotonic()

    def take(self) -> list[Indexed]:
        """The oldest events, at most a batch; what is left is due at once."""
        pending = self._pending
        taken = [pending.popleft() for _ in range(min(len(pending), self.max_batch))]
        self._open_chunks.clear()  # taken events are final: no piece merges into them
        if pending:
            self._first_at = time.monotonic() - self.flush_s
        return taken

    def put_back(self, back: list[Indexed]) -> None:
        """Put taken events back ahead of newer ones (the bound kept), due at once."""
        self._pending.extendleft(reversed(back))
        while len(self._pending) > self.max_buffered:
            self.drop_oldest()
        self._first_at = time.monotonic() - self.flush_s
