"""Worked examples of the engine, computed by hand: slack, underruns, throttle, ends, clocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgemon.engine import (
    ChunkEvent,
    DeviceOverride,
    EndEvent,
    Engine,
    EngineConfig,
    Limits,
    SlackPolicy,
    StartEvent,
    StreamEnded,
    ThrottleChanged,
    UnderrunBegan,
    UnderrunEnded,
)
from edgemon.engine.tts import TtsEngineInfo

if TYPE_CHECKING:
    from edgemon.engine import Event, Output


def chunk(stream: str, t: float, seq: int, audio: float, **extra: object) -> ChunkEvent:
    return ChunkEvent(stream=stream, t_ms=t, seq=seq, audio_ms=audio, **extra)  # type: ignore[arg-type]


def start(stream: str, t: float, **extra: object) -> StartEvent:
    return StartEvent(stream=stream, t_ms=t, **extra)  # type: ignore[arg-type]


class Rig:
    """An engine driven like `replay` drives it: messages, then timers up to each instant."""

    def __init__(self, **slack: object) -> None:
        self.engine = Engine(EngineConfig(slack=SlackPolicy(**slack)))  # type: ignore[arg-type]
        self.out: list[Output] = []

    def send(self, recv: float, *events: Event, device: str = "d") -> list[str]:
        self.engine.advance(recv, self.out, inclusive=False)
        results = self.engine.apply(device, list(events), recv, self.out)
        self.engine.advance(recv, self.out)
        return results

    def run_until(self, wall: float) -> None:
        self.engine.advance(wall, self.out)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [o for o in self.out if isinstance(o, kind)]


def test_the_reference_example_step_by_step() -> None:
    """Chunks (0, 200, eta 150), (150, 200, eta 350), final (500, 200): hand-computed instants.

    Headroom at 0 is 200 − 150 = 50 < 80: throttle ON at 0. At 150 slack is 250 but the next
    chunk is 350 ms away: headroom −100. The buffer empties at 400: underrun. The final chunk
    at 500 ends it (100 ms) and leaves no live stream: throttle OFF at 500. Its audio plays
    out at 600: completed.
    """
    rig = Rig(hysteresis_ms=0, min_on_ms=0)
    rig.send(0, chunk("s", 0, 0, 200, eta_ms=150))
    rig.send(150, chunk("s", 150, 1, 200, eta_ms=350))
    rig.run_until(399)
    assert rig.of(UnderrunBegan) == []
    rig.run_until(400)
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 400)]
    rig.send(500, chunk("s", 500, 2, 200, final=True))
    rig.run_until(10_000)
    assert [(c.t_ms, c.active) for c in rig.of(ThrottleChanged)] == [(0, True), (500, False)]
    assert rig.of(UnderrunEnded) == [UnderrunEnded("d", "s", 500, 100)]
    (ended,) = rig.of(StreamEnded)
    assert (ended.t_ms, ended.reason, ended.chunks, ended.audio_ms) == (600, "completed", 3, 600)
    assert (ended.underruns, ended.underrun_ms, ended.min_slack_ms) == (1, 100, -100)


def test_next_deadline_is_the_exact_underrun_instant() -> None:
    """The engine tells when to wake: exactly when the buffer runs dry, not a poll period."""
    rig = Rig()
    rig.send(1_000, chunk("s", 1_000, 0, 2_000, eta_ms=100))
    deadlines = []
    while (deadline := rig.engine.next_deadline()) is not None and deadline < 3_500:
        deadlines.append(deadline)
        rig.run_until(deadline)
    assert 3_000 in deadlines
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 3_000)]


def test_risk_begins_when_headroom_reaches_the_margin_between_messages() -> None:
    """Headroom falls 1 ms per ms once the next chunk is overdue: risk exactly at slack = margin.

    One chunk of 1000 ms at 0 with eta 100: headroom 900 until 100, then 1000 − t.
    It reaches the 80 ms margin at t = 920: the throttle turns on then, with no message.
    """
    rig = Rig(hysteresis_ms=0, min_on_ms=0)
    rig.send(0, chunk("s", 0, 0, 1_000, eta_ms=100))
    rig.run_until(919)
    assert rig.of(ThrottleChanged) == []
    rig.run_until(920)
    (on,) = rig.of(ThrottleChanged)
    assert (on.t_ms, on.active, on.streams, on.min_headroom_ms) == (920, True, ("s",), 80)


def test_hysteresis_and_minimum_on_time_hold_the_throttle() -> None:
    """OFF needs headroom ≥ margin + hysteresis for every stream and min_on since ON.

    At risk from 0 (headroom 50). A chunk at 100 lifts headroom to 90: above the 80 margin
    but inside the 20 ms band, so the throttle holds. A chunk at 150 lifts it to 290, but the
    minimum on-time (250) keeps it on until 250.
    """
    rig = Rig(hysteresis_ms=20, min_on_ms=250)
    rig.send(0, chunk("s", 0, 0, 200, eta_ms=150))  # headroom 200 − 150 = 50
    rig.send(100, chunk("s", 100, 1, 100, eta_ms=110))  # slack 200, eta 110: 90
    rig.send(150, chunk("s", 150, 2, 400, eta_ms=100))  # slack 550, eta 100: 450
    rig.run_until(1_000)
    assert [(c.t_ms, c.active) for c in rig.of(ThrottleChanged)][:2] == [(0, True), (250, False)]


def test_rebuffer_player_pauses_and_moves_its_start() -> None:
    """Rebuffer: the player stalls at 200, resumes with the chunk at 300; audio ends at 400.

    The underrun lasts from 200 to 300 (the next chunk). Slack never goes below zero.
    """
    rig = Rig(player="rebuffer", hysteresis_ms=0, min_on_ms=0)
    rig.send(0, chunk("s", 0, 0, 200, eta_ms=300))
    rig.send(300, chunk("s", 300, 1, 100, eta_ms=50))
    rig.run_until(399)
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 200)]
    assert rig.of(UnderrunEnded) == [UnderrunEnded("d", "s", 300, 100)]
    rig.run_until(400)
    assert rig.of(UnderrunBegan)[-1] == UnderrunBegan("d", "s", 400)


def test_conceal_underrun_continues_when_a_chunk_leaves_no_audio_ahead() -> None:
    """Conceal: a chunk whose audio is already past the play position does not end the gap."""
    rig = Rig()
    rig.send(0, chunk("s", 0, 0, 100))
    rig.send(300, chunk("s", 300, 1, 200))  # start + B = 300 = t: slack exactly 0
    assert rig.of(UnderrunEnded) == []
    rig.send(400, chunk("s", 400, 2, 200))  # start + B = 500 > 400: the gap ends here
    assert rig.of(UnderrunEnded) == [UnderrunEnded("d", "s", 400, 300)]
    assert len(rig.of(UnderrunBegan)) == 1


def test_the_device_clock_offset_shifts_wall_deadlines() -> None:
    """Events arrive 50 ms after their t_ms: the device's underrun at 1000 fires at wall 1050."""
    rig = Rig()
    rig.send(50, chunk("s", 0, 0, 1_000, eta_ms=5_000))
    assert rig.engine.next_deadline() is not None
    rig.run_until(1_049)
    assert rig.of(UnderrunBegan) == []
    rig.run_until(1_050)
    assert rig.of(UnderrunBegan) == [UnderrunBegan("d", "s", 1_000)]


