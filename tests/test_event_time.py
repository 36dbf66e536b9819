"""Late and out-of-order delivery (docs/semantics.md): worked examples of provisional underruns,
their confirmation and retraction, the reorder buffer, outages and restarts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from edgemon.engine import ChunkEvent, EndEvent, Engine, EngineConfig, SlackPolicy
from edgemon.engine.outputs import (
    GapDeclared,
    StreamEnded,
    ThrottleChanged,
    UnderrunBegan,
    UnderrunConfirmed,
    UnderrunRetracted,
)
from edgemon.engine.reorder_buffer import MAX_HELD
from edgemon.monitor import Monitor
from edgemon.replay import replay
from edgemon.trace import TraceRecord

if TYPE_CHECKING:
    from edgemon.engine import Event, Output

TRUST = EngineConfig(slack=SlackPolicy(clock="trust", stream_idle_timeout_ms=5_000))


def chunk(t: float, seq: int, audio: float = 200.0, stream: str = "s", **extra: Any) -> ChunkEvent:
    """A chunk of `stream` that reached the player at `t`."""
    return ChunkEvent(stream=stream, t_ms=t, seq=seq, audio_ms=audio, **extra)


class Rig:
    """An engine driven as the daemon drives it: timers up to each receipt, then the message."""

    def __init__(self, config: EngineConfig = TRUST) -> None:
        self.engine = Engine(config)
        self.out: list[Output] = []

    def send(self, recv: float, *events: Event, device: str = "d") -> list[str]:
        self.engine.advance(recv, self.out, inclusive=False)
        return self.engine.apply(device, list(events), recv, self.out)

    def until(self, wall: float) -> None:
        self.engine.advance(wall, self.out)

    def of(self, kind: type) -> list[Any]:
        return [o for o in self.out if isinstance(o, kind)]


def test_a_late_chunk_retracts_the_underrun_announced_live() -> None:
    """The buffer would run dry at 200; a chunk that reached the player at 150 is
    delivered at 260. The underrun announced live at 200 is retracted at 260 and never
    counted; the summary has no underrun and min_slack 50, as the formulas on t_ms say."""
    rig = Rig()
    rig.send(0, chunk(0, 0))
    rig.until(259)
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 200)]
    rig.send(260, chunk(150, 1))
    assert rig.of(UnderrunRetracted) == [UnderrunRetracted("d", "s", 200, 260)]
    rig.send(300, EndEvent(stream="s", t_ms=300))
    rig.until(10_000)
    device = rig.engine.device("d")
    assert device is not None
    assert (device.stats.underruns, device.stats.underruns_retracted) == (0, 1)
    assert rig.of(UnderrunConfirmed) == []
    (end,) = rig.of(StreamEnded)
    assert (end.underruns, end.underrun_ms, end.min_slack_ms) == (0, 0.0, 50)


def test_replay_writes_a_retraction_only_for_an_underrun_announced_live() -> None:
    """Replay: the late chunk above (dry at 200, reached the player at 150, delivered at 260)
    gives an `underrun_retracted` line and no `underrun` line.
    The same late chunk arriving before edgemon's clock reached 200 gives neither."""
    topic = "edgemon/v1/d/events"

    def lines(late_recv: float) -> list[dict[str, Any]]:
        records = [
            TraceRecord(0, topic, json.dumps(_body(chunk(0, 0))).encode()),
            TraceRecord(late_recv, topic, json.dumps(_body(chunk(150, 1))).encode()),
        ]
        return [
            line
            for line in replay(records, TRUST, sample_ms=None)
            if line["kind"] in {"underrun", "underrun_retracted", "summary"}
        ]

    real = {"kind": "underrun", "t_ms": 400, "device": "d", "stream": "s"}
    *marks, summary = lines(260)
    retracted = {"kind": "underrun_retracted", "t_ms": 200, "device": "d", "stream": "s"}
    assert marks == [{**retracted, "retracted_ms": 260}, real]
    assert summary["underruns"] == 1  # the stream's real underrun at 400
    *marks, summary = lines(190)
    assert marks == [real]
    assert summary["underruns"] == 1


def _body(event: ChunkEvent) -> dict[str, Any]:
    """The wire form of a chunk event."""
    return {k: v for k, v in msgspec.to_builtins(event).items() if v is not None}


def test_a_later_message_of_the_device_confirms_the_underrun() -> None:
    """A message of the device with t_ms past u (here another stream's chunk at 210) shows
    the device's time has passed u: the underrun at 200 is confirmed then, and counted."""
    rig = Rig()
    rig.send(0, chunk(0, 0), chunk(0, 0, 5_000, stream="other"))
    rig.until(205)
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 200)]
    assert rig.of(UnderrunConfirmed) == []
    rig.send(212, chunk(210, 1, 100, stream="other"))
    assert rig.of(UnderrunConfirmed) == [UnderrunConfirmed("d", "s", 200, 212, True)]
    device = rig.engine.device("d")
    assert device is not None
    assert device.stats.underruns == 1


