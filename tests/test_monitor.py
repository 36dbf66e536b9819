"""The monitor: topic routing, decoding and the per-result counts of docs/runbook.md
and docs/reliability.md."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from edgemon.engine.config import EngineConfig, Limits, SlackPolicy
from edgemon.engine.outputs import (
    Rejected,
    StreamEnded,
    ThrottleChanged,
    UnderrunBegan,
    UnderrunConfirmed,
)
from edgemon.monitor import APPLIED, Monitor

if TYPE_CHECKING:
    from edgemon.engine.outputs import Output

D1 = "edgemon/v1/d1/events"
D2 = "edgemon/v1/d2/events"
E1 = "edgemon/v1/d1/engine"

#: No wait for late or reordered chunks: what arrives is applied at once (docs/semantics.md off).
NO_LATENESS = EngineConfig(slack=SlackPolicy(allowed_lateness_ms=0))


def start(stream: str = "s", t: float = 0) -> dict[str, Any]:
    """A start event."""
    return {"type": "start", "stream": stream, "t_ms": t}


def chunk(
    seq: int, t: float, stream: str = "s", audio: float = 200, **extra: Any
) -> dict[str, Any]:
    """A chunk event."""
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio, **extra}


def end(stream: str = "s", t: float = 0, reason: str = "completed") -> dict[str, Any]:
    """An end event."""
    return {"type": "end", "stream": stream, "t_ms": t, "reason": reason}


class Harness:
    """A monitor driven message by message, keeping every output."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.monitor = Monitor(config or EngineConfig())
        self.out: list[Output] = []

    def send(self, recv_ms: float, value: Any, topic: str = D1) -> list[Output]:
        """Deliver one message (a JSON value, or raw bytes) at `recv_ms`; its outputs."""
        body = value if isinstance(value, bytes) else json.dumps(value).encode()
        first = len(self.out)
        self.monitor.advance(recv_ms, self.out)
        self.monitor.receive(topic, body, recv_ms, self.out)
        return self.out[first:]

    def finish(self) -> None:
        """Run the clock on until nothing is pending."""
        while (deadline := self.monitor.next_deadline()) is not None:
            self.monitor.advance(deadline, self.out)

    @property
    def results(self) -> Counter[str]:
        """The monitor's per-result counts."""
        return self.monitor.results

    def rejected(self) -> list[Rejected]:
        """Every Rejected output so far."""
        return [o for o in self.out if isinstance(o, Rejected)]

    def ended(self) -> list[StreamEnded]:
        """Every stream summary so far."""
        return [o for o in self.out if isinstance(o, StreamEnded)]


def test_accepted_events_are_counted() -> None:
    """Every applied event counts once as `accepted`; every message counts in `messages`."""
    h = Harness()
    h.send(0, start())
    h.send(10, chunk(0, 10))
    h.send(20, [chunk(1, 20), chunk(2, 30)])
    assert h.results == Counter(accepted=4)
    assert h.monitor.messages == 3
    assert h.rejected() == []
    assert {"accepted", "gap"} == APPLIED


def test_gap_is_applied_and_counted_as_gap() -> None:
    """With allowed_lateness_ms 0 (no wait for a late chunk), a chunk with `seq` > last + 1
    is applied at once and counted under `gap`, not `accepted`."""
    h = Harness(NO_LATENESS)
    h.send(0, chunk(0, 0))
    outputs = h.send(10, chunk(3, 10, audio_total_ms=800))
    assert not [o for o in outputs if isinstance(o, Rejected)]
    assert h.results == Counter(accepted=1, gap=1)
    h.send(20, end(t=20))
    summary = h.ended()[0]
    assert summary.chunks == 2
    assert summary.audio_ms == 800  # resynchronised to audio_total_ms


def test_duplicates_are_rejected_and_counted() -> None:
    """A repeated `seq`, an older `seq` and a second `start` of a live stream are `duplicate`."""
    h = Harness()
    h.send(0, start())
    h.send(10, chunk(0, 10))
    h.send(20, chunk(1, 20))
    h.send(30, chunk(1, 20))
    h.send(40, chunk(0, 10))
    h.send(50, start(t=50))
    assert h.results == Counter(accepted=3, duplicate=3)
    assert [r.reason for r in h.rejected()] == ["duplicate"] * 3
    h.send(60, end(t=60))
    assert h.ended()[0].chunks == 2


