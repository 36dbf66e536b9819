"""Players score underruns on their own clocks (conceal model); the loop on a virtual clock."""

from __future__ import annotations

import dataclasses

import pytest

from edgemon.simulate.engine import Chunk
from edgemon.simulate.hold_gate import HoldGate
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.players import Delivery, Player, percentile, score
from edgemon.simulate.policies import policy
from edgemon.simulate.profiles import JETSON


def chunk(seq: int, audio_ms: float, *, eta_ms: float | None = None, final: bool = False) -> Chunk:
    return Chunk("s", seq, round(audio_ms / 80), audio_ms, final, 0.0, eta_ms)


def test_playback_starts_after_the_announced_wait_plus_the_cushion() -> None:
    """First chunk of 400 ms at t=1000 announcing 2000 ms until the next: the player starts
    at 1000 + (2000 − 400) + 200 = 2800; time to first audio is 1000 − 300."""
    player = Player("s", requested_ms=300.0, cushion_ms=200.0)
    player.receive(chunk(0, 400.0, eta_ms=2000.0), 1000.0)
    assert player.start_ms == 2800.0
    assert player.ttfa_ms == 700.0
    assert player.slack_ms(2800.0) == 400.0
    assert player.slack_ms(3000.0) == 200.0


def test_a_late_chunk_is_one_underrun_with_its_exact_duration() -> None:
    """Start 1000, 400 ms buffered: dry at 1400. A 2 s chunk at 1900 ends a 500 ms underrun;
    the next one at 3000 (dry at 3400) is in time."""
    player = Player("s", requested_ms=0.0, cushion_ms=1000.0)
    player.receive(chunk(0, 400.0), 0.0)
    assert player.start_ms == 1000.0
    player.receive(chunk(1, 2000.0), 1900.0)
    assert (player.underruns, player.underrun_ms, player.in_underrun) == (1, 500.0, False)
    player.receive(chunk(2, 2000.0, final=True), 3000.0)
    assert (player.underruns, player.underrun_ms) == (1, 500.0)
    assert player.played_ms(10_000.0) == 4400.0


def test_an_underrun_lasts_until_slack_is_positive_again() -> None:
    """Conceal: a chunk that leaves the buffer at or below 0 does not end the underrun, and
    the time keeps counting from that chunk on (one underrun, 300 + 100 ms)."""
    player = Player("s", requested_ms=0.0, cushion_ms=0.0)
    player.receive(chunk(0, 100.0), 0.0)  # dry at 100
    player.receive(chunk(1, 200.0), 400.0)  # slack 300 − 400 = −100: still dry
    assert player.in_underrun
    player.receive(chunk(2, 400.0), 500.0)  # slack 700 − 500 = 200
    assert (player.underruns, player.underrun_ms, player.in_underrun) == (1, 400.0, False)


def test_settling_counts_a_stream_that_is_dry_at_the_end() -> None:
    """A live stream dry when the run ends counts its underrun up to the end; a final one
    drains without underrun."""
    live = Player("a", requested_ms=0.0, cushion_ms=0.0)
    live.receive(chunk(0, 400.0), 0.0)
    done = Player("b", requested_ms=0.0, cushion_ms=0.0)
    done.receive(chunk(0, 400.0, final=True), 0.0)
    result = score([live, done], 1000.0)
    assert (result.underruns, result.underrun_s) == (1, 0.6)
    assert (result.streams, result.completed) == (2, 1)
    assert result.stream_minutes == pytest.approx((1000.0 + 400.0) / 60_000.0)
    assert result.underruns_per_stream_minute == pytest.approx(1 / result.stream_minutes)


def test_percentile_interpolates() -> None:
    """The median of 1..4 is 2.5; p99 of one value is that value; none gives None."""
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_delivery_never_reorders_a_stream() -> None:
    """Whatever the jitter, a stream's chunks arrive in order, each after it was made."""
    delivery = Delivery(15.0, 200.0, seed=3)
    last = 0.0
    for seq in range(200):
        made = Chunk("s", seq, 1, 80.0, False, seq * 10.0, None)
        arrival = delivery.arrival_ms(made)
        assert arrival >= last
        assert arrival >= made.t_ms + 15.0
        last = arrival


def test_hold_gate_releases_until_a_step_admits() -> None:
    """Throttled: True until the hold is max_hold old, then False until a step admits
    (`admitted()`), then a new hold: the ThrottleGate's rule."""
    gate = HoldGate(max_hold_ms=100.0, lasting=True)
    assert not gate.should_throttle(0.0)
    gate.set(True, 0.0)
    assert [gate.should_throttle(t) for t in (0.0, 50.0, 99.0, 100.0, 101.0)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    gate.admitted()
    assert gate.should_throttle(102.0)
    gate.set(False, 150.0)
    assert not gate.should_throttle(160.0)
    assert gate.holds == 2
    assert gate.held_ms == 148.0  # 0–100, then 102–150


def test_closing_the_loop_cuts_underruns_near_capacity() -> None:
    """The whole loop on a virtual clock, same seed, at the Jetson profile's estimated
    capacity: with the gate obeyed the players hear fewer underruns and less underrun time,
    and the engine held admissions; with it open, nothing was held."""
    rate = JETSON.capacity_rps()
    plan = LoopPlan(profile=JETSON, rate_rps=rate, seed=1, duration_ms=60_000.0)
    open_ = run_loop(plan)
    closed = run_loop(dataclasses.replace(plan, policy=policy("gate:80:2000", JETSON)))
    assert open_.score.requests == closed.score.requests > 30
    assert open_.holds == 0
    assert closed.holds > 0
    assert closed.score.underrun_s < open_.score.underrun_s / 2
    assert closed.score.underruns < open_.score.underruns
