"""The slack feed out (docs/protocol.md, "Slack feed"): what each device's players measured.

Every `period_ms` the feed task asks `FeedBook.due` which devices to publish: a device that
sent a message since its last feed and whose streams changed (a chunk, a start, a play start
moved, a stream gone), or whose last feed is `REFRESH_MS` old while it has streams (a reader
ignores entries older than a few periods). A device whose last stream ended gets one feed
with no streams, then nothing. A device with no message since its last feed is not read at
all: the work per period is one comparison per device plus the streams of the devices that
spoke. QoS 0, not retained: a lost feed is replaced within a period, and a retained one would
hand a late reader state that stopped being true.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from edgemon.engine.feed import slack_feed
from edgemon.errors import PublishError
from edgemon.protocol import NOT_STARTED_MS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from edgemon.daemon.publisher import Sink
    from edgemon.daemon.wall_clock import Clock
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
    """What was last published per device, and so what is due now. Pure: views and a wall
    time in, `(device, payload)` pairs out."""

    __slots__ = ("_heard", "_keys", "_owned", "_sent")

    def __init__(self, *, owned: frozenset[str] | None = None) -> None:
        #: The devices this instance owns (`[mqtt] devices`); None: every device.
        self._owned = owned
        #: Per device: its streams' (id, play start, last heard) when last published.
        self._keys: dict[str, tuple[tuple[str, float, float], ...]] = {}
        #: Per device: the wall time of its last feed, and of its last message then.
        self._sent: dict[str, float] = {}
        self._heard: dict[str, float] = {}

    def due(self, views: Iterable[DeviceView], wall_ms: float) -> list[tuple[str, bytes]]:
        """The feeds to publish at wall time `wall_ms`; each is then counted as published
        (one that could not be sent is replaced by the next change or refresh)."""
        out: list[tuple[str, bytes]] = []
        seen: set[str] = set()
        owned = self._owned
        keys = self._keys
        for view in views:
            device = view.id
            if owned is not None and device not in owned:
                continue
            seen.add(device)
            heard = view.last_message_wall_ms
            spoke = heard != self._heard.get(device)
            last = keys.get(device, ())
            stale = bool(last) and wall_ms - self._sent[device] >= REFRESH_MS
            if not spoke and not stale:
                continue
            self._heard[device] = heard
            now = view.now(wall_ms)
            entries = slack_feed(view.streams(), now)
            key = tuple((e.stream, e.play_start_ms, e.heard_ms) for e in entries)
            if key == last and not stale:
                continue
            keys[device] = key
            self._sent[device] = wall_ms
            out.append((device, feed_payload(device, now, entries)))
        for gone in (keys.keys() | self._heard.keys()) - seen:
            keys.pop(gone, None)
            self._sent.pop(gone, None)
            self._heard.pop(gone, None)
        return out


class SlackFeed:
    """The `slack-feed` task: every `period_ms`, the due feeds out at QoS 0 while connected."""

    __slots__ = (
        "_book",
        "_clock",
        "_paused",
        "_period_s",
        "_sink",
        "_topic",
        "_views",
        "published",
    )

    def __init__(
        self,
        sink: Sink,
        *,
        views: Callable[[], Iterable[DeviceView]],
        topic: Callable[[str], str],
        clock: Clock,
        period_ms: float,
        owned: frozenset[str] | None = None,
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sink = sink
        self._views = views
        self._topic = topic
        self._clock = clock
        self._period_s = period_ms / 1000.0
        self._book = FeedBook(owned=owned)
        #: True while nothing may be published (a restart still catching up).
        self._paused = paused
        self.published = 0

    async def run(self) -> None:
        """Publish until cancelled; nothing while disconnected or paused (what changed
        meanwhile goes out with the next feed)."""
        while True:
            await asyncio.sleep(self._period_s)
            if self._paused():
                continue
            for device, payload in self._book.due(self._views(), self._clock.now_ms()):
                try:
                    await self._sink.publish(self._topic(device), payload, qos=0, retain=False)
                except PublishError:
                    break  # not connected: the next period tries again
                self.published += 1
