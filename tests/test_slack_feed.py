"""The slack feed edgemon publishes (`edgemon.daemon.slack_feed`, docs/protocol.md "Slack
feed"): what goes out, for which device, and when."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from edgemon.daemon.slack_feed import REFRESH_MS, FeedBook, SlackFeed
from edgemon.daemon.wall_clock import MonotonicWallClock
from edgemon.engine import EngineConfig
from edgemon.engine.views import DeviceView, device_view, device_views
from edgemon.monitor import Monitor


def events(monitor: Monitor, device: str, batch: list[dict[str, Any]], at: float) -> None:
    """`batch` arrives on `device`'s events topic at wall time `at` (device clock = wall)."""
    monitor.handle(f"edgemon/v1/{device}/events", json.dumps(batch).encode(), at, [])


def view(monitor: Monitor, device: str) -> DeviceView:
    """The view of `device`, which the engine tracks."""
    found = device_view(monitor.engine, device)
    assert found is not None
    return found


def feed(book: FeedBook, monitor: Monitor, device: str, at: float, **kw: Any) -> Any:
    """`device`'s feed from `book` at wall time `at`, decoded; None if none is due."""
    payload = book.feed(view(monitor, device), at, **kw)
    return None if payload is None else json.loads(payload)


def start(stream: str, t: float, audio: float, play_start: float | None = None) -> list[Any]:
    """A start and a first chunk of `audio` ms at `t`."""
    chunk: dict[str, Any] = {"type": "chunk", "stream": stream, "t_ms": t, "seq": 0}
    chunk["audio_ms"] = audio
    if play_start is not None:
        chunk["play_start_ms"] = play_start
    return [{"type": "start", "stream": stream, "t_ms": t}, chunk]


def test_a_feed_says_what_the_players_measured() -> None:
    """Each live stream's slack at the feed's instant, whether it plays, when it started or
    that it has not (null), and how long ago its player was last heard from."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 1_000.0, 2_000.0), 1_000.0)
    events(monitor, "box", start("b", 1_100.0, 400.0, play_start=2.0**53), 1_100.0)
    published = feed(book, monitor, "box", 1_500.0)
    assert published["device"] == "box"
    assert published["t_ms"] == 1_500.0
    assert {s["stream"]: s for s in published["streams"]} == {
        "a": {"stream": "a", "slack_ms": 1_500.0, "playing": True, "play_start_ms": 1_000.0,
              "age_ms": 500.0},
        "b": {"stream": "b", "slack_ms": 400.0, "playing": False, "play_start_ms": None,
              "age_ms": 400.0},
    }  # fmt: skip


def test_a_feed_goes_out_when_the_streams_changed_or_on_refresh() -> None:
    """No feed while nothing changed (an engine object changes no stream); a chunk is a
    change; a refresh republishes a device with streams."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 0.0, 5_000.0), 0.0)
    assert feed(book, monitor, "box", 150.0) is not None
    assert feed(book, monitor, "box", 300.0) is None
    engine_object = b'{"block_size":16,"num_gpu_blocks":100,"max_model_len":1024}'
    monitor.handle("edgemon/v1/box/engine", engine_object, 350.0, [])
    assert feed(book, monitor, "box", 450.0) is None
    chunk = {"type": "chunk", "stream": "a", "t_ms": 500.0, "seq": 1, "audio_ms": 80.0}
    events(monitor, "box", [chunk], 500.0)
    assert feed(book, monitor, "box", 600.0)["streams"][0]["slack_ms"] == 4_480.0
    refreshed = feed(book, monitor, "box", 1_600.0, refresh=True)
    assert refreshed["streams"][0]["slack_ms"] == 4_480.0 - REFRESH_MS


def test_stale_devices_are_those_with_streams_a_refresh_old() -> None:
    """A device whose feed had streams is stale `REFRESH_MS` after it; one whose streams
    ended gets one feed with none and is never stale; a device gone is forgotten."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 0.0, 5_000.0), 0.0)
    events(monitor, "done", start("b", 0.0, 5_000.0), 0.0)
    assert feed(book, monitor, "box", 100.0) is not None
    assert feed(book, monitor, "done", 100.0) is not None
    events(monitor, "done", [{"type": "end", "stream": "b", "t_ms": 200.0}], 200.0)
    assert feed(book, monitor, "done", 300.0)["streams"] == []
    assert feed(book, monitor, "done", 400.0) is None
    views = device_views(monitor.engine)
    assert book.stale(views, 100.0 + REFRESH_MS - 1.0) == []
    assert [v.id for v in book.stale(views, 100.0 + REFRESH_MS)] == ["box"]
    assert book.stale([], 100.0 + REFRESH_MS) == []
    assert book.wait_ms("box", 500.0, 150.0) == 0.0  # forgotten: it may go at once


def test_the_next_feed_waits_for_the_period_after_the_last() -> None:
    """A device never published may go at once; after a feed, the next waits out the period."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 0.0, 5_000.0), 0.0)
    assert book.wait_ms("box", 0.0, 150.0) == 0.0
    feed(book, monitor, "box", 100.0)
    assert book.wait_ms("box", 160.0, 150.0) == 90.0
    assert book.wait_ms("box", 250.0, 150.0) == 0.0


class Recording:
    """A sink that records each publish with the wall time it was made."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, dict[str, Any]]] = []
        self.more = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, qos: int, retain: bool) -> None:
        """Record it (QoS 0, not retained, as the protocol says)."""
        assert (qos, retain) == (0, False)
        self.sent.append((time.monotonic() * 1000.0, topic, json.loads(payload)))
        self.more.set()

    async def wait_connected(self) -> None:
        """Always connected."""

    async def until(self, count: int) -> None:
        """Wait until `count` feeds were published (fail after 10 s)."""
        async with asyncio.timeout(10.0):
            while len(self.sent) < count:
                self.more.clear()
                await self.more.wait()


@pytest.mark.asyncio
async def test_a_change_goes_out_at_once_and_the_next_after_the_period() -> None:
    """The first change of a quiet device is published without waiting for a tick; a second
    change right after waits until the period has passed since the first feed, and owned
    devices only are published."""
    monitor, sink, period = Monitor(EngineConfig()), Recording(), 200.0
    task_feed = SlackFeed(
        sink,
        monitor.engine,
        topic=lambda device: f"edgemon/v1/{device}/slack",
        clock=MonotonicWallClock(wall_ns=time.monotonic_ns),  # the device clock of the events
        period_ms=period,
        owned=frozenset({"box"}),
    )
    task = asyncio.create_task(task_feed.run())
    try:
        now = time.monotonic() * 1000.0
        events(monitor, "other", start("x", now, 5_000.0), now)
        task_feed.changed("other")
        events(monitor, "box", start("a", now, 5_000.0), now)
        task_feed.changed("box")
        await sink.until(1)
        chunk = {"type": "chunk", "stream": "a", "t_ms": now + 1, "seq": 1, "audio_ms": 80.0}
        events(monitor, "box", [chunk], now + 1)
        task_feed.changed("box")
        await sink.until(2)
    finally:
        task.cancel()
    (first_at, topic, first), (second_at, _, second) = sink.sent[:2]
    assert topic == "edgemon/v1/box/slack"
    (a1,), (a2,) = first["streams"], second["streams"]
    assert a2["slack_ms"] == pytest.approx(
        a1["slack_ms"] + 80.0 - (second["t_ms"] - first["t_ms"]), abs=0.01
    )
    assert second_at - first_at >= period
    assert all(t == "edgemon/v1/box/slack" for _, t, _ in sink.sent)
