"""Waiting for a moment clear of the engine's next transition.

Work that holds the event loop for a while (a slice of a scrape, a snapshot's capture, a
garbage collection) should not start just before a transition is due, nor while the throttle
object of one that just fired is still on its way to the broker (sending it takes a few turns
of the loop): either would wait for the work. `clear_of_deadlines` lets both go first.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["clear_of_deadlines"]

#: How far past a transition's instant to sleep, so that its task has run when we wake.
_PAST_S = 0.0002


async def clear_of_deadlines(
    until_deadline: Callable[[], float | None] | None,
    clearance_ms: float,
    max_wait_s: float,
    busy: Callable[[], bool] | None = None,
) -> None:
    """Return once no transition is due within `clearance_ms` (`until_deadline()`: ms until
    the next one, None if none) and `busy()` is false (a throttle object on its way out),
    or after `max_wait_s` (a fleet with transitions every millisecond must still get its
    work done)."""
    started = time.perf_counter()
    while time.perf_counter() - started < max_wait_s:
        if busy is not None and busy():
            await asyncio.sleep(0)  # a turn of the loop for the publisher's next step
            continue
        left = None if until_deadline is None else until_deadline()
        if left is None or left > clearance_ms:
            return
        await asyncio.sleep(max(0.0, left / 1000.0) + _PAST_S)
