"""The test oracle itself, checked on examples worked by hand from docs/semantics.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings

from edgemon.engine.config import ClockMode, EngineConfig, PlayerModel, SlackPolicy

from properties import examples
from reference import Reference, Underrun, UnsupportedTraceError
from strategies import Scenario, scenarios

if TYPE_CHECKING:
    from collections.abc import Sequence

    from reference import TraceEvent

D = "d0"
S = "s0"


def chunk(t: int, seq: int, audio: int, stream: str = S, **extra: Any) -> dict[str, Any]:
    """A chunk event object."""
    return {"type": "chunk", "stream": stream, "t_ms": t, "seq": seq, "audio_ms": audio, **extra}


def trace(*events: dict[str, Any], lag: int = 0) -> list[TraceEvent]:
    """Events received ``lag`` ms after they happened, all on device ``D``."""
    return [(e["t_ms"] + lag, D, e) for e in events]


def ref(
    events: Sequence[TraceEvent],
    *,
    player: PlayerModel = "conceal",
    margin: float = 80,
    hysteresis: float = 20,
    min_on: float = 250,
    timeout: float = 30_000,
    clock: ClockMode = "trust",
) -> Reference:
    """A reference over ``events`` with the given policy."""
    policy = SlackPolicy(
        player=player,
        default_margin_ms=margin,
        hysteresis_ms=hysteresis,
        min_on_ms=min_on,
        stream_idle_timeout_ms=timeout,
        clock=clock,
    )
    return Reference(events, EngineConfig(slack=policy))


def three_chunks() -> list[TraceEvent]:
    """The worked example: chunks (0, 200), (150, 200), (500, 200), player starting at 0."""
    return trace(chunk(0, 0, 200), chunk(150, 1, 200), chunk(500, 2, 200))


def test_slack_is_known_audio_minus_played_time() -> None:
    """slack(t) = sum of audio received by t - (t - start), negative once the player underran."""
    r = ref(three_chunks())
    assert r.slack(D, S, 100) == 100
    assert r.slack(D, S, 150) == 250
    assert r.slack(D, S, 400) == 0
    assert r.slack(D, S, 499) == -99
    assert r.slack(D, S, 500) == 100


def test_underrun_begins_when_audio_played_out_and_ends_at_a_chunk() -> None:
    """The underrun begins at start + B (400) and ends at the chunk that refills (500)."""
    r = ref(three_chunks(), timeout=1000)
    assert r.underruns() == [Underrun(D, S, 400, 500), Underrun(D, S, 600, None)]


def test_stream_end_summary_of_expired_stream() -> None:
    """Idle expiry at start + B + timeout; min slack is the lowest slack before a chunk's audio."""
    end = ref(three_chunks(), timeout=1000).stream_ends()[D, S]
    assert end == {
        "t_ms": 1600,
        "reason": "expired",
        "chunks": 3,
        "audio_ms": 600,
        "underruns": 2,
        "underrun_ms": None,  # the second underrun is still open when the stream expires
        "open_at_removal": True,
        "min_slack_ms": -100,
        "start_silence_ms": None,  # begun by its first chunk
        "longest_gap_ms": 1000,  # the open one, from 600 until the removal at 1600
        "outcome": "unfinished",
    }


def test_chunk_at_the_underrun_instant_prevents_it() -> None:
    """Messages apply before timers: a chunk at exactly start + B means no underrun then."""
    r = ref(trace(chunk(0, 0, 200), chunk(200, 1, 100)), timeout=1000)
    assert r.slack(D, S, 200) == 100
    assert [u.begin for u in r.underruns()] == [300]


def test_chunk_leaving_zero_buffer_does_not_end_underrun() -> None:
    """conceal: a chunk after which start + B == t_chunk leaves the underrun going."""
    r = ref(trace(chunk(0, 0, 100), chunk(150, 1, 50), chunk(160, 2, 100)), timeout=1000)
    assert r.underruns() == [Underrun(D, S, 100, 160), Underrun(D, S, 250, None)]


