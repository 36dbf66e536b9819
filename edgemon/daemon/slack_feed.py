"""The slack feed out (docs/protocol.md, "Slack feed object"): what each device's players
measured.

A device's feed goes out when a message of its changes its streams (a chunk, a start, a play
start moved, a stream gone): at once if its last feed is at least `period_ms` old, else as
soon as it is (a rate limit with a leading edge: a quiet device's news costs no wait, a busy
device's feed is at most one period behind). Every period a sweep also republishes a device
whose feed with streams is `REFRESH_MS` old (a reader ignores entries older than a few
periods), which is also when a stream that ended by itself (played out, idle) leaves it. A
device whose last stream ended gets one feed with no streams, then nothing. QoS 0, not
retained: a lost feed is replaced within a period, and a retained one would hand a late reader
state that stopped being true.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING

from edgemon.engine.feed import slack_feed
from edgemon.engine.views import device_view, device_views
from edgemon.errors import PublishError
from edgemon.protocol import NOT_STARTED_MS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from edgemon.daemon.publisher import Sink
    from edgemon.daemon.wall_clock import Clock
    from edgemon.engine.engine import Engine
    from edgemon.engine.feed import SlackEntry
    from edgemon.engine.views import DeviceView

#: A device with streams is published at least this often (ms), changed or not.
REFRESH_MS = 1_000.0


def _start(value: float) -> float | None:
    """A play start as JSON: None while the player has not started and not said when."""
    return value if value < NOT_STARTED_MS else None


def feed_payload(device: str, t_ms: float, entries: Sequence[SlackEntry]) -> bytes:
    """The slack feed object of docs/protocol.md for `device` at device time `t_ms`."""
    streams = [
        {
            "stream": e.stream,
            "slack_ms": round(e.slack_ms, 3),
            "playing": e.playing,
            "play_start_ms": _start(e.play_start_ms),
            "age_ms": round(max(0.0, t_ms - e.heard_ms), 3),
        }
        for e in entries
    ]
    obj = {"device": device, "t_ms": t_ms, "streams": streams}
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


class FeedBook:
    """What was last published per device, and so whether a feed is due. Pure: views and wall
    times in, payloads out."""

    __slots__ = ("_keys", "_sent")

    def __init__(self) -> None:
        #: Per device: its streams' (id, play start, last heard) when last published.
        self._keys: dict[str, tuple[tuple[str, float, float], ...]] = {}
        #: Per device: the wall time of its last feed.
        self._sent: dict[str, float] = {}

    def wait_ms(self, device: str, wall_ms: float, period_ms: float) -> float:
        """How long `device`'s next feed must wait at `wall_ms` (0: it may go now)."""
        sent = self._sent.get(device)
        return 0.0 if sent is None else max(0.0, sent + period_ms - wall_ms)

    def feed(self, view: DeviceView, wall_ms: float, *, refresh: bool = False) -> bytes | None:
        """`view`'s feed at `wall_ms` if its streams changed since the last (or `refresh`
        and it has streams), counted as published; else None."""
        device = view.id
        now = view.now(wall_ms)
        entries = slack_feed(view.streams(), now)
        key = tuple((e.stream, e.play_start_ms, e.heard_ms) for e in entries)
        if key == self._keys.get(device, ()) and not (refresh and key):
            return None
        self._keys[device] = key
        self._sent[device] = wall_ms
        return feed_payload(device, now, entries)

    def stale(self, views: Iterable[DeviceView], wall_ms: float) -> list[DeviceView]:
        """The devices whose last feed had streams and is `REFRESH_MS` old at `wall_ms`;
        what is kept for a device no longer among `views` is dropped."""
        out, seen = [], set()
        keys, sent = self._keys, self._sent
        for view in views:
            device = view.id
            seen.add(device)
            if keys.get(device) and wall_ms - sent[device] >= REFRESH_MS:
                out.append(view)
        for gone in keys.keys() - seen:
            del keys[gone], sent[gone]
        return out


class SlackFeed:
    """The `slack-feed` task: each device's feed out at QoS 0 while connected, as the module
    says; `changed(device)` is told of every events message applied."""

    __slots__ = (
        "_book", "_clock", "_engine", "_owned", "_paused", "_period_ms", "_ready", "_sink",
        "_timers", "_topic", "_wake", "published",
    )  # fmt: skip

    def __init__(
        self,
        sink: Sink,
        engine: Engine,
        *,
        topic: Callable[[str], str],
        clock: Clock,
        period_ms: float,
        owned: frozenset[str] | None = None,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sink = sink
        #: Read through its views only (`edgemon.engine.views`).
        self._engine = engine
        self._topic = topic
        self._clock = clock
        self._period_ms = period_ms
        #: The devices this instance owns (`[mqtt] devices`); None: every device.
        self._owned = owned
        #: True while nothing may be published (a restart still catching up).
        self._paused = paused
        self._book = FeedBook()
        #: Devices whose feed may go now; devices waiting for their period to pass.
        self._ready: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()
        self.published = 0

    def changed(self, device: str) -> None:
        """A message of `device` was applied: its feed is due now, or once its period passed."""
        if device in self._ready or device in self._timers:
            return
        if self._owned is not None and device not in self._owned:
            return
        wait = self._book.wait_ms(device, self._clock.now_ms(), self._period_ms)
        if wait <= 0.0:
            self._ready.add(device)
            self._wake.set()
        else:
            loop = asyncio.get_running_loop()
            self._timers[device] = loop.call_later(wait / 1000.0, self._due, device)

    def _due(self, device: str) -> None:
        del self._timers[device]
        self._ready.add(device)
        self._wake.set()

    async def run(self) -> None:
        """Publish until cancelled; nothing while disconnected or paused (what changed
        meanwhile goes out with the next feed)."""
        loop = asyncio.get_running_loop()
        period_s = self._period_ms / 1000.0
        sweep_at = loop.time() + period_s
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, sweep_at - loop.time())):
                        await self._wake.wait()
                self._wake.clear()
                if self._paused():
                    await asyncio.sleep(period_s)
                    continue
                sweep = loop.time() >= sweep_at
                await self._publish(sweep)
                if sweep:
                    sweep_at = loop.time() + period_s
        finally:
            for timer in self._timers.values():
                timer.cancel()

    async def _publish(self, sweep: bool) -> None:
        """The ready devices' feeds, and with `sweep` the stale ones'."""
        wall_ms = self._clock.now_ms()
        book = self._book
        ready, engine = self._ready, self._engine
        due = [(view, False) for d in ready if (view := device_view(engine, d)) is not None]
        if sweep:
            owned = self._owned
            views = device_views(engine)
            if owned is not None:
                views = [view for view in views if view.id in owned]
            due += [(view, True) for view in book.stale(views, wall_ms) if view.id not in ready]
        ready.clear()
        for view, refresh in due:
            payload = book.feed(view, wall_ms, refresh=refresh)
            if payload is None:
                continue
            try:
                await self._sink.publish(self._topic(view.id), payload, qos=0, retain=False)
            except PublishError:
                return  # not connected: the next change or refresh tries again
            self.published += 1
