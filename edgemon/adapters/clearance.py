"""Waiting for a moment clear of the engine's next transition.

Work that holds the event loop for a while (a slice of a scrape, a snapshot's capture, a
garbage collection) should not start just before a transition is due: the transition would
wait for it. `clear_of_deadlines` sleeps past any transition due within the clearance first.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["clear_of_deadlines"]

#: How far past a transition's instant to sleep, so that its task has run when we wake.
_PAST_S = 0.0002


async def clear_of_deadlines(
    until_deadline: Callable[[], float | None], clearance_ms: float, max_wait_s: float
) -> None:
    """Return once no transition is due within `clearance_ms` (`until_deadline()`: ms until
    the next one, None if none), or after sleeping `max_wait_s` in all (a fleet with
    transitions every millisecond must still get its work done)."""
    waited = 0.0
    while waited < max_wait_s:
        left = until_deadline()
        if left is None or left > clearance_ms:
            return
        pause = max(0.0, left / 1000.0) + _PAST_S
        await asyncio.sleep(pause)
        waited += pause