def test_underrun_can_begin_at_an_event() -> None:
    """A first chunk that arrives after its whole audio should have played begins an underrun."""
    start = {"type": "start", "stream": S, "t_ms": 0, "play_start_ms": 0}
    r = ref(trace(start, chunk(500, 0, 200)), timeout=1000)
    assert r.slack(D, S, 500) == -300
    assert [u.begin for u in r.underruns()] == [500]


def test_rebuffer_moves_start_by_the_stall() -> None:
    """rebuffer: slack stops at 0, and the next chunk restarts the player at its arrival."""
    events = trace(chunk(0, 0, 200), chunk(300, 1, 200))
    r = ref(events, player="rebuffer", timeout=1000)
    assert r.slack(D, S, 250) == 0
    assert r.slack(D, S, 300) == 200
    assert r.slack(D, S, 350) == 150
    assert r.underruns() == [Underrun(D, S, 200, 300), Underrun(D, S, 500, None)]
    assert ref(events, timeout=1000).slack(D, S, 300) == 100  # conceal for comparison


def test_eta_headroom_and_risk_at_the_crossing_instant() -> None:
    """eta counts down to t + eta_ms; at risk from the instant headroom reaches margin, falling."""
    r = ref(trace(chunk(0, 0, 300, eta_ms=100)))
    assert r.eta(D, S, 40) == 60
    assert r.headroom(D, S, 40) == 200
    assert r.eta(D, S, 150) == 0
    assert r.headroom(D, S, 150) == 150
    assert not r.at_risk(D, S, 219)
    assert r.headroom(D, S, 220) == 80
    assert r.at_risk(D, S, 220)
    assert r.at_risk(D, S, 221)


def test_a_player_that_has_not_started_is_safe_while_its_buffer_lasts() -> None:
    """Before the player starts it consumes nothing: 100 ms buffered, player at 1000, next
    chunk at 200 — the buffer lasts until 1100, so headroom is 900 until the chunk is due,
    then falls, reaching the 80 ms margin at 1020 (docs/semantics.md)."""
    start = {"type": "start", "stream": S, "t_ms": 0, "play_start_ms": 1000}
    r = ref(trace(start, chunk(0, 0, 100, eta_ms=200)))
    assert r.slack(D, S, 100) == 100
    assert r.headroom(D, S, 100) == 900
    assert not r.at_risk(D, S, 100)
    assert not r.at_risk(D, S, 1019)
    assert r.headroom(D, S, 1020) == 80
    assert r.at_risk(D, S, 1020)  # at risk just after the crossing instant
    assert r.headroom(D, S, 1021) == 79


def test_eta_zero_is_at_risk_as_soon_as_slack_is_under_margin() -> None:
    """eta_ms 0: headroom equals slack."""
    r = ref(trace(chunk(0, 0, 100, eta_ms=0)))
    assert r.eta(D, S, 0) == 0
    assert r.headroom(D, S, 10) == 90
    assert r.at_risk(D, S, 20)


def test_gap_ewma_falls_back_from_stream_to_device_to_default() -> None:
    """Without eta_ms: stream gap EWMA, else the device's over all streams, else the default."""
    other = "s1"
    r = ref(
        trace(chunk(0, 0, 900), chunk(100, 1, 900), chunk(300, 2, 900), chunk(310, 0, 900, other))
    )
    assert ref(trace(chunk(0, 0, 900))).eta(D, S, 0) == 200  # the default gap
    assert r.snapshot(D, 100).streams[S].expected_next == 200  # one gap: it seeds the EWMA
    assert r.eta(D, S, 300) == pytest.approx(130)  # 0.3 * 200 + 0.7 * 100
    assert r.eta(D, other, 310) == pytest.approx(130)  # the device's EWMA


def test_gap_is_floored_at_zero() -> None:
    """A chunk carrying a smaller t_ms than the previous one counts a gap of 0, which is
    below `BURST_GAP_MS`: a piece of the same delivery, so the EWMA does not take it."""
    events = [(100, D, chunk(100, 0, 900)), (150, D, chunk(50, 1, 900))]
    r = ref(events)
    assert r.eta(D, S, 150) == 100  # expected at 50 + the default 200