def test_without_news_the_underrun_is_confirmed_after_allowed_lateness() -> None:
    """With no message at all, the underrun at 200 is confirmed at 200 + allowed_lateness_ms
    exactly (a deadline of its own, not a poll)."""
    rig = Rig()
    rig.send(0, chunk(0, 0))
    rig.until(1_199)
    assert rig.of(UnderrunConfirmed) == []
    assert rig.engine.next_deadline() == 1_200
    rig.until(1_200)
    assert rig.of(UnderrunConfirmed) == [UnderrunConfirmed("d", "s", 200, 1_200, True)]


def test_a_late_chunk_can_move_the_underrun_to_an_instant_already_past() -> None:
    """The buffer runs dry at 200 (announced); a chunk of 50 ms that reached the player at
    150 arrives at 400: by the device's times the player ran dry at 250, not 200. The 200 one
    is retracted, the 250 one was never announced live and is confirmed with its exact
    instant; its duration ends at the next chunk (t 500): 250 ms."""
    rig = Rig()
    rig.send(0, chunk(0, 0))
    rig.send(400, chunk(150, 1, 50))
    rig.send(501, chunk(500, 2, 1_000))
    assert rig.of(UnderrunRetracted) == [UnderrunRetracted("d", "s", 200, 400)]
    assert [(c.t_ms, c.published) for c in rig.of(UnderrunConfirmed)] == [(250, False)]
    rig.send(600, EndEvent(stream="s", t_ms=600))
    (end,) = rig.of(StreamEnded)
    assert (end.underruns, end.underrun_ms) == (1, 250)


def test_an_end_before_the_instant_retracts_and_one_after_confirms() -> None:
    """A late `end` with t_ms ≤ u shows the stream ended before its buffer ran dry; one with
    t_ms > u confirms the underrun."""
    rig = Rig()
    rig.send(0, chunk(0, 0), chunk(0, 0, stream="b"))
    rig.send(250, EndEvent(stream="s", t_ms=200))
    rig.send(260, EndEvent(stream="b", t_ms=201))
    assert [(o.stream, o.t_ms) for o in rig.of(UnderrunRetracted)] == [("s", 200)]
    assert [(o.stream, o.t_ms) for o in rig.of(UnderrunConfirmed)] == [("b", 200)]


def test_chunks_out_of_seq_order_are_applied_in_order() -> None:
    """Seq 2 arrives before seq 1 (within allowed_lateness_ms): it waits, and when seq 1
    comes both are applied in order — no gap, no duplicate, the audio is all there."""
    rig = Rig()
    assert rig.send(0, chunk(0, 0)) == ["accepted"]
    assert rig.send(120, chunk(110, 2)) == ["accepted"]
    device = rig.engine.device("d")
    assert device is not None
    assert device.streams["s"].buffered == 200
    assert rig.send(130, chunk(100, 1)) == ["accepted"]
    assert (device.streams["s"].buffered, device.streams["s"].last_seq) == (600, 2)
    assert rig.of(GapDeclared) == []
    assert rig.of(UnderrunBegan) == []


def test_a_missing_seq_is_a_gap_only_after_allowed_lateness() -> None:
    """Seq 1 never comes: seq 2 waits until 1 s after it arrived, then is applied as a gap
    (counted `gap` by the monitor) with its own t_ms; an underrun announced meanwhile at 200
    is retracted since seq 2 reached the player at 110."""
    monitor = Monitor(TRUST)
    out: list[Output] = []
    topic = "edgemon/v1/d/events"
    monitor.receive(topic, json.dumps(_body(chunk(0, 0))).encode(), 0, out)
    monitor.advance(120, out)
    monitor.receive(topic, json.dumps(_body(chunk(110, 2))).encode(), 120, out)
    monitor.advance(1_119, out)
    out = [o for o in out if not isinstance(o, ThrottleChanged)]
    assert [type(o) for o in out] == [UnderrunBegan]
    monitor.advance(1_120, out)
    out = [o for o in out if not isinstance(o, ThrottleChanged)]
    assert out[1:3] == [
        GapDeclared("d", "s", 1_120, 1, 1),
        UnderrunRetracted("d", "s", 200, 1_120),
    ]
    assert monitor.results["gap"] == 1
    device = monitor.engine.device("d")
    assert device is not None
    assert device.streams["s"].buffered == 400


