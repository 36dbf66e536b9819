"""What edgemon keeps of each device's capacity objects (docs/protocol.md, capacity object;
the object itself, as read: `edgemon.capacity_object`).

The capacity object is published by the engine's scheduler (retained, at most once a second
and on change, and again at least every few seconds): the streams it can decode in real time
now, what runs, what waits, the predicted wait of a new request before its first audio, and
how many requests it refused so far. edgemon keeps the last one per device for its metrics,
`/api/v1/capacity` and the load balancer's agent check; it changes nothing else of the device.

Its power is bounded (docs/protocol.md):
- an object older than `CAPACITY_MAX_AGE_MS` (`CapacityRecord.fresh`) counts for nothing in
  the agent check and is marked stale in `/api/v1/capacity`;
- an unreadable object, or an emptied topic (the engine went away), voids the device's last
  one (`void`): nothing is known until the next;
- the refusals counted move by plausible steps only.

The engine's `shed_total` is cumulative in the engine's life, so it starts again at 0 when
the engine restarts. `CapacityRecord.shed` adds across such restarts: a value lower than the
last one means a restart, and what was counted before it is kept, so the exported counter
never goes down (as Prometheus' `rate()` treats a counter reset, but kept in the counter
itself, so it also survives edgemon's own restarts through the snapshot). Each step up (or
the new life's count after a restart) is taken from an allowance of `SHED_BURST` refusals
refilled at `SHED_RATE_PER_S`; what a step claims beyond it is not counted (`shed_cut`), so
objects swinging between 2^53 and 0 move the counter by little. The first object's count,
the engine's history before edgemon heard of it, is taken as it is.
"""

from __future__ import annotations

from typing import Any

from edgemon.capacity_object import Capacity
from edgemon.protocol import CAPACITY_MAX_AGE_MS, SHED_BURST, SHED_RATE_PER_S, capacity_age_ms


class CapacityRecord:
    """A device's last capacity object (None once voided), when it was received, and its
    refusals counted across engine restarts (the module doc)."""

    __slots__ = ("_allowance", "_shed", "_shed_last", "last", "received_wall_ms", "shed_cut")

    def __init__(
        self,
        last: Capacity | None,
        received_wall_ms: float,
        *,
        shed: int | None = None,
        shed_last: int | None = None,
        allowance: float = float(SHED_BURST),
        shed_cut: int = 0,
    ) -> None:
        self.last = last
        #: edgemon's wall time when `last` was received (or voided), ms.
        self.received_wall_ms = received_wall_ms
        first = 0 if last is None else (last.shed_total or 0)
        #: The refusals counted (`edgemon_engine_shed_total`).
        self._shed = first if shed is None else shed
        #: The last `shed_total` received (kept when an object leaves it out).
        self._shed_last = first if shed_last is None else shed_last
        #: Refusals a step may still add now (refilled at `SHED_RATE_PER_S`).
        self._allowance = allowance
        #: Refusals claimed by steps beyond the allowance, not counted.
        self.shed_cut = shed_cut

    @property
    def shed(self) -> int:
        """Requests the engine refused, over all its lives seen: never decreases."""
        return self._shed

    def age_ms(self, wall_ms: float) -> float | None:
        """The last object's age at edgemon's wall time `wall_ms` (`capacity_age_ms`); None
        when there is none."""
        last = self.last
        if last is None:
            return None
        return max(0.0, capacity_age_ms(wall_ms, self.received_wall_ms, last.t_ms))

    def fresh(self, wall_ms: float) -> Capacity | None:
        """The last object if it is no older than `CAPACITY_MAX_AGE_MS` at `wall_ms`."""
        age = self.age_ms(wall_ms)
        return self.last if age is not None and age <= CAPACITY_MAX_AGE_MS else None

    def update(self, capacity: Capacity, recv_wall_ms: float) -> None:
        """Take a newer object; a `shed_total` below the last one is the engine's restart."""
        self._received(recv_wall_ms)
        total = capacity.shed_total
        if total is not None:
            step = total - self._shed_last if total >= self._shed_last else total
            taken = min(step, int(self._allowance))
            self._allowance -= taken
            self._shed += taken
            self.shed_cut += step - taken
            self._shed_last = total
        self.last = capacity

    def void(self, recv_wall_ms: float) -> None:
        """An unreadable object, or the topic emptied: nothing is known of the engine now
        (the refusals counted stay)."""
        self._received(recv_wall_ms)
        self.last = None

    def _received(self, recv_wall_ms: float) -> None:
        """An object came at `recv_wall_ms`: the refusals' allowance refills for the time
        since the last one (at `SHED_RATE_PER_S`, up to `SHED_BURST`)."""
        elapsed_s = max(0.0, recv_wall_ms - self.received_wall_ms) / 1000.0
        self._allowance = min(float(SHED_BURST), self._allowance + elapsed_s * SHED_RATE_PER_S)
        self.received_wall_ms = recv_wall_ms

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON values (a snapshot's part)."""
        return {
            "last": None if self.last is None else self.last.as_dict(),
            "received_wall_ms": self.received_wall_ms,
            "shed": self._shed,
            "shed_last": self._shed_last,
            "allowance": self._allowance,
            "shed_cut": self.shed_cut,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityRecord:
        """The record `as_dict` gave, or an older snapshot's (`shed_before` + `shed_last`)
        (KeyError, TypeError or ValueError if malformed)."""
        last = data["last"]
        if last is not None and not isinstance(last, dict):
            raise TypeError("capacity: `last` is not an object")
        shed_last = int(data["shed_last"])
        shed = int(data["shed"]) if "shed" in data else int(data["shed_before"]) + shed_last
        return cls(
            None if last is None else Capacity(**{key: last[key] for key in Capacity.__slots__}),
            float(data["received_wall_ms"]),
            shed=shed,
            shed_last=shed_last,
            allowance=float(data.get("allowance", SHED_BURST)),
            shed_cut=int(data.get("shed_cut", 0)),
        )
