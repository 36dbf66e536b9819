"""Mapping edgemon's wall clock onto one device's clock (docs/semantics.md)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

#: How far ahead of a device's estimated clock an event may claim to be (10 minutes).
MAX_JUMP_MS = 600_000.0


class DeviceClock:
    """`offset = min(recv − t)` over the last window of events; device time never runs back.

    The minimum over a sliding window is kept in a monotonic deque, O(1) amortised per event.
    """

    __slots__ = (
        "_ahead_since",
        "_minima",
        "_trust",
        "_window_ms",
        "floor_ms",
        "floor_wall_ms",
        "offset_ms",
    )

    def __init__(self, *, trust: bool, window_ms: float) -> None:
        self._trust = trust
        self._window_ms = window_ms
        self._minima: deque[tuple[float, float]] = deque()
        self.offset_ms = 0.0
        #: The device time edgemon has reached (it never decreases), and the wall time then.
        self.floor_ms = float("-inf")
        self.floor_wall_ms = float("-inf")
        #: Wall time of the first event of a run of events far ahead of this clock.
        self._ahead_since: float | None = None

    def admits(self, recv_ms: float, t_ms: float) -> bool:
        """Whether an event's `t_ms` fits this clock: not more than `MAX_JUMP_MS` ahead of it.

        One event from years ahead would otherwise drag the device's clock there for good and
        expire every other stream of the device. A device that keeps reporting the new time
        for a whole window has really stepped its clock: then it is believed (the estimate
        starts afresh; with `clock = "trust"` the step becomes the device's offset).
        """
        if self.admits_up_to(recv_ms, t_ms):
            return True
        if self._ahead_since is None:
            self._ahead_since = recv_ms
            return False
        if recv_ms - self._ahead_since < self._window_ms:
            return False
        self._ahead_since = None
        self._minima.clear()
        if self._trust:
            # No estimate will follow: the believed step is the device's offset from now on,
            # else every later event would be far ahead again (refused for another window)
            # and each admitted one would drag the clock's floor forward by the step.
            self.offset_ms = recv_ms - t_ms
        return True

    def admits_up_to(self, recv_ms: float, newest_ms: float) -> bool:
        """Whether the events of a message, the newest at `newest_ms`, all fit this clock
        without a step of the clock, in O(1): then `admits` says so of each (none is ahead of
        the newest), with the same effect. False: ask `admits` of each."""
        if not self._minima and not self._trust:
            return True  # nothing known yet: the first event sets the clock
        if newest_ms - (recv_ms - self.offset_ms) <= MAX_JUMP_MS:
            self._ahead_since = None
            return True
        return False

    def observe_all(self, recv_ms: float, times: Sequence[float], newest_ms: float) -> None:
        """`observe` each of `times` in turn: a message's events, received together, the
        newest at `newest_ms`. If that is the last one, as in a batch in time order, its delay
        is the least: observing it alone leaves the window as observing each does (each
        other delay of the message would be dropped for it)."""
        if self._trust:
            return
        if times[-1] == newest_ms:
            self.observe(recv_ms, times[-1])
            return
        for t_ms in times:
            self.observe(recv_ms, t_ms)

    def observe(self, recv_ms: float, t_ms: float) -> None:
        """Take one event's receipt time and device time into the offset estimate."""
        if self._trust:
            return
        delay = recv_ms - t_ms
        minima = self._minima
        while minima and minima[-1][1] >= delay:
            minima.pop()
        minima.append((recv_ms, delay))
        horizon = recv_ms - self._window_ms
        while minima[0][0] < horizon:
            minima.popleft()
        self.offset_ms = minima[0][1]

    def now(self, wall_ms: float) -> float:
        """The device's time at edgemon wall time `wall_ms` (not below the floor)."""
        mapped = wall_ms - self.offset_ms
        return mapped if mapped > self.floor_ms else self.floor_ms

    def reach(self, device_ms: float, wall_ms: float) -> None:
        """Record that the device's clock has reached `device_ms` at wall time `wall_ms`."""
        if device_ms > self.floor_ms:
            self.floor_ms = device_ms
            self.floor_wall_ms = wall_ms

    def to_wall(self, device_ms: float) -> float:
        """The wall time at which the device's clock reaches (or reached) `device_ms`."""
        if device_ms <= self.floor_ms:
            return self.floor_wall_ms
        return device_ms + self.offset_ms