def test_an_outage_longer_than_allowed_lateness_confirms_no_underrun() -> None:
    """Five healthy streams (150 ms of audio every 100 ms); the broker is unreachable from
    1 s to 6 s and then delivers everything queued in a burst. Every stream ran dry during
    the outage by what edgemon knew (announced live), but no underrun is confirmed: all are
    retracted, so `edgemon_underruns_total` (what EdgemonUnderruns alerts on) stays 0."""
    rig = Rig()
    sent = [
        (t, chunk(t, t // 100, 150, stream=f"s{i}")) for t in range(0, 8_000, 100) for i in range(5)
    ]
    outage = (1_000, 6_000)
    rig.engine.advance(0, rig.out)
    burst = 0
    lost = False
    for t, event in sent:
        recv = t + 5.0
        if outage[0] <= recv < outage[1]:
            if not lost:
                rig.until(outage[0])
                rig.engine.input_lost()
                lost = True
            continue
        if lost:
            rig.until(outage[1])
            rig.engine.input_restored(outage[1])
            for _, queued in [(q_t, q) for q_t, q in sent if outage[0] <= q_t + 5.0 < outage[1]]:
                burst += 1
                rig.send(outage[1] + burst * 0.01, queued)
            lost = False
        rig.send(recv, event)
    rig.send(7_955, *(EndEvent(stream=f"s{i}", t_ms=7_950) for i in range(5)))
    rig.until(20_000)
    device = rig.engine.device("d")
    assert device is not None
    assert len(rig.of(UnderrunBegan)) >= 5
    assert rig.of(UnderrunConfirmed) == []
    assert device.stats.underruns == 0
    assert device.stats.underruns_retracted == len(rig.of(UnderrunBegan))


def test_a_short_outage_needs_no_notice() -> None:
    """An outage shorter than allowed_lateness_ms confirms nothing even if edgemon is not
    told about it: the late chunks come within the lateness."""
    rig = Rig()
    for t in range(0, 3_000, 100):
        recv = 1_700.0 + t / 1000 if 1_000 <= t < 1_700 else float(t)
        if 1_000 <= t < 1_700:
            continue
        if t == 1_700:
            for late in range(1_000, 1_700, 100):
                for i in range(3):
                    rig.send(1_700 + late / 1000, chunk(late, late // 100, 150, stream=f"s{i}"))
        for i in range(3):
            rig.send(recv, chunk(t, t // 100, 150, stream=f"s{i}"))
    rig.until(2_950)
    device = rig.engine.device("d")
    assert device is not None
    assert len(rig.of(UnderrunBegan)) == 3
    assert device.stats.underruns == 0
    assert device.stats.underruns_retracted == 3


def test_a_restart_keeps_provisional_underruns_and_held_chunks() -> None:
    """Snapshot while an underrun is provisional and a chunk waits for a missing seq; the
    restored monitor retracts and applies them exactly as an uninterrupted one."""
    topic = "edgemon/v1/d/events"
    messages = [
        (0.0, chunk(0, 0)),
        (0.0, chunk(0, 0, stream="b")),
        (230.0, chunk(220, 2, stream="b")),  # ahead of b's seq 1: held
        (260.0, chunk(150, 1)),  # s: late, retracts the underrun at 200
        (300.0, chunk(180, 1, stream="b")),  # b's missing seq: both applied
    ]

    def drive(monitor: Monitor, part: list[tuple[float, ChunkEvent]]) -> list[Output]:
        out: list[Output] = []
        for recv, event in part:
            monitor.advance(recv, out)
            monitor.receive(topic, json.dumps(_body(event)).encode(), recv, out)
        monitor.advance(3_000, out)
        return out

    whole = drive(Monitor(TRUST), messages)
    first = Monitor(TRUST)
    out: list[Output] = []
    for recv, event in messages[:3]:
        first.advance(recv, out)
        first.receive(topic, json.dumps(_body(event)).encode(), recv, out)
    first.advance(250, out)
    data = json.loads(json.dumps(first.snapshot(250), allow_nan=False))
    second = Monitor(TRUST)
    second.restore(data, 250)
    after = drive(second, messages[3:])
    assert out + after == whole
    assert any(isinstance(o, UnderrunRetracted) for o in whole)


def test_the_reorder_buffer_is_bounded() -> None:
    """A stream that runs 33 chunks ahead of a missing seq has the hole declared a gap at
    once: nothing waits beyond 32 chunks, and every chunk is applied in seq order."""
    rig = Rig()
    rig.send(0, chunk(0, 0, 10_000))
    for seq in range(2, 2 + MAX_HELD):
        assert rig.send(seq, chunk(seq, seq, 10)) == ["accepted"]
    device = rig.engine.device("d")
    assert device is not None
    assert device.streams["s"].last_seq == 0
    assert rig.of(GapDeclared) == []
    rig.send(100, chunk(100, 2 + MAX_HELD, 10))
    assert rig.of(GapDeclared) == [GapDeclared("d", "s", 100, 1, 1)]
    assert device.streams["s"].last_seq == 2 + MAX_HELD
    assert device.streams["s"].buffered == 10_000 + 10 * (MAX_HELD + 1)
    assert device.streams["s"].held is None
