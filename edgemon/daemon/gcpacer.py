"""Garbage collection at moments the daemon chooses, never in a deadline's way.

CPython's full (generation 2) collection walks every object the collector tracks. At 10,000
live streams that takes tens of milliseconds with the event loop stopped, at whatever moment
allocations happen to trigger it: in `benchmarks/scrape.py`'s quiet phase those pauses were
the whole of the p99 deadline lateness. So, while the daemon runs:

- automatic collection keeps generations 0 and 1 (young objects only: a fraction of a
  millisecond) but never starts a full collection (generation 2's threshold is out of reach);
- every `interval_s` (1 s) the pacer runs the full collection itself, at a moment when no
  transition is due within `clear_ms` (nor within twice the last pause) and no throttle
  object is on its way out, then freezes the
  survivors (`gc.freeze()`): later collections skip them, so each one costs only what survived
  the last second (a fraction of a millisecond in steady state; tens of milliseconds once
  after 10,000 streams arrive at once);
- every `unfreeze_every`-th round (hourly) first unfreezes everything, so that a reference
  cycle among long-lived objects is still reclaimed: one whole-heap pass, at a quiet moment
  (tens of milliseconds at 10,000 streams: a message arriving meanwhile waits for it).

The thresholds and the frozen generation are the process's: `run` restores both when it ends.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import TYPE_CHECKING, Final

from edgemon.adapters.clearance import clear_of_deadlines

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["GcPacer"]

#: Generation 2's threshold while paced: automatic full collections never start.
_OUT_OF_REACH: Final = 1 << 30


class GcPacer:
    """Runs the full collections of the process (the daemon's `gc` task)."""

    __slots__ = (
        "_busy",
        "_clear_ms",
        "_interval_s",
        "_max_wait_s",
        "_rounds",
        "_unfreeze_every",
        "_until_deadline",
        "last_pause_ms",
        "rounds",
    )

    def __init__(
        self,
        until_deadline: Callable[[], float | None],
        *,
        busy: Callable[[], bool] | None = None,
        interval_s: float = 1.0,
        clear_ms: float = 50.0,
        unfreeze_every: int = 3600,
        max_wait_s: float = 1.0,
    ) -> None:
        self._until_deadline = until_deadline
        self._busy = busy
        self._interval_s = interval_s
        self._clear_ms = clear_ms
        self._unfreeze_every = max(1, unfreeze_every)
        self._max_wait_s = max_wait_s
        #: Rounds run, and the last one's pause (ms).
        self.rounds = 0
        self.last_pause_ms = 0.0

    async def run(self) -> None:
        """Collect every `interval_s` until cancelled."""
        saved = gc.get_threshold()
        paced = (saved[0], saved[1], _OUT_OF_REACH)
        gc.set_threshold(*paced)
        try:
            while True:
                await asyncio.sleep(self._interval_s)
                clearance = max(self._clear_ms, 2.0 * self.last_pause_ms)
                await clear_of_deadlines(
                    self._until_deadline, clearance, self._max_wait_s, self._busy
                )
                self.collect()
        finally:
            if gc.get_threshold() == paced:  # nobody else changed them meanwhile
                gc.set_threshold(*saved)
            gc.unfreeze()

    def collect(self) -> None:
        """One round: a full collection of what is not frozen, then freeze the survivors."""
        self.rounds += 1
        if self.rounds % self._unfreeze_every == 0:
            gc.unfreeze()
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.last_pause_ms = (time.perf_counter() - started) * 1000.0
