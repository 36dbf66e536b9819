"""`edgemon_start_silence_seconds` (docs/runbook.md): a stream's start event to its playback start.

Players send `start` when the request is made and tell the player's start on the first chunk
(`play_start_ms`), so the histogram holds what the listener waited before hearing anything,
prebuffer included. A stream begun by its first chunk has no request instant: not observed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.engine import EngineConfig
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

TOPIC = "edgemon/v1/d1/events"


def feed(monitor: Monitor, events: list[dict[str, Any]]) -> None:
    """Each event as its own message, received at its own `t_ms` (clock offset 0)."""
    out: list[Output] = []
    for event in events:
        t = float(event["t_ms"])
        monitor.advance(t, out)
        monitor.receive(TOPIC, json.dumps(event).encode(), t, out)


def requested_and_played(stream: str, requested: float, first: float, play: float) -> list[Any]:
    """A request at `requested`, its first chunk at `first` saying playback starts at `play`."""
    return [
        {"type": "start", "stream": stream, "t_ms": requested, "margin_ms": 80},
        {
            "type": "chunk",
            "stream": stream,
            "t_ms": first,
            "seq": 0,
            "audio_ms": 400.0,
            "eta_ms": 1000.0,
            "play_start_ms": play,
        },
    ]


def scrape(monitor: Monitor, wall_ms: float) -> dict[tuple[str, str], float]:
    """The start-silence samples as `(sample name, le)` → value."""
    registry = build_registry(
        monitor,
        wall_clock=lambda: wall_ms,
        connection=ConnectionState(),
        per_stream_series=0,
        version="0",
    )
    text = generate_latest(registry).decode()
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("edgemon_start_silence_seconds"):
                assert sample.labels["device"] == "d1"
                found[sample.name, sample.labels.get("le", "")] = sample.value
    return found


def test_start_silence_runs_from_the_request_to_the_playback_start() -> None:
    """Two requests: 1.2 s and 0.45 s from start event to the player's start (the first
    chunk's `play_start_ms`); counted in inclusive seconds buckets with their sum."""
    monitor = Monitor(EngineConfig())
    feed(
        monitor,
        requested_and_played("a", 1000.0, 1500.0, 2200.0)
        + requested_and_played("b", 3000.0, 3100.0, 3450.0),
    )
    samples = scrape(monitor, 3500.0)
    bucket = "edgemon_start_silence_seconds_bucket"
    assert samples[bucket, "0.3"] == 0
    assert samples[bucket, "0.5"] == 1
    assert samples[bucket, "1.0"] == 1
    assert samples[bucket, "1.5"] == 2
    assert samples[bucket, "+Inf"] == 2
    assert samples["edgemon_start_silence_seconds_count", ""] == 2
    assert samples["edgemon_start_silence_seconds_sum", ""] == pytest.approx(1.65)


def test_without_play_start_the_first_chunk_starts_playback() -> None:
    """A start event and a first chunk with no `play_start_ms`: playback starts at the first
    chunk (docs/semantics.md), so start silence equals time to first audio."""
    monitor = Monitor(EngineConfig())
    events = requested_and_played("a", 1000.0, 1700.0, 0.0)
    del events[1]["play_start_ms"]
    feed(monitor, events)
    stats = monitor.engine.device("d1")
    assert stats is not None
    assert stats.stats.start_silence.count == 1
    assert stats.stats.start_silence.total == pytest.approx(700.0)
    assert stats.stats.time_to_first_audio.total == pytest.approx(700.0)


def test_a_stream_begun_by_its_first_chunk_is_not_observed() -> None:
    """No start event, no request instant: the histogram stays empty."""
    monitor = Monitor(EngineConfig())
    feed(monitor, requested_and_played("a", 1000.0, 1500.0, 2200.0)[1:])
    device = monitor.engine.device("d1")
    assert device is not None
    assert device.stats.start_silence.count == 0


def test_start_silence_survives_a_snapshot_and_an_older_snapshot_restores_it_empty() -> None:
    """Snapshot and restore keep the histogram; a snapshot written before it existed (no
    `start_silence` key) restores with it empty instead of being refused."""
    monitor = Monitor(EngineConfig())
    feed(monitor, requested_and_played("a", 1000.0, 1500.0, 2200.0))
    data = json.loads(json.dumps(monitor.snapshot(2300.0), allow_nan=False))
    restored = Monitor(EngineConfig())
    restored.restore(data, 2300.0)
    device = restored.engine.device("d1")
    assert device is not None
    assert device.stats.start_silence.count == 1
    assert device.stats.start_silence.total == pytest.approx(1200.0)

    for entry in data["engine"]["devices"]:
        del entry["stats"]["start_silence"]
    older = Monitor(EngineConfig())
    older.restore(data, 2300.0)
    device = older.engine.device("d1")
    assert device is not None
    assert device.stats.start_silence.count == 0
    assert device.stats.chunks == 1
