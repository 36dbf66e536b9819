"""Tombstones: ids of a device's recently removed streams (docs/semantics.md).

After a removal, chunks of the same stream id with `seq > 0` are dropped as duplicates for one
idle timeout (late redeliveries must not resurrect a stream). The record is bounded: at most a
few ids per allowed stream, the oldest dropped first.
"""

from __future__ import annotations

from edgemon.engine.state import DeviceState


class Tombstones(DeviceState):
    """The part of a `Device` that remembers removed stream ids (a base class of `Device`)."""

    __slots__ = ()

    def _bury(self, stream_id: str, now: float) -> None:
        """Remember a removed id for one idle timeout, at most a few per allowed stream."""
        tombstones = self.tombstones
        tombstones[stream_id] = now
        horizon = now - self.config.slack.stream_idle_timeout_ms
        cap = 4 * self.config.limits.max_streams_per_device
        while tombstones:
            oldest, when = next(iter(tombstones.items()))
            if when >= horizon and len(tombstones) <= cap:
                break
            del tombstones[oldest]
