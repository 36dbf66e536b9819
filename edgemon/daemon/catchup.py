"""After a restart: when the daemon has caught up and may publish (docs/reliability.md,
"After a restart").

From the restore at the first CONNACK until the broker's backlog for the session has been
read, the engine decides but nothing is published. MQTT marks no end of a backlog, so it is
inferred: subscribed, and no message for `QUIET_MS`; or `MAX_MS` after the restore at most,
so a backlog that never pauses does not keep the throttle silent.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.daemon.clock import Clock

#: No message read for this long once subscribed: the backlog is in (ms).
QUIET_MS = 250.0
#: At most this long after the restore (ms).
MAX_MS = 3000.0


class CatchUp:
    """`begin` at the restore, `last_ms` set at every message (the daemon's hot path sets it
    directly); `run` calls `done` once caught up."""

    __slots__ = ("_begun", "_clock", "_done", "active", "from_ms", "last_ms")

    def __init__(self, clock: Clock, done: Callable[[], None]) -> None:
        self._clock = clock
        self._done = done
        self._begun = asyncio.Event()
        #: Whether the daemon is catching up now (publishing nothing).
        self.active = False
        self.from_ms = 0.0
        self.last_ms = 0.0

    def begin(self, now_ms: float) -> None:
        """A restore at `now_ms`: catching up from now."""
        self.active = True
        self.from_ms = self.last_ms = now_ms
        self._begun.set()

    def end(self) -> bool:
        """Stop catching up; whether it was (the caller then publishes the state as of now)."""
        was, self.active = self.active, False
        return was

    async def run(self, subscribed: asyncio.Event) -> None:
        """The `catch-up` task: once begun and `subscribed`, wait for a quiet spell (or the
        limit), then call `done` (unless `end` came first)."""
        await self._begun.wait()
        await subscribed.wait()
        while self.active:
            now = self._clock.now_ms()
            quiet_until = self.last_ms + QUIET_MS
            latest = self.from_ms + MAX_MS
            if now >= quiet_until or now >= latest:
                self._done()
                return
            await asyncio.sleep((min(quiet_until, latest) - now) / 1000.0)