def test_eta_falls_back_from_stream_to_device_to_default() -> None:
    """Without eta_ms: the stream's gap EWMA, else the device's, else default_chunk_gap_ms."""
    rig = Rig(default_chunk_gap_ms=200)
    rig.send(0, chunk("a", 0, 0, 10_000))
    device = rig.engine.device("d")
    assert device is not None
    assert device.streams["a"].expected == 200  # default
    rig.send(100, chunk("a", 100, 1, 100))
    assert device.streams["a"].expected == 200  # 100 + the stream's EWMA (100)
    rig.send(150, chunk("b", 150, 0, 10_000))
    assert device.streams["b"].expected == 250  # 150 + the device's EWMA (100)


def test_gap_ewma_seeds_with_the_first_gap_then_smooths() -> None:
    """The first gap seeds the stream's EWMA; later gaps move it by α = 0.3."""
    rig = Rig()
    rig.send(0, chunk("a", 0, 0, 10_000))
    rig.send(200, chunk("a", 200, 1, 100))
    rig.send(300, chunk("a", 300, 2, 100))
    device = rig.engine.device("d")
    assert device is not None
    assert device.streams["a"].gap_ewma == 0.3 * 100 + 0.7 * 200
    assert device.streams["a"].expected == 300 + 0.3 * 100 + 0.7 * 200


