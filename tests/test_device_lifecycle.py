"""Device lifecycle (reliability.md): idle devices are forgotten at an exact instant, so churn never
locks new devices out, and a known device is never refused because new ids flood in."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from edgemon.engine import ChunkEvent, Engine, EngineConfig, Limits, SlackPolicy
from edgemon.engine.outputs import DeviceForgotten, StreamEnded
from edgemon.monitor import Monitor

if TYPE_CHECKING:
    from edgemon.engine import Output

IDLE_MS = 5_000.0
TIMEOUT_MS = 1_000.0
CONFIG = EngineConfig(
    slack=SlackPolicy(stream_idle_timeout_ms=TIMEOUT_MS, clock="trust"),
    limits=Limits(max_devices=10, device_idle_ms=IDLE_MS),
)


def chunk(
    t: float, seq: int = 0, stream: str = "s", audio: float = 200.0, *, final: bool = False
) -> ChunkEvent:
    """One chunk with its next one due in 100 ms."""
    return ChunkEvent(stream=stream, t_ms=t, seq=seq, audio_ms=audio, eta_ms=100, final=final)


def test_churn_of_ten_times_max_devices_is_never_refused() -> None:
    """100 devices come and go in waves of 10 over virtual time (max_devices 10): each plays a
    stream, falls silent and is forgotten, so no wave is refused with device_limit and the
    engine never holds more than the 10 devices of one wave."""
    engine = Engine(CONFIG)
    out: list[Output] = []
    results: list[str] = []
    for wave in range(10):
        base = wave * 10_000.0
        for i in range(10):
            engine.advance(base + i, out)
            device = f"w{wave}-{i}"
            results += engine.apply(device, [chunk(base + i)], base + i, out)
        assert len(list(engine.devices())) == 10
        engine.advance(base + 9_999, out)  # stream ends + idle time pass within the wave
    assert results == ["accepted"] * 100
    forgotten = [o for o in out if isinstance(o, DeviceForgotten)]
    assert len(forgotten) == 100
    assert list(engine.devices()) == []


def test_a_known_device_is_never_refused_under_a_flood_of_new_ids() -> None:
    """Two devices keep streaming while 100 new ids (10x max_devices) flood in: the flood
    fills the free places and is then refused; the known devices never are."""
    engine = Engine(CONFIG)
    out: list[Output] = []
    known = ("speaker-a", "speaker-b")
    for device in known:
        assert engine.apply(device, [chunk(0.0)], 0.0, out) == ["accepted"]
    refused = 0
    for n in range(100):
        t = 10.0 * (n + 1)
        engine.advance(t, out)
        refused += engine.apply(f"fake-{n}", [chunk(t)], t, out) == ["device_limit"]
        for device in known:
            assert engine.apply(device, [chunk(t, seq=n + 1)], t, out) == ["accepted"]
    assert refused == 92


def test_forgetting_happens_at_the_exact_instant_and_only_when_idle() -> None:
    """A device whose stream expired and whose throttle is off is forgotten exactly
    device_idle after its last message: next_deadline says so, one ms before it is still
    there, at the instant a DeviceForgotten says it went. A new message afterwards starts a
    fresh device."""
    engine = Engine(CONFIG)
    out: list[Output] = []
    engine.apply("d", [chunk(0.0, audio=200.0)], 0.0, out)
    engine.advance(3_000.0, out)
    assert [o.reason for o in out if isinstance(o, StreamEnded)] == ["expired"]
    device = engine.device("d")
    assert device is not None
    assert not device.throttle_on
    assert engine.next_deadline() == IDLE_MS
    engine.advance(IDLE_MS - 1, out)
    assert engine.device("d") is device
    engine.advance(IDLE_MS, out)
    assert engine.device("d") is None
    assert [o for o in out if isinstance(o, DeviceForgotten)] == [
        DeviceForgotten("d", IDLE_MS, IDLE_MS, device.stats)
    ]
    assert engine.next_deadline() is None
    engine.apply("d", [chunk(9_000.0)], 9_000.0, out)
    fresh = engine.device("d")
    assert fresh is not None
    assert fresh is not device
    assert fresh.stats.chunks == 1


def test_a_device_with_a_live_stream_or_a_throttle_is_not_forgotten() -> None:
    """Long silence alone forgets nothing while a stream lives (a long idle timeout keeps it);
    once the stream ends the device goes, device_idle after its last message or at once."""
    config = EngineConfig(
        slack=SlackPolicy(stream_idle_timeout_ms=60_000, clock="trust"),
        limits=Limits(device_idle_ms=IDLE_MS),
    )
    engine = Engine(config)
    out: list[Output] = []
    engine.apply("d", [chunk(0.0, audio=50.0)], 0.0, out)
    engine.advance(30_000.0, out)
    device = engine.device("d")
    assert device is not None
    assert device.streams
    assert device.throttle_on
    engine.advance(60_049.0, out)
    assert engine.device("d") is device
    engine.advance(60_050.0, out)  # expired now; idle since 0, so forgotten at this instant
    assert engine.device("d") is None
    assert [type(o).__name__ for o in out[-3:]] == [
        "StreamEnded",
        "ThrottleChanged",
        "DeviceForgotten",
    ]


def test_a_forgotten_device_leaves_the_snapshot_and_a_restored_idle_one_is_forgotten() -> None:
    """The snapshot holds known devices only; a restored idle device is forgotten
    device_idle after its last message, as if there had been no restart."""
    monitor = Monitor(CONFIG)
    out: list[Output] = []
    for device, t in (("old", 0.0), ("new", 3_000.0)):
        event = {"type": "chunk", "stream": "s", "t_ms": t, "seq": 0, "audio_ms": 100.0}
        monitor.receive(f"edgemon/v1/{device}/events", json.dumps(event).encode(), t, out)
    monitor.advance(IDLE_MS, out)
    data = json.loads(json.dumps(monitor.snapshot(IDLE_MS)))
    assert [d["id"] for d in data["engine"]["devices"]] == ["new"]
    successor = Monitor(CONFIG)
    successor.restore(data, IDLE_MS)
    successor.advance(IDLE_MS, out)  # the restored throttle decision
    assert successor.next_deadline() == 3_000.0 + IDLE_MS
    successor.advance(3_000.0 + IDLE_MS, out)
    assert list(successor.engine.devices()) == []


def test_a_device_idle_busy_and_idle_again_is_forgotten_after_its_last_message() -> None:
    """Idle, then a new stream, then idle again: the device is forgotten device_idle after
    its last message (its first idle deadline, met while it was busy, does not linger)."""
    engine = Engine(CONFIG)
    out: list[Output] = []
    engine.apply("d", [chunk(0.0, audio=10.0, final=True)], 0.0, out)
    engine.advance(10.0, out)  # played out: completed
    assert engine.next_deadline() == IDLE_MS
    engine.apply("d", [chunk(100.0, stream="t")], 100.0, out)
    engine.advance(100.0, out)
    while (deadline := engine.next_deadline()) is not None:
        engine.advance(deadline, out)
    (forgotten,) = [o for o in out if isinstance(o, DeviceForgotten)]
    assert forgotten.wall_ms == 100.0 + IDLE_MS
