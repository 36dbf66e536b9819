"""The deadline timer: one event-loop timer, armed for the engine's next transition, fires it.

The engine knows every future transition instant (docs/semantics.md), so nothing polls: the
timer is armed for `monitor.next_deadline()` and its callback calls `advance(now)`. After each
message the daemon calls `poke()`, which re-arms the timer only when the engine's timer heaps
now begin before the deadline it is armed for (a message that leaves the deadline where it is
costs a comparison, no re-arming and no recomputation). The `deadline-timer` task only owns the
timer: cancelling it disarms the timer, and nothing fires after that.

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

    from edgemon.daemon.wall_clock import Clock
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


class DeadlineTimer:
    """Drives `monitor.advance` at each deadline; `handle` takes what it produced.

    The wait is one event-loop timer handle, re-armed in place: a wake-up is a plain callback
    (no task switch, no future, no cancellation raised and caught), which matters when
    deadlines come a thousand times a second (an underrun storm, docs/reliability.md).
    """

    __slots__ = (
        "_clock",
        "_failed",
        "_fine_ms",
        "_handle",
        "_loop",
        "_monitor",
        "_out",
        "_stalls",
        "_target",
        "_task",
        "_timer",
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
        self._out: list[Output] = []
        #: The deadline the timer is armed for: inf with none, -inf while one is due now
        #: (a `_fire` is already queued, which recomputes it).
        self._target = math.inf
        self._timer: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed: asyncio.Future[None] | None = None
        self.fired = 0
        #: How late each deadline was served (ms), most recent last.
        self.lateness_ms: deque[float] = deque(maxlen=keep)
        #: Every lateness (ms) since the start, in buckets.
        self.lateness = Histogram(LATENESS_BOUNDS_MS)

    def poke(self) -> None:
        """Call after anything that may have moved the next deadline (a message, a reload).

        O(1) when nothing came earlier: the engine's heap heads are a lower bound of its next
        deadline, so when they are not before the deadline the timer is armed for, the timer
        stays as it is. Otherwise the deadline is recomputed, and the timer re-armed only if
        it moved (a head that is only a superseded entry is dropped by the recomputation).
        """
        if self._monitor.engine.deadline_floor() < self._target and self._loop is not None:
            self._arm()

    async def run(self) -> None:
        """Fire deadlines until cancelled (the `deadline-timer` task); a failure to fire one ends
        it with that exception. Once the task is cancelled nothing more fires."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._task = asyncio.current_task()
        self._failed = loop.create_future()
        self._target = -math.inf
        self._timer = loop.call_soon(self._fire)
        try:
            await self._failed
        finally:
            self._disarm()
            self._loop = None
            self._target = math.inf

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """(Re-)arm the timer for the engine's next deadline (`_fire` soon if it is near)."""
        deadline = self._monitor.next_deadline()
        target = math.inf if deadline is None else deadline
        if target == self._target and self._timer is not None:
            return  # armed for it already
        self._disarm()
        self._target = target
        if deadline is None:
            return
        loop = self._loop
        assert loop is not None
        delay_ms = deadline - self._clock.now_ms() - self._fine_ms
        if delay_ms <= 0:
            self._target = -math.inf
            self._timer = loop.call_soon(self._fire)
        else:
            self._timer = loop.call_later(delay_ms / 1000.0, self._fire)

    def _fire(self) -> None:
        """The timer: wait out the last `fine_ms` of the deadline, fire it, re-arm."""
        self._timer = None
        task = self._task
        if task is None or task.cancelling() or task.done():
            return
        try:
            self._fire_due()
        except Exception as exc:  # noqa: BLE001 - the task fails with it, as a task would
            assert self._failed is not None
            if not self._failed.done():
                self._failed.set_exception(exc)

    def _fire_due(self) -> None:
        monitor = self._monitor
        clock = self._clock
        stalls = self._stalls
        while True:
            deadline = monitor.next_deadline()
            if deadline is None:
                self._target = math.inf
                return
            now = clock.now_ms()
            if deadline > now:
                if deadline - now > self._fine_ms:  # early (the deadline moved later): wait
                    self._target = math.inf
                    self._arm()
                    return
                # The loop is held: nothing can move the deadline meanwhile.
                while deadline > now:
                    _fine_sleep(deadline - now)
                    now = clock.now_ms()
            if stalls is not None and stalls.check(now):
                continue  # the stall was cut out: the deadlines moved
            break
        self._target = -math.inf  # pokes from `handle` need not re-arm: `_arm` follows
        out = self._out
        monitor.advance(now, out)
        if deadline != -math.inf:
            self.lateness_ms.append(now - deadline)
            self.lateness.observe(now - deadline)
        self.fired += 1
        if out:
            try:
                self._handle(out)
            finally:
                out.clear()
        # The next deadline: a timer if it is far enough, else `_fire` again after the loop
        # has read what arrived meanwhile (messages come in between bursts of timers).
        self._arm()


def _fine_sleep(delay_ms: float) -> None:
    """Hold the thread for `delay_ms` (at most the timer's `fine_ms`)."""
    if delay_ms > 0:
        time.sleep(delay_ms / 1000.0)
