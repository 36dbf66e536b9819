"""The capacity object (docs/protocol.md): decoded, kept per device, counted like any message,
carried through snapshots and replay, and exported as metrics (docs/metrics.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest

from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.engine.capacity import Capacity, CapacityRecord
from edgemon.engine.config import EngineConfig, Limits
from edgemon.monitor import Monitor
from edgemon.replay import replay
from edgemon.trace import TraceRecord
from edgemon.wire.decode import Problem, decode_capacity

from scrapes import sample, samples

C1 = "edgemon/v1/d1/capacity"
T0 = 1_764_000_000_000.0
FULL = {
    "t_ms": T0,
    "realtime_streams": 12,
    "running": 9,
    "waiting": 2,
    "start_wait_ms": 1500,
    "shed_total": 4,
}


def send(monitor: Monitor, value: Any, recv_ms: float = T0, topic: str = C1) -> None:
    """Deliver one message (a JSON value, or raw bytes) at `recv_ms`."""
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    monitor.handle(topic, body, recv_ms, [])


def record(monitor: Monitor, device: str = "d1") -> CapacityRecord | None:
    found = monitor.engine.device(device)
    return None if found is None else found.capacity


def test_decodes_every_field_and_ignores_unknown_ones() -> None:
    """Every field is optional (null too), unknown fields are ignored, integers are whole."""
    decoded = decode_capacity(json.dumps({**FULL, "gpu": "x"}).encode(), max_bytes=1000)
    assert decoded == Capacity(
        t_ms=T0, realtime_streams=12.0, running=9, waiting=2, start_wait_ms=1500.0, shed_total=4
    )
    assert decode_capacity(b"{}", max_bytes=1000) == Capacity()
    assert decode_capacity(b'{"start_wait_ms": null}', max_bytes=1000) == Capacity()
    assert decode_capacity(b'{"realtime_streams": 7.5}', max_bytes=1000) == Capacity(
        realtime_streams=7.5
    )


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"running": -1}', "invalid_event"),
        (b'{"running": 1.5}', "invalid_event"),
        (b'{"running": true}', "invalid_event"),
        (b'{"waiting": "3"}', "invalid_event"),
        (b'{"start_wait_ms": -5}', "invalid_event"),
        (b'{"realtime_streams": 1e400}', "invalid_event"),
        (b'{"shed_total": 9007199254740993}', "invalid_event"),
        (b"[1, 2]", "invalid_event"),
        (b'{"t_ms": NaN}', "invalid_json"),
        (b"{not json", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        (b'{"running": 1, "pad": "' + b"x" * 300 + b'"}', "oversized"),
    ],
)
def test_bad_capacity_objects_are_rejected_and_counted(payload: bytes, reason: str) -> None:
    """A bad value (negative, fractional count, wrong type, not finite, not JSON, too large)
    rejects the whole object under its `result`, as other bad input is; nothing is kept."""
    assert isinstance(decode_capacity(payload, max_bytes=256), Problem)
    monitor = Monitor(EngineConfig(limits=Limits(max_payload_bytes=256)))
    send(monitor, payload)
    assert monitor.results == {reason: 1}
    assert monitor.engine.device("d1") is None


def test_the_last_object_is_kept_per_device() -> None:
    """Each device keeps its own last object and when it came; a capacity object is a
    message, not an event, counted `accepted`, and touches no stream or throttle."""
    monitor = Monitor(EngineConfig())
    send(monitor, FULL)
    send(monitor, {"running": 3}, T0 + 1000, "edgemon/v1/d2/capacity")
    send(monitor, {**FULL, "running": 12, "waiting": 5}, T0 + 2000)
    d1, d2 = record(monitor, "d1"), record(monitor, "d2")
    assert d1 is not None
    assert d2 is not None
    assert (d1.last.running, d1.last.waiting, d1.received_wall_ms) == (12, 5, T0 + 2000)
    assert (d2.last, d2.received_wall_ms) == (Capacity(running=3), T0 + 1000)
    assert monitor.results == {"accepted": 3}
    assert (monitor.messages, monitor.events) == (3, 0)
    device = monitor.engine.device("d1")
    assert device is not None
    assert not device.streams
    assert not device.throttle_on


def test_devices_limit_bounds_capacity_objects_too() -> None:
    """A capacity object from a device beyond `max_devices` is refused as `device_limit`."""
    monitor = Monitor(EngineConfig(limits=Limits(max_devices=2)))
    for n in range(4):
        send(monitor, FULL, topic=f"edgemon/v1/d{n}/capacity")
    assert monitor.results == {"accepted": 2, "device_limit": 2}
    assert len(list(monitor.engine.devices())) == 2


def test_a_device_known_only_by_capacity_is_forgotten_when_idle() -> None:
    """Capacity objects keep a device known like any message; after `device_idle_ms` without
    one it is forgotten with the rest of its state."""
    config = EngineConfig(limits=Limits(device_idle_ms=10_000))
    monitor = Monitor(config)
    send(monitor, FULL)
    send(monitor, FULL, T0 + 8000)
    monitor.advance(T0 + 17_000, [])
    assert record(monitor) is not None
    monitor.advance(T0 + 18_000, [])
    assert monitor.engine.device("d1") is None


def test_shed_count_adds_across_engine_restarts() -> None:
    """`shed_total` is the engine's count since it started: a lower value is a restart, and
    the count kept adds it to what the engine's earlier life counted, so it never decreases;
    an object without `shed_total` leaves the count as it was."""
    monitor = Monitor(EngineConfig())
    kept = []
    for n, total in enumerate([4, 6, None, 6, 1, 3, 0, 2]):
        send(monitor, {} if total is None else {"shed_total": total}, T0 + n)
        found = record(monitor)
        assert found is not None
        kept.append(found.shed)
    assert kept == [4, 6, 6, 6, 7, 9, 9, 11]


def test_snapshot_and_restore_keep_the_record() -> None:
    """A restart from a snapshot keeps the last object, when it came, and the count across
    engine restarts; a snapshot taken before capacity objects existed restores without one."""
    monitor = Monitor(EngineConfig())
    send(monitor, {**FULL, "shed_total": 10})
    send(monitor, {**FULL, "shed_total": 2}, T0 + 500)
    data = json.loads(json.dumps(monitor.snapshot(T0 + 600)))
    restored = Monitor(EngineConfig())
    restored.restore(data, T0 + 60_000)
    found = record(restored)
    assert found is not None
    assert (found.last, found.received_wall_ms, found.shed) == (
        Capacity(**{**FULL, "shed_total": 2}),  # type: ignore[arg-type]
        T0 + 500,
        12,
    )
    send(restored, {"shed_total": 1}, T0 + 61_000)
    assert found.shed == 13
    for device in data["engine"]["devices"]:
        del device["capacity"]
    older = Monitor(EngineConfig())
    older.restore(data, T0 + 60_000)
    assert older.engine.device("d1") is not None
    assert record(older) is None


def test_replay_takes_recorded_capacity_objects() -> None:
    """A trace with capacity objects replays as the daemon ran: valid ones are messages with
    no output, a bad one is a rejection line."""
    records = [
        TraceRecord(T0, C1, json.dumps(FULL).encode()),
        TraceRecord(T0 + 1000, C1, b'{"running": -2}'),
        TraceRecord(T0 + 2000, C1, b'{"running": 4}'),
    ]
    lines = list(replay(records, EngineConfig()))
    assert [line["kind"] for line in lines] == ["rejected", "summary"]
    assert lines[0]["reason"] == "invalid_event"
    assert (lines[-1]["messages"], lines[-1]["rejected"], lines[-1]["events"]) == (3, 1, 0)


def test_metrics_appear_with_the_first_object() -> None:
    """The capacity gauges and the refusals counter are absent until a capacity object came;
    then each gauge follows the last object (in seconds for the wait), a field the object
    leaves out has no sample, and the counter never decreases across an engine restart."""
    monitor = Monitor(EngineConfig())
    now = [T0]
    registry = build_registry(
        monitor,
        wall_clock=lambda: now[0],
        connection=ConnectionState(),
        per_stream_series=0,
        version="0",
    )
    events = [{"type": "chunk", "stream": "s", "t_ms": T0, "seq": 0, "audio_ms": 200}]
    send(monitor, events, T0, "edgemon/v1/d1/events")
    text = generate_latest(registry).decode()
    assert "edgemon_engine_" not in text
    send(monitor, FULL)
    text = generate_latest(registry).decode()
    labels = {"device": "d1"}
    assert sample(text, "edgemon_engine_realtime_capacity", labels) == 12.0
    assert sample(text, "edgemon_engine_running", labels) == 9.0
    assert sample(text, "edgemon_engine_waiting", labels) == 2.0
    assert sample(text, "edgemon_engine_start_wait_seconds", labels) == 1.5
    assert sample(text, "edgemon_engine_shed_total", labels) == 4.0
    send(monitor, {"running": 2, "shed_total": 1}, T0 + 1000)
    text = generate_latest(registry).decode()
    assert sample(text, "edgemon_engine_running", labels) == 2.0
    assert samples(text, "edgemon_engine_waiting") == {}
    assert samples(text, "edgemon_engine_start_wait_seconds") == {}
    assert sample(text, "edgemon_engine_shed_total", labels) == 5.0
