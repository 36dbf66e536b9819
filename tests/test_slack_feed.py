"""The slack feed edgemon publishes (`edgemon.daemon.slack_feed`, docs/protocol.md "Slack
feed"): what goes out, for which device, and when."""

from __future__ import annotations

import json
from typing import Any

from edgemon.daemon.slack_feed import REFRESH_MS, FeedBook
from edgemon.engine import EngineConfig
from edgemon.engine.views import device_views
from edgemon.monitor import Monitor


def events(monitor: Monitor, device: str, batch: list[dict[str, Any]], at: float) -> None:
    """`batch` arrives on `device`'s events topic at wall time `at` (device clock = wall)."""
    monitor.handle(f"edgemon/v1/{device}/events", json.dumps(batch).encode(), at, [])


def due(book: FeedBook, monitor: Monitor, at: float) -> dict[str, dict[str, Any]]:
    """The feeds `book` publishes at wall time `at`, decoded, by device."""
    return {
        device: json.loads(payload)
        for device, payload in book.due(device_views(monitor.engine), at)
    }


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
    feed = due(book, monitor, 1_500.0)["box"]
    assert feed["device"] == "box"
    assert feed["t_ms"] == 1_500.0
    assert {s["stream"]: s for s in feed["streams"]} == {
        "a": {"stream": "a", "slack_ms": 1_500.0, "playing": True, "play_start_ms": 1_000.0,
              "age_ms": 500.0},
        "b": {"stream": "b", "slack_ms": 400.0, "playing": False, "play_start_ms": None,
              "age_ms": 400.0},
    }  # fmt: skip


def test_a_device_is_published_when_its_streams_change_and_refreshed_each_second() -> None:
    """No feed without a change until `REFRESH_MS` has passed since the last; a chunk is a
    change; a message that changes no stream (an engine object) is not."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 0.0, 5_000.0), 0.0)
    assert set(due(book, monitor, 150.0)) == {"box"}
    assert due(book, monitor, 300.0) == {}
    engine_object = b'{"block_size":16,"num_gpu_blocks":100,"max_model_len":1024}'
    monitor.handle("edgemon/v1/box/engine", engine_object, 350.0, [])
    assert due(book, monitor, 450.0) == {}
    chunk = {"type": "chunk", "stream": "a", "t_ms": 500.0, "seq": 1, "audio_ms": 80.0}
    events(monitor, "box", [chunk], 500.0)
    assert due(book, monitor, 600.0)["box"]["streams"][0]["slack_ms"] == 4_480.0
    assert due(book, monitor, 600.0 + REFRESH_MS - 1.0) == {}
    refreshed = due(book, monitor, 600.0 + REFRESH_MS)["box"]
    assert refreshed["streams"][0]["slack_ms"] == 4_480.0 - REFRESH_MS


def test_a_device_whose_streams_ended_gets_one_empty_feed_then_none() -> None:
    """The end of its last stream is published once, as no streams; a device that never had
    a stream is never published."""
    monitor, book = Monitor(EngineConfig()), FeedBook()
    events(monitor, "box", start("a", 0.0, 5_000.0), 0.0)
    events(monitor, "quiet", [{"type": "start", "stream": "x", "t_ms": 0.0}], 0.0)
    assert set(due(book, monitor, 100.0)) == {"box"}
    events(monitor, "box", [{"type": "end", "stream": "a", "t_ms": 200.0}], 200.0)
    assert due(book, monitor, 300.0)["box"]["streams"] == []
    assert due(book, monitor, 300.0 + 5 * REFRESH_MS) == {}


def test_only_the_devices_this_instance_owns_are_published() -> None:
    """With `[mqtt] devices`, another instance's devices get no feed from this one."""
    monitor, book = Monitor(EngineConfig()), FeedBook(owned=frozenset({"mine"}))
    events(monitor, "mine", start("a", 0.0, 5_000.0), 0.0)
    events(monitor, "theirs", start("b", 0.0, 5_000.0), 0.0)
    assert set(due(book, monitor, 100.0)) == {"mine"}
