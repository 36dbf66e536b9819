"""Tombstones: ids of a device's recently removed streams (docs/semantics.md).

After a removal, chunks of the same stream id with `seq > 0` are dropped as duplicates for one
idle timeout (late redeliveries must not resurrect a stream). The record is bounded: at most a
few ids per allowed stream, the oldest dropped first.
"""

from __future__ import annotations


class Tombstones:
    """A device's removed stream ids and when each was removed (device-clock ms), oldest
    first. A part the device's streams' lives (`Lifecycle`) hold; it owns its one field."""

    __slots__ = ("_removed",)

    def __init__(self, removed: dict[str, float] | None = None) -> None:
        self._removed: dict[str, float] = {} if removed is None else dict(removed)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._removed

    def __len__(self) -> int:
        return len(self._removed)

    def bury(self, stream_id: str, now: float, *, keep_ms: float, cap: int) -> None:
        """Remember a removed id for `keep_ms`, at most `cap` ids (the oldest go first)."""
        removed = self._removed
        removed[stream_id] = now
        horizon = now - keep_ms
        while removed:
            oldest, when = next(iter(removed.items()))
            if when >= horizon and len(removed) <= cap:
                break
            del removed[oldest]

    def unbury(self, stream_id: str) -> None:
        """The id is a live stream again (a new `start`, or a chunk with `seq` 0)."""
        self._removed.pop(stream_id, None)

    def as_dict(self) -> dict[str, float]:
        """A copy, id → removal instant, oldest first (for snapshots)."""
        return dict(self._removed)
