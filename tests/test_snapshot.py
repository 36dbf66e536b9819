"""Snapshots: the engine's state survives a restart exactly, and downtime is not an underrun."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edgemon.engine.config import EngineConfig, SlackPolicy
from edgemon.engine.outputs import UnderrunBegan
from edgemon.engine.snapshot import SnapshotError
from edgemon.monitor import Monitor
from edgemon.simulate import Simulation

from monitor_runs import drive, per_stream
from properties import examples
from strategies import (
    FOUND_RESTART_TRACE,
    FOUND_RESTART_TRACE_MIN_ON,
    LateScenario,
    Scenario,
    late_scenarios,
    scenarios,
)

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

LATENCY_MS = 5.0
CONFIG = EngineConfig(slack=SlackPolicy(stream_idle_timeout_ms=2_000))


def simulated_messages(seconds: float = 60.0) -> list[tuple[float, str, bytes]]:
    """A realistic trace: two healthy devices and an overloaded one, fixed delivery latency."""
    sim = Simulation(devices=3, streams=3, rtf=[0.15, 0.3, 1.2], stall_rate=0.05, seed=11)
    messages = [
        (0.0, f"edgemon/v1/{device}/engine", json.dumps(obj).encode())
        for device, obj in sim.engine_objects().items()
    ]
    for message in sim.until(seconds * 1000):
        topic = f"edgemon/v1/{message.device}/events"
        messages.append((message.t_ms + LATENCY_MS, topic, json.dumps(message.payload).encode()))
    return messages


def reborn(
    monitor: Monitor,
    taken_ms: float,
    restored_ms: float | None = None,
    config: EngineConfig = CONFIG,
) -> Monitor:
    """A new monitor continuing from `monitor`'s snapshot taken at wall time `taken_ms` and
    restored at `restored_ms` (the restart; default: at once), through JSON as on disk."""
    data = json.loads(json.dumps(monitor.snapshot(taken_ms), allow_nan=False))
    successor = Monitor(config)
    successor.restore(data, taken_ms if restored_ms is None else restored_ms)
    return successor


def totals(monitor: Monitor) -> dict[str, Any]:
    return {
        device.id: (
            device.stats.chunks,
            device.stats.audio_ms,
            device.stats.underruns,
            device.stats.throttle_engagements,
            dict(device.stats.finished),
            dict(device.stats.slo),
            device.stats.slack_at_arrival.counts,
            device.stats.longest_gap.counts,
            sorted(device.streams),
        )
        for device in monitor.engine.devices()
    }


@pytest.mark.parametrize("split", [1, 40, 200, 400])
def test_a_restart_without_downtime_changes_nothing(split: int) -> None:
    """Snapshot after any message, restore at once: every later output and every total is
    what an uninterrupted run produces (underruns, throttle changes, stream ends)."""
    messages = simulated_messages()
    assert len(messages) > split
    whole = Monitor(CONFIG)
    expected = drive(whole, messages)

    first = Monitor(CONFIG)
    before = drive(first, messages[:split])
    second = reborn(first, messages[split - 1][0])
    after = drive(second, messages[split:])
    assert before + after == expected
    assert totals(second) == totals(whole)
    assert (second.results, second.messages, second.events) == (
        whole.results,
        whole.messages,
        whole.events,
    )


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(150), deadline=None)
@given(sc=scenarios(), cut=st.integers(min_value=0))
@example(sc=FOUND_RESTART_TRACE, cut=2)  # cut after the third message
@example(sc=FOUND_RESTART_TRACE_MIN_ON, cut=6)  # cut after the seventh message
def test_random_traces_continue_identically_after_a_restart(sc: Scenario, cut: int) -> None:
    """Any trace — duplicates, gaps, no eta (EWMA fallbacks), finals, both players — split at
    any message and restored at once continues exactly like the uninterrupted run: the same
    lines at the same instants, in the same order per stream. (Trust clock: an estimated
    offset restarts its window after a restart, by design. Lines of different streams at one
    instant may come in another order: the restored timers are re-armed stream by stream.)"""
    config = replace(sc.config, slack=replace(sc.config.slack, clock="trust"))
    messages = [(r.recv_ms, r.topic, r.payload) for r in sc.records()]
    split = 1 + cut % len(messages)  # after the first to after the last message
    whole = Monitor(config)
    expected = drive(whole, messages)
    first = Monitor(config)
    before = drive(first, messages[:split])
    second = reborn(first, messages[split - 1][0], config=config)
    assert_same_lines(before + drive(second, messages[split:]), expected)
    assert totals(second) == totals(whole)


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(100), deadline=None)
@given(sc=late_scenarios(), data=st.data())
def test_late_delivery_continues_identically_after_a_restart(
    sc: LateScenario, data: st.DataObject
) -> None:
    """Traces delivered late (semantics.md), split at any message: provisional underruns, chunks
    held for a missing seq and the device's event time survive the restart, so retractions,
    confirmations and gaps come out as in the uninterrupted run, and so do the totals. (Lines
    of different streams at one instant may come in another order: the restored waits are
    re-armed stream by stream.)"""
    config = replace(sc.config, slack=replace(sc.config.slack, clock="trust"))
    prefix = config.topic_prefix
    messages = [
        (float(m.recv_ms), f"{prefix}/{m.device}/events", json.dumps(m.events[0]).encode())
        for m in sc.messages
    ]
    end = messages[-1][0] + 10_000
    split = data.draw(st.integers(1, len(messages)), label="split")
    whole = Monitor(config)
    expected = drive(whole, [*messages, (end, "x", b"")])
    first = Monitor(config)
    before = drive(first, messages[:split])
    second = reborn(first, messages[split - 1][0], config=config)
    got = before + drive(second, [*messages[split:], (end, "x", b"")])
    assert per_stream(got) == per_stream(expected)  # underrun lines come at confirmation,
    assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, expected))  # at their u
    assert totals(second) == totals(whole)
    assert [d.stats.underruns_retracted for d in second.engine.devices()] == [
        d.stats.underruns_retracted for d in whole.engine.devices()
    ]


def assert_same_lines(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """The same lines, at the same sequence of instants, in the same order per stream; only
    lines of different streams at one instant may be swapped."""
    assert [line.get("t_ms") for line in got] == [line.get("t_ms") for line in expected]
    assert per_stream(got) == per_stream(expected)
    assert sorted(map(json.dumps, got)) == sorted(map(json.dumps, expected))


def test_downtime_with_a_queued_backlog_is_no_underrun() -> None:
    """edgemon is away for 10 s while a stream keeps getting chunks (the broker queues them);
    restored, it takes the backlog at its own t_ms: no underrun, the stream is intact."""
    chunks: list[dict[str, Any]] = [
        {"type": "chunk", "stream": "s", "t_ms": 200.0 * i, "seq": i, "audio_ms": 250.0}
        for i in range(80)
    ]
    first = Monitor(CONFIG)
    out: list[Output] = []
    for event in chunks[:10]:
        recv = event["t_ms"] + LATENCY_MS
        first.advance(recv, out)
        first.receive("edgemon/v1/d/events", json.dumps(event).encode(), recv, out)
    down_at = chunks[9]["t_ms"] + LATENCY_MS
    back_at = down_at + 10_000
    second = reborn(first, down_at, back_at)
    second.advance(back_at, out)
    for i, event in enumerate(chunks[10:]):  # the backlog arrives in a burst, 1 ms apart
        recv = back_at + i
        second.advance(recv, out)
        second.receive("edgemon/v1/d/events", json.dumps(event).encode(), recv, out)
    second.advance(back_at + 100, out)
    assert [o for o in out if isinstance(o, UnderrunBegan)] == []
    device = second.engine.device("d")
    assert device is not None
    assert device.streams["s"].chunks == 80
    assert device.stats.chunks == 80


def test_a_silent_device_resumes_its_clock_where_it_stopped() -> None:
    """Without any message after the restart, the device's time runs on from where it was:
    a stream with 1 s of audio left underruns 1 s after the restart, not at once."""
    first = Monitor(CONFIG)
    out: list[Output] = []
    event = {"type": "chunk", "stream": "s", "t_ms": 0.0, "seq": 0, "audio_ms": 1_000.0}
    first.receive("edgemon/v1/d/events", json.dumps(event).encode(), 0.0, out)
    second = reborn(first, 0.0, 60_000)  # edgemon was away for a minute
    second.advance(60_999, out)
    assert [o for o in out if isinstance(o, UnderrunBegan)] == []
    second.advance(61_000, out)
    assert [o for o in out if isinstance(o, UnderrunBegan)] == [UnderrunBegan("d", "s", 1_000)]


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"engine": {"format": 99, "devices": []}, "results": {}, "messages": 0, "events": 0},
        {
            "engine": {"format": 1, "devices": [{"id": "d"}]},
            "results": {},
            "messages": 0,
            "events": 0,
        },
        {"engine": {"format": 1, "devices": []}, "results": [], "messages": 0, "events": 0},
    ],
)
def test_an_unusable_snapshot_is_refused_and_leaves_the_monitor_as_it_was(
    data: dict[str, Any],
) -> None:
    """A wrong format, a missing field or a wrong type is a SnapshotError; nothing changes."""
    monitor = Monitor(CONFIG)
    engine = monitor.engine
    with pytest.raises(SnapshotError):
        monitor.restore(data, 0.0)
    assert monitor.engine is engine


def test_a_held_chunk_with_an_invalid_stream_id_is_refused() -> None:
    """A held chunk in a snapshot is checked as the wire checks a chunk, its stream id too: a
    snapshot holding one whose id does not match is a SnapshotError; nothing changes."""
    config = EngineConfig(slack=SlackPolicy(allowed_lateness_ms=1_000))
    monitor = Monitor(config)
    out: list[Output] = []
    for seq in (0, 2):  # seq 2 waits for seq 1
        event = {"type": "chunk", "stream": "a", "t_ms": 0.0, "seq": seq, "audio_ms": 500.0}
        monitor.handle("edgemon/v1/d/events", json.dumps(event).encode(), 0.0, out)
    data = json.loads(json.dumps(monitor.snapshot(0.0)))
    (stream,) = data["engine"]["devices"][0]["streams"]
    (chunk,) = (item[0] for item in stream["held"]["chunks"])
    Monitor(config).restore(data, 0.0)  # as it is, it restores
    chunk["stream"] = "a b"
    successor = Monitor(config)
    engine = successor.engine
    with pytest.raises(SnapshotError, match="stream"):
        successor.restore(data, 0.0)
    assert successor.engine is engine


def test_the_device_gap_estimate_survives_a_restart() -> None:
    """A new stream without eta_ms after a restart is timed by the device's gap EWMA, as
    learnt before the restart (not the default)."""
    first = Monitor(CONFIG)
    out: list[Output] = []
    for seq, t in enumerate((0.0, 100.0, 200.0)):
        event = {"type": "chunk", "stream": "a", "t_ms": t, "seq": seq, "audio_ms": 5_000.0}
        first.receive("edgemon/v1/d/events", json.dumps(event).encode(), t, out)
    second = reborn(first, 200.0)
    event = {"type": "chunk", "stream": "b", "t_ms": 250.0, "seq": 0, "audio_ms": 5_000.0}
    second.receive("edgemon/v1/d/events", json.dumps(event).encode(), 250.0, out)
    device = second.engine.device("d")
    assert device is not None
    assert device.streams["b"].expected == 250.0 + 100.0


def test_a_snapshot_from_before_the_service_level_restores_without_it() -> None:
    """A snapshot written before streams had a start silence and a longest gap (and devices
    their outcome counts and longest-gap histogram) restores with none of them: the streams
    go on, judged from then on (a stream's gaps before the restart are not known)."""
    monitor = Monitor(CONFIG)
    drive(monitor, simulated_messages(5.0))
    data = json.loads(json.dumps(monitor.snapshot(5_000.0), allow_nan=False))
    for device in data["engine"]["devices"]:
        del device["stats"]["slo"], device["stats"]["longest_gap"]
        for stream in device["streams"]:
            del stream["start_silence_ms"], stream["longest_gap_ms"]
    successor = Monitor(CONFIG)
    successor.restore(data, 5_000.0)
    devices = list(successor.engine.devices())
    assert devices
    assert all(not d.stats.slo and d.stats.longest_gap.count == 0 for d in devices)
    streams = [s for d in devices for s in d.streams.values()]
    assert streams
    assert all((s.start_silence_ms, s.longest_gap_ms) == (None, 0.0) for s in streams)