def test_invalid_json_is_counted_once() -> None:
    """A payload that is not JSON is one `invalid_json`, with the topic's device."""
    h = Harness()
    h.send(5, b'[{"type":"chunk"')
    h.send(6, b"\xff\xfe")
    assert h.results == Counter(invalid_json=2)
    first = h.rejected()[0]
    assert (first.recv_ms, first.topic, first.device, first.reason) == (5, D1, "d1", "invalid_json")
    assert first.detail


def test_invalid_event_is_counted() -> None:
    """An event that fails validation is `invalid_event` and changes nothing."""
    h = Harness()
    h.send(0, chunk(0, 0, audio=0))
    h.send(1, {"type": "pause", "stream": "s", "t_ms": 1})
    assert h.results == Counter(invalid_event=2)
    device = h.monitor.engine.device("d1")
    assert device is None or not device.streams


def test_unknown_topic_has_no_device() -> None:
    """A message on a topic that is not ours is `unknown_topic`, its device unknown (None)."""
    h = Harness()
    for topic in ("edgemon/v1/d1/throttle", "other/d1/events", "edgemon/v1/bad id/events"):
        h.send(7, chunk(0, 7), topic=topic)
    assert h.results == Counter(unknown_topic=3)
    assert all(r.device is None and r.reason == "unknown_topic" for r in h.rejected())
    assert h.rejected()[0].topic == "edgemon/v1/d1/throttle"
    assert list(h.monitor.engine.devices()) == []


def test_custom_topic_prefix() -> None:
    """The engine config's topic prefix decides which topics are routed."""
    h = Harness(EngineConfig(topic_prefix="site/edge"))
    h.send(0, chunk(0, 0), topic="site/edge/box/events")
    h.send(0, chunk(0, 0), topic=D1)
    assert h.results == Counter(accepted=1, unknown_topic=1)
    assert h.monitor.engine.device("box") is not None


def test_oversized_payload_and_batch_count_once() -> None:
    """An oversized payload, or a batch over `max_batch_events`, is one `oversized` each."""
    h = Harness(EngineConfig(limits=Limits(max_payload_bytes=300, max_batch_events=2)))
    h.send(0, {"type": "end", "stream": "s", "t_ms": 0, "pad": "x" * 300})
    h.send(1, [chunk(0, 1), chunk(1, 1), chunk(2, 1)])
    h.send(2, "x" * 400, topic=E1)
    assert h.results == Counter(oversized=3)
    assert h.monitor.messages == 3
    assert [r.device for r in h.rejected()] == ["d1", "d1", "d1"]


def test_message_rejected_before_its_events_counts_once() -> None:
    """Bad JSON, an empty batch or a scalar counts once, however many events it might hold."""
    h = Harness()
    h.send(0, b"[" + b'{"type":"end","stream":"s","t_ms":0},' * 5)  # truncated batch
    h.send(1, [])
    h.send(2, 42)
    assert h.results == Counter(invalid_json=1, invalid_event=2)
    assert len(h.rejected()) == 3


def test_batch_counts_once_per_event() -> None:
    """In a batch each event is counted under its own result and each rejection is reported
    (no wait for late chunks: the chunk after a hole is a gap at once)."""
    h = Harness(NO_LATENESS)
    batch = [start(), chunk(0, 0), {"type": "chunk"}, chunk(0, 0), 7, chunk(2, 5), end("x")]
    h.send(100, batch)
    assert h.results == Counter(accepted=2, invalid_event=2, duplicate=1, gap=1, unknown_stream=1)
    assert h.monitor.messages == 1
    reasons = Counter(r.reason for r in h.rejected())
    assert reasons == Counter(invalid_event=2, duplicate=1, unknown_stream=1)
    assert all(r.recv_ms == 100 and r.topic == D1 and r.device == "d1" for r in h.rejected())


