"""The daemon's wall clock in milliseconds: wall time at start plus monotonic time since.

Stepping the system clock (NTP, an operator) never moves it back or forward while the daemon
runs, so deadlines computed on it stay valid and `recv_ms` in a trace never decreases.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable


class Clock(Protocol):
    """What the daemon needs of a clock: wall time in ms that never runs back."""

    def now_ms(self) -> float:
        """Current wall time, Unix epoch milliseconds."""
        ...


class MonotonicWallClock:
    """Wall time at construction + monotonic elapsed time; both sources injectable."""

    __slots__ = ("_monotonic_ns", "_start_mono_ns", "_start_wall_ms")

    def __init__(
        self,
        *,
        wall_ns: Callable[[], int] = time.time_ns,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._monotonic_ns = monotonic_ns
        self._start_mono_ns = monotonic_ns()
        self._start_wall_ms = wall_ns() / 1e6

    def now_ms(self) -> float:
        """Current wall time in ms (microsecond resolution)."""
        return self._start_wall_ms + (self._monotonic_ns() - self._start_mono_ns) / 1e6

    def seconds_until(self, wall_ms: float) -> float:
        """Seconds from now until wall time `wall_ms` (negative when it has passed)."""
        return (wall_ms - self.now_ms()) / 1000.0