def test_duplicates_are_dropped_and_gaps_resync() -> None:
    """A seq already seen is rejected; a gap with audio_total_ms resets the buffered audio."""
    dup = chunk(0, 0, 200)
    events = [
        *trace(chunk(0, 0, 200)),
        (50, D, dup),
        *trace(chunk(100, 2, 100, audio_total_ms=500)),
    ]
    r = ref(events)
    assert r.rejected() == [(50, D, "duplicate")]
    assert r.slack(D, S, 100) == 400
    assert ref(trace(chunk(0, 0, 200), chunk(100, 2, 100))).slack(D, S, 100) == 200


def test_final_chunk_drains_and_completes_when_played_out() -> None:
    """After a final chunk the stream is not live (not sampled) and completes at start + B."""
    r = ref(trace(chunk(0, 0, 100), chunk(50, 1, 100, final=True)), timeout=1000)
    assert set(r.samples(50)) == {(0, D, S)}
    assert r.underruns() == []
    end = r.stream_ends()[D, S]
    assert (end["t_ms"], end["reason"], end["chunks"], end["audio_ms"]) == (
        200,
        "completed",
        2,
        200,
    )


def test_late_final_chunk_completes_at_once() -> None:
    """A final chunk arriving after its audio should have played completes at its arrival."""
    r = ref(trace(chunk(0, 0, 100), chunk(300, 1, 50, final=True)), timeout=1000)
    end = r.stream_ends()[D, S]
    assert (end["t_ms"], end["reason"], end["underruns"], end["underrun_ms"]) == (
        300,
        "completed",
        1,
        None,
    )


def test_idle_expiry_of_live_and_waiting_streams() -> None:
    """Live: expired timeout after its audio played out; waiting: timeout after its last event."""
    waiting = {"type": "start", "stream": "w", "t_ms": 0}
    r = ref(trace(waiting, chunk(0, 0, 100)), timeout=1000)
    ends = r.stream_ends()
    assert (ends[D, S]["t_ms"], ends[D, S]["reason"]) == (1100, "expired")
    assert (ends[D, "w"]["t_ms"], ends[D, "w"]["reason"], ends[D, "w"]["chunks"]) == (
        1000,
        "expired",
        0,
    )
    samples = r.samples(100)
    assert (1000, D, S) in samples
    assert (1100, D, S) not in samples
    assert all(sid == S for _, _, sid in samples)  # a waiting stream is never sampled


def test_end_event_removes_at_once_and_redelivery_is_duplicate() -> None:
    """end removes the stream at its arrival; a later chunk with seq > 0 is a duplicate."""
    end = {"type": "end", "stream": S, "t_ms": 100, "reason": "cancelled"}
    r = ref(trace(chunk(0, 0, 300), chunk(50, 1, 300), end, chunk(50, 1, 300) | {"t_ms": 200}))
    assert (100, D, S) not in r.samples(100)
    assert (r.stream_ends()[D, S]["t_ms"], r.stream_ends()[D, S]["reason"]) == (100, "cancelled")
    assert r.rejected() == [(200, D, "duplicate")]


def test_stream_id_reuse_is_outside_the_model() -> None:
    """The reference refuses what it does not model rather than guess."""
    end = {"type": "end", "stream": S, "t_ms": 100, "reason": "cancelled"}
    with pytest.raises(UnsupportedTraceError):
        ref(trace(chunk(0, 0, 300), end, chunk(200, 0, 300))).rejected()


def test_estimate_clock_and_knowledge() -> None:
    """Device time is recv - first lag; a delayed chunk counts only from its receipt."""
    events = [(1000, D, chunk(0, 0, 200)), (1150, D, chunk(100, 1, 200))]
    r = ref(events, clock="estimate")
    assert r.slack(D, S, 120) == 80
    assert r.slack(D, S, 150) == 250
    with pytest.raises(UnsupportedTraceError):
        Reference([(1050, D, chunk(0, 0, 200)), (1100, D, chunk(100, 1, 200))], r.config)