def test_rejected_output_describes_the_event() -> None:
    """A rejection by the engine names the event type and stream in its detail."""
    h = Harness()
    h.send(3, end("ghost", 3))
    (rejection,) = h.rejected()
    assert rejection == Rejected(3, D1, "d1", "unknown_stream", rejection.detail)
    assert "end" in rejection.detail
    assert "ghost" in rejection.detail


def test_device_limit() -> None:
    """Beyond `max_devices` a new device's events and engine objects are `device_limit`."""
    h = Harness(EngineConfig(limits=Limits(max_devices=1)))
    h.send(0, chunk(0, 0))
    h.send(1, [start("a", 1), start("b", 1)], topic=D2)
    h.send(2, {"hardware_class": "x86"}, topic="edgemon/v1/d2/engine")
    h.send(3, chunk(1, 3))  # the first device goes on
    assert h.results == Counter(accepted=2, device_limit=3)
    assert [r.device for r in h.rejected()] == ["d2", "d2", "d2"]
    assert h.monitor.engine.device("d2") is None
    assert [d.id for d in h.monitor.engine.devices()] == ["d1"]


def test_stream_limit() -> None:
    """Beyond `max_streams_per_device` a new stream is `stream_limit`; state stays intact."""
    h = Harness(EngineConfig(limits=Limits(max_streams_per_device=1)))
    h.send(0, start("a"))
    h.send(1, start("b", 1))
    h.send(2, chunk(0, 2, stream="c"))
    h.send(3, chunk(0, 3, stream="a"))
    h.send(3, chunk(0, 3, stream="z"), topic=D2)  # the limit is per device
    assert h.results == Counter(accepted=3, stream_limit=2)
    assert [r.reason for r in h.rejected()] == ["stream_limit"] * 2
    device = h.monitor.engine.device("d1")
    assert device is not None
    assert list(device.streams) == ["a"]
    h.send(4, end("a", 4))
    h.send(5, start("b", 5))  # room again once a stream is gone
    assert h.results["accepted"] == 5


def test_end_of_unknown_stream() -> None:
    """An `end` for a stream never seen is `unknown_stream`."""
    h = Harness()
    h.send(0, end("nobody"))
    assert h.results == Counter(unknown_stream=1)
    assert h.ended() == []


def test_late_chunk_of_ended_stream_is_duplicate() -> None:
    """After an `end`, a late chunk (seq > 0) or end is `duplicate` and starts no new stream."""
    h = Harness()
    h.send(0, chunk(0, 0))
    h.send(10, end(t=10, reason="cancelled"))
    h.send(20, chunk(1, 20))
    h.send(25, chunk(5, 25))
    h.send(30, end(t=30))
    assert h.results == Counter(accepted=2, duplicate=3)
    device = h.monitor.engine.device("d1")
    assert device is not None
    assert device.streams == {}
    assert device.stats.streams_started == 1
    h.finish()
    assert [(e.stream, e.reason) for e in h.ended()] == [("s", "cancelled")]


def test_seq_zero_after_end_starts_a_new_stream() -> None:
    """After an `end`, a chunk with `seq` 0 (or a start) begins a new stream with that id."""
    h = Harness()
    h.send(0, chunk(0, 0))
    h.send(10, end(t=10))
    h.send(20, chunk(0, 20))
    assert h.results == Counter(accepted=3)
    device = h.monitor.engine.device("d1")
    assert device is not None
    assert list(device.streams) == ["s"]
    assert device.stats.streams_started == 2


def test_chunk_after_final_is_rejected() -> None:
    """A chunk after the `final` one (while the stream drains) is rejected `after_final`."""
    h = Harness()
    h.send(0, chunk(0, 0, audio=1000, final=True))
    outputs = h.send(20, chunk(1, 20))
    assert [(o.reason, o.device) for o in outputs if isinstance(o, Rejected)] == [
        ("after_final", "d1")
    ]
    assert h.results == Counter(accepted=1, after_final=1)
    h.finish()
    (summary,) = h.ended()
    assert (summary.reason, summary.chunks, summary.audio_ms) == ("completed", 1, 1000)


