"""The deadline timer: one task sleeps until the engine's next transition and fires it.

The engine knows every future transition instant (docs/semantics.md), so nothing polls: the task
sleeps until `monitor.next_deadline()` and calls `advance(now)`. After each message the
daemon calls `poke()`, which wakes the task early only when the engine's timer heaps now
begin before the deadline it sleeps until (a message that leaves the deadline where it is
costs a comparison, no wake-up and no recomputation).

The sleep is an `asyncio` timer, but the event loop's timers wait in whole milliseconds
(epoll's timeout, rounded up), which alone would make a deadline up to 1 ms late. So the
timer is set `fine_ms` early and the last stretch is slept with `time.sleep` (tens of
microseconds late): the loop is held for under `fine_ms` just before a transition, which is
what the transition is owed anyway. Lateness is then the wake-up latency plus whatever else
the loop was doing; `lateness_ms` keeps the recent values and `lateness` counts them all
(exported as `edgemon_deadline_lateness_seconds`, docs/runbook.md).

**Stalls.** A process stopped (SIGSTOP) or a VM paused resumes with its timers' deadlines
long past and the messages that arrived meanwhile waiting in the socket. `StallGuard` notices
a gap of more than `STALL_MS` in the loop's progress (a tick every `TICK_S`, every message,
every wake-up of this task) at whichever of them comes first after the stall, and calls its
`on_stall` before anything else happens: the daemon then cuts the stall out of the devices'
timelines (`Monitor.cut`), so what queued up is applied before the timers it delayed fire.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Final

from edgemon.engine.histogram import Histogram

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.clock import Clock
    from edgemon.engine.outputs import Output
    from edgemon.monitor import Monitor

#: Bounds of `edgemon_deadline_lateness_seconds`, in ms: the README's 1 and 2 ms targets fall on
#: bucket bounds.
LATENESS_BOUNDS_MS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)
#: The last stretch before a deadline, slept without the event loop's millisecond timers.
FINE_MS: Final = 1.5
#: A gap in the loop's progress longer than this is a stall (ms), and how often it ticks (s).
STALL_MS: Final = 2000.0
TICK_S: Final = 0.1


class StallGuard:
    """Notices that the process stood still: `check(now)` at every sign of progress."""

    __slots__ = ("_clock", "_on_stall", "_stall_ms", "last_ms", "stalls")

    def __init__(
        self,
        clock: Clock,
        on_stall: Callable[[float, float], None],
        *,
        stall_ms: float = STALL_MS,
    ) -> None:
        self._clock = clock
        self._on_stall = on_stall
        self._stall_ms = stall_ms
        #: When the loop was last seen making progress (wall ms).
        self.last_ms = clock.now_ms()
        #: Stalls noticed so far.
        self.stalls = 0

    def check(self, now_ms: float) -> bool:
        """Progress at `now_ms`; True (after `on_stall(since_ms, now_ms)`) if it ends a stall."""
        last = self.last_ms
        self.last_ms = now_ms
        if now_ms - last <= self._stall_ms:
            return False
        self.stalls += 1
        self._on_stall(last, now_ms)
        return True

    async def run(self) -> None:
        """Tick forever (the `stall-guard` task): progress seen even when nothing happens."""
        while True:
            await asyncio.sleep(TICK_S)
            self.check(self._clock.now_ms())


class Scheduler:
    """Drives `monitor.advance` at each deadline; `handle` takes what it produced."""

    __slots__ = (
        "_clock",
        "_fine_ms",
        "_handle",
        "_monitor",
        "_stalls",
        "_target",
        "_wake",
        "fired",
        "lateness",
        "lateness_ms",
    )

    def __init__(
        self,
        monitor: Monitor,
        *,
        clock: Clock,
        handle: Callable[[list[Output]], None],
        keep: int = 4096,
        fine_ms: float = FINE_MS,
        stalls: StallGuard | None = None,
    ) -> None:
        self._monitor = monitor
        self._stalls = stalls
        self._fine_ms = fine_ms
        self._clock = clock
        self._handle = handle
        self._wake = asyncio.Event()
        self._target = math.inf
        self.fired = 0
        #: How late each deadline was served (ms), most recent last.
        self.lateness_ms: deque[float] = deque(maxlen=keep)
        #: Every lateness (ms) since the start, in buckets.
        self.lateness = Histogram(LATENESS_BOUNDS_MS)

    def poke(self) -> None:
        """Call after anything that may have moved the next deadline (a message, a reload).

        O(1): the engine's heap heads are a lower bound of its next deadline, so when they
        are not before the deadline the task sleeps until, nothing came earlier. A head that
        is only a superseded entry costs one early wake-up, which recomputes the deadline.
        """
        if self._monitor.engine.deadline_floor() < self._target:
            self._wake.set()

    async def run(self) -> None:
        """Fire deadlines forever (the `scheduler` task)."""
        out: list[Output] = []
        monitor = self._monitor
        clock = self._clock
        while True:
            deadline = monitor.next_deadline()
            if deadline is not None:
                now = clock.now_ms()
                if deadline <= now:
                    if self._stalls is not None and self._stalls.check(now):
                        continue  # the stall was cut out: the deadlines moved
                    self._target = -math.inf
                    monitor.advance(now, out)
                    if deadline != -math.inf:
                        self.lateness_ms.append(now - deadline)
                        self.lateness.observe(now - deadline)
                    self.fired += 1
                    if out:
                        self._handle(out)
                        out.clear()
                    await asyncio.sleep(0)  # let messages in between bursts of timers
                    continue
            self._target = math.inf if deadline is None else deadline
            self._wake.clear()
            await self._sleep_until(deadline)

    async def _sleep_until(self, deadline: float | None) -> None:
        if deadline is None:
            await self._wake.wait()
            return
        delay_ms = deadline - self._clock.now_ms()
        if delay_ms <= self._fine_ms:
            _fine_sleep(delay_ms)
            return
        try:
            async with asyncio.timeout((delay_ms - self._fine_ms) / 1000.0):
                await self._wake.wait()
        except TimeoutError:
            pass


def _fine_sleep(delay_ms: float) -> None:
    """Hold the thread for `delay_ms` (at most the scheduler's `fine_ms`)."""
    if delay_ms > 0:
        time.sleep(delay_ms / 1000.0)
