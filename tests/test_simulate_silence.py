"""Silence as listeners hear it, on the players' own clocks: before the first word (start
silence), in mid-sentence gaps (gap silence), and the two added together."""

from __future__ import annotations

import json

import pytest

from edgemon.simulate.engine import Chunk
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.players import Player, score
from edgemon.simulate.profiles import JETSON


def chunk(seq: int, audio_ms: float, *, eta_ms: float | None = None, final: bool = False) -> Chunk:
    """A chunk of stream `s` (frames of 80 ms)."""
    return Chunk("s", seq, round(audio_ms / 80), audio_ms, final, 0.0, eta_ms)


def test_start_silence_runs_from_the_request_to_the_playback_start() -> None:
    """Requested at 300, first chunk (400 ms, next in 2000) at 1000: playback starts at
    1000 + 1600 + 200 = 2800, so 2500 ms of silence before the first word, whenever the run
    ends after that."""
    player = Player("s", requested_ms=300.0, cushion_ms=200.0)
    player.receive(chunk(0, 400.0, eta_ms=2000.0), 1000.0)
    assert player.start_silence_ms(10_000.0) == 2500.0
    assert player.start_silence_ms(2800.0) == 2500.0


def test_a_request_still_waiting_at_the_end_counts_its_silence_up_to_the_end() -> None:
    """No chunk yet, or a playback start after the end: silence up to the end only."""
    waiting = Player("w", requested_ms=1000.0)
    assert waiting.start_silence_ms(4000.0) == 3000.0
    prebuffering = Player("p", requested_ms=1000.0, cushion_ms=200.0)
    prebuffering.receive(chunk(0, 400.0, eta_ms=2000.0), 1500.0)  # plays from 3300
    assert prebuffering.start_silence_ms(2000.0) == 1000.0


def test_a_run_adds_start_gap_and_total_silence() -> None:
    """Three requests ending at 10 s: one served with a 500 ms gap, one still waiting, one
    still prebuffering. Start silence, its percentiles over all three, gap silence and gaps,
    and their total, all by hand."""
    served = Player("a", requested_ms=0.0, cushion_ms=1000.0)
    served.receive(chunk(0, 400.0), 0.0)  # plays 1000–1400, dry until 1900
    served.receive(chunk(1, 2000.0, final=True), 1900.0)
    waiting = Player("b", requested_ms=6000.0)
    prebuffering = Player("c", requested_ms=9000.0, cushion_ms=200.0)
    prebuffering.receive(chunk(0, 400.0, eta_ms=5000.0), 9500.0)  # would play from 14,300
    result = score([served, waiting, prebuffering], 10_000.0)
    starts = [1000.0, 4000.0, 1000.0]
    assert result.start_silence_s == pytest.approx(sum(starts) / 1000)
    assert result.start_silence_p50_ms == pytest.approx(1000.0)
    assert result.start_silence_p99_ms == pytest.approx(1000.0 + 0.98 * 3000.0)
    assert result.gaps == 1
    assert result.gap_silence_s == pytest.approx(0.5)
    assert result.total_silence_s == pytest.approx(6.0 + 0.5)
    assert result.ttfa_p50_ms == pytest.approx(250.0)  # 0 and 500 ms
    assert result.completed == 1


def test_the_virtual_loop_sends_start_at_the_request() -> None:
    """edgemon sees each stream's `start` at the request, so its time to first audio and its
    start silence are the players' own (not ≈ 0 as when `start` came with the first chunk)."""
    rate = 0.5 * JETSON.capacity_rps()
    plan = LoopPlan(profile=JETSON, rate_rps=rate, seed=3, duration_ms=30_000.0)
    result = run_loop(plan)
    assert result.monitor is not None
    device = result.monitor.engine.device("box")
    assert device is not None
    stats = device.stats
    # What reached edgemon by the end: every first chunk that arrived a report latency early.
    reported = plan.duration_ms - plan.report_latency_ms
    players = [p for p in result.players if p.first_ms is not None and p.first_ms <= reported]
    assert stats.start_silence.count == len(players) > 5
    # Every stream's start silence as edgemon measured it equals the players' (same clock).
    assert stats.start_silence.total == pytest.approx(
        sum((p.start_ms or 0.0) - p.requested_ms for p in players)
    )
    assert stats.time_to_first_audio.total == pytest.approx(sum(p.ttfa_ms or 0.0 for p in players))
    assert json.dumps(result.score.total_silence_s)
