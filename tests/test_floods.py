"""Floods through the monitor, in-process on a virtual clock (reliability.md "Memory is bounded").

One device sending 1,000,000 distinct stream ids, and 100,000 distinct device names: the
limits hold, what is refused is counted (`stream_limit`, `device_limit`), the number of
series on `/metrics` (the real collector) stays within a bound derived from the limits, RSS
growth stays within a stated bound, and a device that was there before the flood keeps its
throttle transitions at exactly the instants it would have without the flood.
"""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import generate_latest

from edgemon.adapters.connection_state import ConnectionState
from edgemon.adapters.metrics import KNOWN_RESULTS, build_registry
from edgemon.engine.config import EngineConfig, Limits
from edgemon.engine.histogram import (
    CHUNK_GAP_MS,
    SLACK_AT_ARRIVAL_MS,
    START_SILENCE_MS,
    TIME_TO_FIRST_AUDIO_MS,
)
from edgemon.engine.outputs import ThrottleChanged
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from collections.abc import Iterator

    from edgemon.engine.outputs import Output

pytestmark = pytest.mark.slow

P = "edgemon/v1"
T0 = 1_700_000_000_000.0  # virtual wall clock; devices report the same clock (offset 0)
LEGIT = ("legit-a", "legit-b")
CYCLE_MS = 5_000.0
#: RSS growth allowed for a whole flood. Measured: well under 20 MB (see docs/reliability.md).
RSS_BOUND_MB = 100.0

# The series one device can have on `/metrics` (text format), from the collector's families:
# 8 gauges (streams_active, streams_at_risk, headroom_min, slack_min, margin, throttle_active,
# clock_offset, last_event) + 4 KV gauges + 7 counters + 5 `streams_finished_total{reason}`
# + 4 histograms (buckets incl. +Inf, and `_sum`/`_count` except for slack_at_arrival, whose
# negative buckets forbid them) + 2 per-stream gauges × `per_stream_series`.
HISTOGRAM_SERIES = (
    (len(SLACK_AT_ARRIVAL_MS) + 1)
    + (len(CHUNK_GAP_MS) + 1 + 2)
    + (len(TIME_TO_FIRST_AUDIO_MS) + 3)
    + (len(START_SILENCE_MS) + 3)
)
#: Every `result` label the daemon can count.
RESULT_LABELS = KNOWN_RESULTS


def series_per_device(limits: Limits) -> int:
    """The most series one device contributes to `/metrics`."""
    return 8 + 4 + 7 + 5 + HISTOGRAM_SERIES + 2 * limits.per_stream_series


def rss_mb() -> float:
    """This process's resident set size (VmRSS), in MB."""
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")  # pragma: no cover


def series_count(monitor: Monitor, wall_ms: float, limits: Limits) -> int:
    """Samples on `/metrics` as the daemon's real registry renders them now."""
    registry = build_registry(
        monitor,
        wall_clock=lambda: wall_ms,
        connection=ConnectionState(),
        per_stream_series=limits.per_stream_series,
        version="test",
    )
    text = generate_latest(registry).decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def legit_messages(end_ms: float) -> Iterator[tuple[float, str, list[dict[str, Any]]]]:
    """Every `CYCLE_MS`, per legit device, a stream that runs low and is refilled:
    chunk 0 (300 ms audio, next in 50 ms) at T, a 2 s refill at T+300, its end at T+1000."""
    k = 0
    t = T0
    while t + 1_000 < end_ms:
        for device in LEGIT:
            stream = f"L{k}"
            yield (
                t,
                device,
                [{"type": "start", "stream": stream, "t_ms": t}, _chunk(stream, 0, t, 300)],
            )
            yield t + 300, device, [_chunk(stream, 1, t + 300, 2_000)]
            yield t + 1_000, device, [{"type": "end", "stream": stream, "t_ms": t + 1_000}]
        k += 1
        t += CYCLE_MS


def expected_legit(end_ms: float) -> list[tuple[str, bool, float]]:
    """ON where headroom reaches the 80 ms margin (T+220), OFF after min-on (T+470)."""
    expected = []
    t = T0
    while t + 1_000 < end_ms:
        for device in LEGIT:
            expected += [(device, True, t + 220), (device, False, t + 470)]
        t += CYCLE_MS
    return sorted(expected, key=lambda x: (x[2], x[0]))


def _chunk(stream: str, seq: int, t: float, audio: float) -> dict[str, Any]:
    return {
        "type": "chunk",
        "stream": stream,
        "t_ms": t,
        "seq": seq,
        "audio_ms": audio,
        "eta_ms": 50,
    }


def run_flood(
    monitor: Monitor, flood: Iterator[tuple[float, str, bytes]], end_ms: float
) -> list[tuple[str, bool, float]]:
    """Interleave the flood with the legit devices' messages in time order; return the legit
    devices' throttle transitions `(device, active, t_ms)`. Outputs are not kept."""
    legit = [
        (t, f"{P}/{d}/events", json.dumps(events).encode())
        for t, d, events in legit_messages(end_ms)
    ]
    legit.sort(key=lambda m: m[0])
    seen: list[tuple[str, bool, float]] = []
    out: list[Output] = []

    def deliver(recv_ms: float, topic: str, payload: bytes) -> None:
        monitor.advance(recv_ms, out)
        monitor.receive(topic, payload, recv_ms, out)
        keep(out)

    def keep(outputs: list[Output]) -> None:
        seen.extend(
            (o.device, o.active, o.t_ms)
            for o in outputs
            if type(o) is ThrottleChanged and o.device in LEGIT
        )
        outputs.clear()

    i = 0
    for recv_ms, topic, payload in flood:
        while i < len(legit) and legit[i][0] <= recv_ms:
            deliver(*legit[i])
            i += 1
        deliver(recv_ms, topic, payload)
    for message in legit[i:]:
        deliver(*message)
    monitor.advance(end_ms, out)
    keep(out)
    return sorted(seen, key=lambda x: (x[2], x[0]))