def test_pieces_of_one_delivery_do_not_drag_the_gap_estimate_down() -> None:
    """A server chunk every 320 ms that the transport splits into two reads 4 ms apart (what
    `read1()` does) leaves the stream's and the device's gap EWMAs at the delivery interval
    (less the split), not near 4 ms: pieces closer than `BURST_GAP_MS` are no gap
    (docs/semantics.md, "Slack, ETA, headroom")."""
    rig = Rig()
    for i in range(8):
        t = 320.0 * i
        rig.send(t, chunk("a", t, 2 * i, 170))
        rig.send(t + 4, chunk("a", t + 4, 2 * i + 1, 150))
    device = rig.engine.device("d")
    assert device is not None
    stream = device.streams["a"]
    assert stream.gap_ewma == 316.0
    assert device.gap_ewma == 316.0
    assert stream.expected == 320.0 * 7 + 4 + 316.0


def test_margin_order_config_then_start_then_engine_then_default() -> None:
    """docs/protocol.md: the device's config margin beats the start event's, which beats the
    engine's."""
    config = EngineConfig(devices={"pinned": DeviceOverride(margin_ms=300)})
    engine = Engine(config)
    out: list[Output] = []
    engine.apply("pinned", [start("a", 0, margin_ms=10)], 0, out)
    engine.apply("free", [start("a", 0, margin_ms=10), start("b", 0)], 0, out)
    engine.apply_engine_info("free", TtsEngineInfo(hardware_class="npu"), 0, out)
    engine.apply("free", [start("c", 0)], 0, out)
    pinned, free = engine.device("pinned"), engine.device("free")
    assert pinned is not None
    assert free is not None
    assert pinned.streams["a"].margin == 300
    assert free.streams["a"].margin == 10
    assert free.streams["b"].margin == 200  # the engine object arrived later: it applies
    assert free.streams["c"].margin == 200
    assert free.margin == 200


def test_reconfigure_changes_margins_and_keeps_streams() -> None:
    """A reloaded config takes effect at once; no stream is lost."""
    rig = Rig()
    rig.send(0, chunk("s", 0, 0, 1_000, eta_ms=100))
    rig.engine.reconfigure(EngineConfig(slack=SlackPolicy(default_margin_ms=950)), 10, rig.out)
    rig.run_until(10)
    device = rig.engine.device("d")
    assert device is not None
    assert "s" in device.streams
    assert device.streams["s"].margin == 950
    assert [(c.t_ms, c.active) for c in rig.of(ThrottleChanged)] == [(10, True)]


def test_idle_streams_expire_after_their_audio_and_the_timeout() -> None:
    """No event for stream_idle_timeout_ms after the audio played out: removed as expired."""
    rig = Rig(stream_idle_timeout_ms=1_000)
    rig.send(0, chunk("s", 0, 0, 500))
    rig.send(0, start("w", 0))
    rig.run_until(5_000)
    ends = {(e.stream, e.t_ms, e.reason) for e in rig.of(StreamEnded)}
    assert ends == {("s", 1_500, "expired"), ("w", 1_000, "expired")}


