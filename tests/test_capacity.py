"""The capacity object (docs/protocol.md): decoded, kept per device, counted like any message,
carried through snapshots and replay, and exported as metrics (docs/metrics.md); its power
bounded: an emptied topic is a deletion, an unreadable object voids the last one, the
refusals counted move by plausible steps only, the predicted wait is clamped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest

from edgemon.adapters.metrics import ConnectionState, build_registry
from edgemon.capacity_object import Capacity
from edgemon.engine.capacity import CapacityRecord
from edgemon.engine.config import EngineConfig, Limits
from edgemon.engine.outputs import Rejected
from edgemon.monitor import Monitor
from edgemon.protocol import MAX_START_WAIT_MS, SHED_BURST, SHED_RATE_PER_S
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
    assert d1.last is not None
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


def test_an_emptied_topic_is_a_deletion_never_a_rejection() -> None:
    """The empty retained payload an engine leaves at a restart (or its will) removes the
    device's capacity object or engine object: counted `deleted`, never rejected (before, it
    was `invalid_json` and counted toward `EdgemonInputRejected`); the refusals counted stay;
    an emptied topic of a device not known makes no device; an emptied events topic (a
    retained message left there) is a deletion too (before, `invalid_json`)."""
    monitor = Monitor(EngineConfig())
    out: list[Any] = []
    monitor.handle("edgemon/v1/d1/engine", json.dumps({"margin_ms": 300}).encode(), T0, out)
    send(monitor, {**FULL, "shed_total": 7}, T0 + 1)
    device = monitor.engine.device("d1")
    assert device is not None
    assert device.engine_info is not None
    for topic in (C1, "edgemon/v1/d1/engine", "edgemon/v1/d9/capacity", "edgemon/v1/d1/events"):
        monitor.handle(topic, b"", T0 + 2, out)
    found = record(monitor)
    assert found is not None
    assert (found.last, found.shed) == (None, 7)
    assert device.engine_info is None
    assert monitor.results == {"accepted": 2, "deleted": 4}
    assert not [o for o in out if isinstance(o, Rejected)]
    assert monitor.engine.device("d9") is None


@pytest.mark.parametrize(
    "payload",
    [b'{"start_wait_ms": ' + b"9" * 400 + b"}", b"[" * 100_000 + b"]" * 100_000, b"\xff"],
    ids=["400-digit integer", "nested 100,000 deep", "not UTF-8"],
)
def test_an_unreadable_object_voids_the_last_one(payload: bytes) -> None:
    """After a refusing object, an unreadable one (rejected and counted as before) leaves
    nothing known of the engine: the gauges go, the refusals counted stay (before, the
    refusing object stayed in force)."""
    monitor = Monitor(EngineConfig(limits=Limits(max_payload_bytes=1_000_000)))
    send(monitor, {**FULL, "start_wait_ms": 60_000})
    send(monitor, payload, T0 + 1)
    found = record(monitor)
    assert found is not None
    assert (found.last, found.shed, found.received_wall_ms) == (None, 4, T0 + 1)
    assert monitor.results["accepted"] == 1
    assert sum(monitor.results.values()) == 2
    registry = build_registry(
        monitor,
        wall_clock=lambda: T0 + 2,
        connection=ConnectionState(),
        per_stream_series=0,
        version="0",
    )
    text = generate_latest(registry).decode()
    assert samples(text, "edgemon_engine_start_wait_seconds") == {}
    assert sample(text, "edgemon_engine_shed_total", {"device": "d1"}) == 4.0


def test_the_refusals_counted_move_by_plausible_steps_only() -> None:
    """Objects swinging `shed_total` between 2^53 and 0 (each 0 an engine restart, each 2^53
    a jump) move the count by at most `SHED_BURST` plus `SHED_RATE_PER_S` a second (before:
    by 2^53 at each swing); what was cut is kept in `shed_cut`; later real steps count."""
    monitor = Monitor(EngineConfig())
    send(monitor, {"shed_total": 10})
    for n in range(10):
        send(monitor, {"shed_total": 2**53}, T0 + 10 * n + 1)
        send(monitor, {"shed_total": 0}, T0 + 10 * n + 2)
    found = record(monitor)
    assert found is not None
    assert 10 + SHED_BURST <= found.shed <= 10 + SHED_BURST + SHED_RATE_PER_S * 0.1
    assert found.shed_cut > 2**53
    send(monitor, {"shed_total": 3}, T0 + 60_000)
    assert found.shed >= 10 + SHED_BURST + 3
    restored = Monitor(EngineConfig())
    restored.restore(json.loads(json.dumps(monitor.snapshot(T0 + 60_001))), T0 + 60_001)
    again = record(restored)
    assert again is not None
    assert (again.shed, again.shed_cut) == (found.shed, found.shed_cut)


def test_a_snapshot_of_an_earlier_version_restores_its_count() -> None:
    """A capacity record written before plausible steps (`shed_before` and `shed_last`)
    restores with the count it had."""
    old = {"last": Capacity(shed_total=2).as_dict(), "received_wall_ms": T0,
           "shed_before": 10, "shed_last": 2}  # fmt: skip
    restored = CapacityRecord.from_dict(old)
    assert (restored.shed, restored.last) == (12, Capacity(shed_total=2))


def test_the_predicted_wait_is_clamped() -> None:
    """`start_wait_ms` is kept as at most `MAX_START_WAIT_MS` (10 minutes): 1e15 ms (31,000
    years) is no gauge value."""
    decoded = decode_capacity(b'{"start_wait_ms": 1e15}', max_bytes=1000)
    assert decoded == Capacity(start_wait_ms=MAX_START_WAIT_MS)