def prime_legit(monitor: Monitor) -> None:
    """The legit devices exist before the flood begins."""
    out: list[Output] = []
    for device in LEGIT:
        event = {"type": "start", "stream": "warmup", "t_ms": T0 - 10}
        monitor.receive(f"{P}/{device}/events", json.dumps(event).encode(), T0 - 10, out)
        event = {"type": "end", "stream": "warmup", "t_ms": T0 - 10}
        monitor.receive(f"{P}/{device}/events", json.dumps(event).encode(), T0 - 10, out)
    monitor.advance(T0 - 10, out)


def test_a_million_stream_ids_from_one_device_stay_bounded() -> None:
    """One device sends 1,000,000 distinct stream ids in batches of 1000 (starts and chunks
    alternately, 100 ms of virtual time apart, so streams also expire and new ones get in):
    it never holds more than `max_streams_per_device` streams, every refused event is counted
    `stream_limit`, tombstones stay within their cap, `/metrics` stays within its series bound,
    RSS grows by less than `RSS_BOUND_MB`, and the legit devices' throttle transitions happen
    at exactly the instants they would without the flood."""
    limits = Limits()
    monitor = Monitor(EngineConfig(limits=limits))
    prime_legit(monitor)
    batches, per_batch, step_ms = 1_000, 1_000, 100.0
    end_ms = T0 + batches * step_ms + 2_000
    gc.collect()
    rss_before = rss_mb()
    peak_streams = 0

    def flood() -> Iterator[tuple[float, str, bytes]]:
        nonlocal peak_streams
        topic = f"{P}/flooder/events"
        for b in range(batches):
            t = T0 + 1 + b * step_ms
            ids = range(b * per_batch, (b + 1) * per_batch)
            if b % 2:
                events = [_chunk(f"f{i}", 0, t, 20) for i in ids]
            else:
                events = [{"type": "start", "stream": f"f{i}", "t_ms": t} for i in ids]
            yield t, topic, json.dumps(events).encode()
            flooder = monitor.engine.device("flooder")
            assert flooder is not None
            peak_streams = max(peak_streams, len(flooder.streams))
            assert len(flooder.tombstones) <= 4 * limits.max_streams_per_device

    started = time.monotonic()
    seen = run_flood(monitor, flood(), end_ms)
    elapsed = time.monotonic() - started
    gc.collect()
    growth = rss_mb() - rss_before

    flooder = monitor.engine.device("flooder")
    assert flooder is not None
    assert peak_streams == limits.max_streams_per_device
    assert flooder.stats.streams_started > limits.max_streams_per_device  # expiry made room
    assert flooder.stats.streams_started + monitor.results["stream_limit"] == batches * per_batch
    assert seen == expected_legit(end_ms)
    series = series_count(monitor, end_ms, limits)
    bound = series_count(Monitor(EngineConfig()), end_ms, limits) + len(RESULT_LABELS)
    bound += 3 * series_per_device(limits)  # flooder + two legit devices
    assert series <= bound, (series, bound)
    assert growth < RSS_BOUND_MB, f"RSS grew by {growth:.1f} MB"
    print(f"\n1M stream ids: {elapsed:.1f} s, RSS +{growth:.1f} MB, {series} series (≤ {bound})")


def test_a_hundred_thousand_device_names_stay_bounded() -> None:
    """100,000 distinct device names each send one message with a live stream: at most
    `max_devices` devices exist (the two legit ones among them), every refused message is
    counted `device_limit`, `/metrics` stays within `max_devices × series_per_device` plus the
    fixed series, RSS grows by less than `RSS_BOUND_MB`, and the legit devices' throttle
    transitions happen at exactly the instants they would without the flood."""
    limits = Limits()
    monitor = Monitor(EngineConfig(limits=limits))
    prime_legit(monitor)
    names, step_ms = 100_000, 1.0
    end_ms = T0 + names * step_ms + 2_000
    gc.collect()
    rss_before = rss_mb()

    def flood() -> Iterator[tuple[float, str, bytes]]:
        for n in range(names):
            t = T0 + 1 + n * step_ms
            # A long-lived live stream per device: per-stream series and histograms in use.
            events = [_chunk("s", 0, t, 600_000), _chunk("s", 1, t, 10)]
            yield t, f"{P}/dev{n:06d}/events", json.dumps(events).encode()

    started = time.monotonic()
    seen = run_flood(monitor, flood(), end_ms)
    elapsed = time.monotonic() - started
    gc.collect()
    growth = rss_mb() - rss_before

    devices = list(monitor.engine.devices())
    admitted = limits.max_devices - len(LEGIT)
    assert len(devices) == limits.max_devices
    assert {d.id for d in devices} >= set(LEGIT)
    assert monitor.results["device_limit"] == 2 * (names - admitted)  # two events a message
    assert seen == expected_legit(end_ms)
    series = series_count(monitor, end_ms, limits)
    bound = series_count(Monitor(EngineConfig()), end_ms, limits) + len(RESULT_LABELS)
    bound += limits.max_devices * series_per_device(limits)
    assert series <= bound, (series, bound)
    assert growth < RSS_BOUND_MB, f"RSS grew by {growth:.1f} MB"
    print(
        f"\n100k device names: {elapsed:.1f} s, RSS +{growth:.1f} MB, {series} series (≤ {bound})"
    )