def test_same_stream_id_on_two_devices() -> None:
    """The device comes from the topic: equal stream ids of two devices are two streams."""
    h = Harness()
    h.send(0, chunk(0, 0))
    h.send(0, chunk(0, 0), topic=D2)
    h.send(1, chunk(1, 1), topic=D2)
    assert h.results == Counter(accepted=3)
    assert {d.id: d.stats.chunks for d in h.monitor.engine.devices()} == {"d1": 1, "d2": 2}


def test_engine_objects() -> None:
    """An engine object is `accepted`; a wrong one `invalid_event`; a KV problem is not a reject."""
    h = Harness()
    h.send(0, {"hardware_class": "npu"}, topic=E1)
    h.send(1, {"kv_cache_bytes": 1, "geometry": {"num_layers": 1}}, topic=E1)
    h.send(2, {"kv_cache_bytes": 1, "max_model_len": 1, "dtype": "fp4", "geometry": {
        "num_layers": 1, "num_kv_heads": 1, "head_dim": 1}}, topic=E1)  # fmt: skip
    h.send(3, b"{", topic=E1)
    assert h.results == Counter(accepted=2, invalid_event=1, invalid_json=1)
    assert [(r.reason, r.device) for r in h.rejected()] == [
        ("invalid_event", "d1"),
        ("invalid_json", "d1"),
    ]
    device = h.monitor.engine.device("d1")
    assert device is not None
    assert device.engine_info is not None
    assert device.engine_info.kv_error is not None
    assert "fp4" in device.engine_info.kv_error


def test_engine_hardware_class_sets_the_device_margin() -> None:
    """The engine object's hardware class gives the device's margin (docs/semantics.md)."""
    h = Harness()
    h.send(0, {"hardware_class": "npu"}, topic=E1)
    device = h.monitor.engine.device("d1")
    assert device is not None
    assert device.margin == 200


def test_handle_fires_due_timers_then_applies_the_message_then_decides() -> None:
    """`Monitor.handle` owns the order of semantics.md: a timer of another device due before the
    message fires first, then the message's own outputs (a rejected duplicate), then the
    throttle decision at the message's instant. Skipping the first step puts d2's underrun
    after the rejection; deciding before applying (or not at all) loses d1's throttle."""
    config = EngineConfig(
        slack=SlackPolicy(allowed_lateness_ms=0, hysteresis_ms=0, min_on_ms=0, clock="trust")
    )
    monitor = Monitor(config)
    out: list[Output] = []
    monitor.handle(D2, json.dumps(chunk(0, 0, stream="b", audio=400, eta_ms=100)).encode(), 0, out)
    monitor.handle(D1, json.dumps(chunk(0, 0, stream="a", audio=1000, eta_ms=100)).encode(), 0, out)
    assert out == []
    late = chunk(1, 500, stream="a", audio=50, eta_ms=5000)  # at risk from 500 on
    monitor.handle(D1, json.dumps([late, late]).encode(), 500, out)
    kinds = [(type(o).__name__, getattr(o, "device", None), getattr(o, "t_ms", None)) for o in out]
    assert kinds == [
        ("ThrottleChanged", "d2", 320.0),  # d2's timers, due before 500
        ("UnderrunBegan", "d2", 400.0),
        ("UnderrunConfirmed", "d2", 400.0),
        ("Rejected", "d1", None),  # the message: its second chunk is a duplicate
        ("ThrottleChanged", "d1", 500.0),  # the decision at 500, after the message
    ]
    assert isinstance(out[3], Rejected)
    assert out[3].reason == "duplicate"
    assert isinstance(out[1], UnderrunBegan)
    assert isinstance(out[2], UnderrunConfirmed)
    assert isinstance(out[4], ThrottleChanged)
    assert out[4].active


def test_until_deadline_is_the_next_deadline_from_a_wall_time() -> None:
    """`until_deadline(wall)` is the next deadline minus `wall` (negative once overdue), and
    None with nothing pending."""
    h = Harness()
    assert h.monitor.until_deadline(0.0) is None
    h.send(0.0, [chunk(0, 0, audio=500)])
    deadline = h.monitor.next_deadline()
    assert deadline is not None
    assert h.monitor.until_deadline(100.0) == deadline - 100.0
    assert h.monitor.until_deadline(deadline + 5.0) == -5.0