def throttle_trace() -> list[TraceEvent]:
    """Headroom 200 until 100, falls to margin 80 at 220; a chunk at 250 lifts it to 90."""
    return trace(chunk(0, 0, 300, eta_ms=100), chunk(250, 1, 90, eta_ms=50))


def test_throttle_without_hysteresis_follows_risk() -> None:
    """hysteresis 0, min-on 0: ON while at risk (from 220, again from 310), OFF at once."""
    r = ref(throttle_trace(), hysteresis=0, min_on=0, timeout=1000)
    changes = r.throttle(D)
    assert [(c.t, c.active) for c in changes] == [
        (220, True),
        (250, False),
        (310, True),
        (1390, False),
    ]
    assert changes[0].streams == {S}
    assert changes[0].min_headroom == 80
    assert changes[1].min_headroom == 90
    assert changes[3].min_headroom is None  # the stream has expired


def test_throttle_min_on_delays_release() -> None:
    """min-on 50: the release at 250 waits until 270."""
    r = ref(throttle_trace(), hysteresis=0, min_on=50, timeout=1000)
    assert [(c.t, c.active) for c in r.throttle(D)] == [
        (220, True),
        (270, False),
        (310, True),
        (1390, False),
    ]


def test_throttle_hysteresis_holds_until_headroom_clears_it() -> None:
    """hysteresis 20: headroom 90 < 80 + 20 never releases; OFF only when the stream is gone."""
    r = ref(throttle_trace(), hysteresis=20, min_on=50, timeout=1000)
    assert [(c.t, c.active) for c in r.throttle(D)] == [(220, True), (1390, False)]


def _spec_slack(sc: Scenario, device: str, stream: str, s: float) -> float | None:
    """docs/semantics.md straight from the trace, for streams without gaps or duplicates."""
    chunks = [e for _, d, e in sc.events if d == device and e["stream"] == stream]
    chunks = [e for e in chunks if e["type"] == "chunk"]
    seqs = [e["seq"] for e in chunks]
    if seqs != list(range(len(seqs))):
        return None
    starts = [
        e["play_start_ms"]
        for _, d, e in sc.events
        if (d, e["stream"]) == (device, stream) and "play_start_ms" in e
    ]
    start = float(starts[0] if starts else chunks[0]["t_ms"])
    played = max(0.0, s - start)
    return float(sum(e["audio_ms"] for e in chunks if e["t_ms"] <= s)) - played


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(in_order=True, player="conceal"))
def test_reference_slack_matches_the_spec_formula(sc: Scenario) -> None:
    """In-order conceal traces without gaps: the fold gives semantics.md's sum at every sample."""
    r = Reference(sc.events, sc.config)
    for (s, device, stream), line in r.samples(sc.sample_ms).items():
        expected = _spec_slack(sc, device, stream, s)
        if expected is not None:
            assert line["slack_ms"] == expected


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(in_order=True, eta_always=True))
def test_right_limit_risk_agrees_with_half_integer_evaluation(sc: Scenario) -> None:
    """With integer inputs, 'at risk just after k' equals 'headroom(k + 0.5) < margin'."""
    r = Reference(sc.events, sc.config)
    for device in r.devices:
        for k in range(0, int(r.horizon(device)) + 1, 7):
            for stream in r.live_streams(device, k):
                just_after = r.headroom_just_after(device, stream, k) < r.margin(device, stream, k)
                assert r.at_risk(device, stream, k) == just_after


@pytest.mark.slow  # a property: many generated examples
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(in_order=True, eta_always=True) | scenarios())
def test_generated_traces_stay_inside_the_model(sc: Scenario) -> None:
    """Every generated trace is one the reference models: all its answers compute."""
    r = Reference(sc.events, sc.config)
    r.samples(sc.sample_ms)
    r.stream_ends()
    r.rejected()
    if sc.in_order and all("eta_ms" in e for _, _, e in sc.events if e["type"] == "chunk"):
        for device in r.devices:
            changes = r.throttle(device)
            assert [c.active for c in changes] == [i % 2 == 0 for i in range(len(changes))]
