"""After a restart: when the daemon has caught up and may publish (docs/reliability.md,
"After a restart").

From the restore at the first CONNACK until the broker's backlog for the session has been
read, the engine decides but nothing is published. MQTT marks no end of a backlog, so it is
inferred: subscribed, and no message for `QUIET_MS`; or `MAX_MS` after the restore at most,
so a backlog that never pauses does not keep the throttle silent.

Meanwhile the broker still holds the throttle objects of the run before, stale. The status
says `offline` (`withheld`) until the state as of now is on the broker, so no gate takes a
stale `throttle: true` for the word of a live instance: `online` comes after the fresh objects.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.wall_clock import Clock

#: No message read for this long once subscribed: the backlog is in (ms).
QUIET_MS = 250.0
#: At most this long after the restore (ms).
MAX_MS = 3000.0


class CatchUp:
    """`begin` at the restore, `last_ms` set at every message (the daemon's hot path sets it
    directly); `run` calls `done` once caught up."""

    __slots__ = ("_begun", "_clock", "_done", "active", "from_ms", "last_ms", "withheld")

    def __init__(self, clock: Clock, done: Callable[[], None]) -> None:
        self._clock = clock
        self._done = done
        self._begun = asyncio.Event()
        #: Whether the daemon is catching up now (publishing nothing).
        self.active = False
        #: Whether `online` is withheld (the status says `offline`): from the restore until
        #: the objects published once caught up are acknowledged (`announced`).
        self.withheld = False
        self.from_ms = 0.0
        self.last_ms = 0.0

    def begin(self, now_ms: float) -> None:
        """A restore at `now_ms`: catching up from now."""
        self.active = self.withheld = True
        self.from_ms = self.last_ms = now_ms
        self._begun.set()

    def end(self) -> bool:
        """Stop catching up; whether it was (the caller then publishes the state as of now)."""
        was, self.active = self.active, False
        return was

    def announced(self) -> None:
        """What was published once caught up is on the broker: `online` may be said."""
        self.withheld = False

    async def run(self, subscribed: asyncio.Event) -> bool:
        """The `catch-up` task: once begun and `subscribed`, wait for a quiet spell (or the
        limit), then call `done`; whether it did (not if `end` came first)."""
        await self._begun.wait()
        await subscribed.wait()
        while self.active:
            now = self._clock.now_ms()
            quiet_until = self.last_ms + QUIET_MS
            latest = self.from_ms + MAX_MS
            if now >= quiet_until or now >= latest:
                self._done()
                return True
            await asyncio.sleep((min(quiet_until, latest) - now) / 1000.0)
        return False