def test_end_removes_at_once_and_late_chunks_do_not_resurrect() -> None:
    """`end` removes a stream; its late chunks are duplicates; seq 0 starts it anew."""
    rig = Rig()
    rig.send(0, chunk("s", 0, 0, 500))
    rig.send(10, EndEvent(stream="s", t_ms=10, reason="cancelled"))
    assert rig.send(20, chunk("s", 5, 1, 500)) == ["duplicate"]
    assert rig.send(30, chunk("s", 30, 0, 500)) == ["accepted"]
    (ended,) = rig.of(StreamEnded)
    assert (ended.reason, ended.t_ms) == ("cancelled", 10)


def test_sequence_rules_duplicates_gaps_resync_and_after_final() -> None:
    """Duplicates are dropped, gaps applied and counted, audio_total_ms resynchronises (no
    wait for a late chunk: allowed_lateness_ms 0)."""
    rig = Rig(allowed_lateness_ms=0)
    assert rig.send(0, chunk("s", 0, 0, 100)) == ["accepted"]
    assert rig.send(10, chunk("s", 10, 0, 100)) == ["duplicate"]
    assert rig.send(20, chunk("s", 20, 3, 100, audio_total_ms=400)) == ["gap"]
    device = rig.engine.device("d")
    assert device is not None
    assert device.streams["s"].buffered == 400
    assert rig.send(30, chunk("s", 30, 4, 100, final=True)) == ["accepted"]
    assert rig.send(40, chunk("s", 40, 5, 100)) == ["after_final"]


def test_limits_hold_without_touching_existing_state() -> None:
    """Beyond max_devices or max_streams_per_device events are refused; state stays intact."""
    engine = Engine(EngineConfig(limits=Limits(max_devices=1, max_streams_per_device=1)))
    out: list[Output] = []
    assert engine.apply("a", [chunk("s", 0, 0, 100)], 0, out) == ["accepted"]
    assert engine.apply("a", [chunk("t", 0, 0, 100)], 0, out) == ["stream_limit"]
    assert engine.apply("b", [chunk("s", 0, 0, 100)], 0, out) == ["device_limit"]
    device = engine.device("a")
    assert device is not None
    assert list(device.streams) == ["s"]
    assert engine.device("b") is None


def test_timer_heaps_stay_bounded_by_the_streams_they_serve() -> None:
    """Superseded timer entries are compacted away: a device's heap never exceeds about twice
    its live entries, however many chunks its healthy (ever-growing buffer) streams get."""
    rig = Rig()
    for seq in range(2_000):
        t = seq * 100.0
        healthy = (chunk(f"s{i}", t, seq, 150.0, eta_ms=100.0) for i in range(19))
        # A struggling stream keeps a near-term timer on top of the heap, so superseded
        # entries of the healthy streams are never at the top to be dropped there.
        rig.send(t, chunk("slow", t, seq, 90.0, eta_ms=100.0), *healthy)
        rig.out.clear()
    device = rig.engine.device("d")
    assert device is not None
    assert len(device.streams) == 20
    assert len(device.timers) <= 2 * 20 + 64 + 1


def test_release_all_turns_every_throttle_off_and_accounts_the_time() -> None:
    """A clean stop releases each throttled device at its current instant; the time ON is
    counted and the engine's state says released (what the final snapshot records)."""
    rig = Rig(min_on_ms=250)
    rig.send(0, chunk("s", 0, 0, 100, eta_ms=100))  # headroom 0: ON at 0
    rig.engine.release_all(40, rig.out)
    device = rig.engine.device("d")
    assert device is not None
    assert [(c.t_ms, c.active) for c in rig.of(ThrottleChanged)] == [(0, True), (40, False)]
    assert (device.throttle_on, device.stats.throttle_ms) == (False, 40)
