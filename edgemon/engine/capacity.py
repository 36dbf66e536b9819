"""What a device's engine says about its room for more streams (docs/protocol.md, capacity object).

The capacity object is published by the engine's scheduler (retained, at most once a second
and on change): the streams it can decode in real time now, what runs, what waits, the
predicted wait of a new request before its first audio, and how many requests it refused so
far. edgemon keeps the last one per device for its metrics, `/api/v1/capacity` and the
load balancer's agent check; it changes nothing else of the device.

The engine's `shed_total` is cumulative in the engine's life, so it starts again at 0 when
the engine restarts. `CapacityRecord.shed` adds across such restarts: a value lower than the
last one means a restart, and what was counted before it is kept, so the exported counter
never goes down (as Prometheus' `rate()` treats a counter reset, but kept in the counter
itself, so it also survives edgemon's own restarts through the snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Capacity:
    """One capacity object as received; None where the engine left a field out."""

    t_ms: float | None = None
    realtime_streams: float | None = None
    running: int | None = None
    waiting: int | None = None
    start_wait_ms: float | None = None
    shed_total: int | None = None

    @property
    def spare_streams(self) -> float | None:
        """Real-time streams the engine has room for now (`realtime_streams − running`, at
        least 0); None unless both are known."""
        if self.realtime_streams is None or self.running is None:
            return None
        return max(0.0, self.realtime_streams - self.running)

    def as_dict(self) -> dict[str, Any]:
        """The object's fields as JSON values (None for those left out)."""
        return {
            "t_ms": self.t_ms,
            "realtime_streams": self.realtime_streams,
            "running": self.running,
            "waiting": self.waiting,
            "start_wait_ms": self.start_wait_ms,
            "shed_total": self.shed_total,
        }


class CapacityRecord:
    """A device's last capacity object, when it was received, and its refusals counted across
    engine restarts (the module doc)."""

    __slots__ = ("_shed_before", "_shed_last", "last", "received_wall_ms")

    def __init__(
        self,
        last: Capacity,
        received_wall_ms: float,
        *,
        shed_before: int = 0,
        shed_last: int | None = None,
    ) -> None:
        self.last = last
        #: edgemon's wall time when `last` was received (ms).
        self.received_wall_ms = received_wall_ms
        #: Refusals counted by the engine's earlier lives (before its last restart).
        self._shed_before = shed_before
        #: The last `shed_total` received (kept when an object leaves it out).
        self._shed_last = (last.shed_total or 0) if shed_last is None else shed_last

    @property
    def shed(self) -> int:
        """Requests the engine refused, over all its lives seen: never decreases."""
        return self._shed_before + self._shed_last

    def update(self, capacity: Capacity, recv_wall_ms: float) -> None:
        """Take a newer object; a `shed_total` below the last one is the engine's restart."""
        total = capacity.shed_total
        if total is not None:
            if total < self._shed_last:
                self._shed_before += self._shed_last
            self._shed_last = total
        self.last = capacity
        self.received_wall_ms = recv_wall_ms

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON values (a snapshot's part)."""
        return {
            "last": self.last.as_dict(),
            "received_wall_ms": self.received_wall_ms,
            "shed_before": self._shed_before,
            "shed_last": self._shed_last,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityRecord:
        """The record `as_dict` gave (KeyError, TypeError or ValueError if malformed)."""
        last = data["last"]
        if not isinstance(last, dict):
            raise TypeError("capacity: `last` is not an object")
        return cls(
            Capacity(**{key: last[key] for key in Capacity.__slots__}),
            float(data["received_wall_ms"]),
            shed_before=int(data["shed_before"]),
            shed_last=int(data["shed_last"]),
        )
