"""Goodput on the players' own clocks: each request's start, longest gap and outcome against
the start and gap SLOs; refusals counted as `shed` with how long they took; the deadline
policy in the virtual loop."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgemon.policy.deadlines import DeadlineSettings
from edgemon.simulate.engine import Chunk, TtsEngine
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.players import OUTCOMES, Player, score
from edgemon.simulate.policies import Policy
from edgemon.simulate.profiles import JETSON
from edgemon.simulate.workload import Request

from properties import examples


def chunk(seq: int, audio_ms: float, *, final: bool = False) -> Chunk:
    return Chunk("s", seq, round(audio_ms / 80), audio_ms, final, 0.0, None)


def test_the_longest_gap_is_the_longest_single_concealed_stretch() -> None:
    """Two gaps, of 300 ms (spanning a chunk that leaves the buffer dry) and 250 ms (up to
    the run's end): the longest is 300, the total 550."""
    player = Player("s", requested_ms=0.0, cushion_ms=0.0)
    player.receive(chunk(0, 100.0), 0.0)  # dry at 100
    player.receive(chunk(1, 100.0), 300.0)  # 200 ms dry; slack 200 − 300 < 0: still dry
    player.receive(chunk(2, 500.0), 400.0)  # 100 ms more; slack 700 − 400 > 0: 300 ms gap
    player.receive(chunk(3, 100.0), 850.0)  # dry at 700: 150 ms; slack 800 − 850 < 0
    player.settle(950.0)  # 100 ms more, up to the end: a 250 ms gap
    assert player.underruns == 2
    assert player.underrun_ms == pytest.approx(550.0)
    assert player.longest_gap_ms == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("events", "outcome"),
    [
        ([("chunk", 0.0, 400.0, True)], "good"),
        ([("chunk", 3500.0, 400.0, True)], "late"),
        ([("chunk", 0.0, 100.0, False), ("chunk", 400.0, 400.0, True)], "gappy"),
        ([("chunk", 0.0, 100.0, False)], "unfinished"),
        ([("refused", 20.0, 0.0, False)], "shed"),
        ([], "unfinished"),
    ],
)
def test_each_request_has_one_outcome(
    events: list[tuple[str, float, float, bool]], outcome: str
) -> None:
    """good: completed within both SLOs; late: start over 3 s; gappy: a gap over 100 ms;
    unfinished: neither missed, not complete at the end; shed: refused."""
    player = Player("s", requested_ms=0.0, cushion_ms=0.0)
    for kind, t, audio, final in events:
        if kind == "refused":
            player.refused(t)
        else:
            player.receive(chunk(player.chunks, audio, final=final), t)
    assert player.outcome(2000.0 if outcome != "late" else 5000.0) == outcome


def test_a_request_still_waiting_past_its_slo_is_late() -> None:
    """No audio yet, 3.5 s after the request: late already (its start cannot meet the SLO)."""
    player = Player("s", requested_ms=0.0)
    assert player.outcome(2000.0) == "unfinished"
    assert player.outcome(3500.0) == "late"
    assert player.outcome(3500.0, start_slo_ms=4000.0) == "unfinished"


def test_score_counts_outcomes_goodput_and_refusal_times() -> None:
    """Goodput = good / offered; a refusal counts as shed with its latency and is left out
    of start silence."""
    good = Player("a", requested_ms=0.0, cushion_ms=0.0)
    good.receive(chunk(0, 400.0, final=True), 100.0)
    shed = Player("b", requested_ms=50.0)
    shed.refused(70.0)
    late = Player("c", requested_ms=0.0, cushion_ms=0.0)
    late.receive(chunk(0, 400.0, final=True), 3200.0)
    got = score([good, shed, late], 10_000.0)
    assert (got.offered, got.good, got.late, got.shed, got.gappy, got.unfinished) == (
        3, 1, 1, 1, 0, 0,
    )  # fmt: skip
    assert got.goodput == pytest.approx(1 / 3)
    assert got.shed_p99_ms == pytest.approx(20.0)
    assert got.start_silence_s == pytest.approx((100.0 + 3200.0) / 1000)


def reference_longest_gap(arrivals: list[tuple[float, float]], end_ms: float) -> float:
    """The longest concealed stretch, from the arrivals alone (playback starts with the
    first chunk, the player's clock runs on while dry): between arrivals `a` and `b`, with
    `A` ms of audio in by `a`, the player is dry over [max(a, A), b); stretches that touch
    at an arrival are one."""
    longest = 0.0
    stretch: tuple[float, float] | None = None  # (start, end) of the current stretch
    total = 0.0
    for i, (at, audio) in enumerate(arrivals):
        total += audio
        until = arrivals[i + 1][0] if i + 1 < len(arrivals) else end_ms
        dry_from = max(at, arrivals[0][0] + total)
        if until > dry_from:
            if stretch is not None and stretch[1] >= dry_from:
                stretch = (stretch[0], until)
            else:
                stretch = (dry_from, until)
            longest = max(longest, stretch[1] - stretch[0])
    return longest


@settings(max_examples=examples(200), deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 600.0), st.floats(40.0, 800.0)), min_size=1, max_size=12
    )
)
def test_longest_gap_matches_a_reference(steps: list[tuple[float, float]]) -> None:
    """The player's longest gap equals the reference's, for chunks arriving at random."""
    player = Player("s", requested_ms=0.0, cushion_ms=0.0)
    arrivals: list[tuple[float, float]] = []
    t = 0.0
    for i, (delay, audio) in enumerate(steps):
        t += delay
        player.receive(chunk(i, audio), t)
        arrivals.append((t, audio))
    end = t + 500.0
    player.settle(end)
    assert player.longest_gap_ms == pytest.approx(reference_longest_gap(arrivals, end), abs=1e-6)


def loop(policy_deadlines: DeadlineSettings | None, rate: float) -> tuple[int, int, float]:
    """One 120 s run of real-time admission, with or without the deadline policy: shed,
    late, and the p99 start silence of the requests not refused."""
    result = run_loop(
        LoopPlan(
            profile=JETSON,
            rate_rps=rate,
            seed=5,
            duration_ms=120_000.0,
            policy=Policy(label="deadlines", realtime=True, deadlines=policy_deadlines),
        )
    )
    s = result.score
    assert s.good + s.late + s.gappy + s.shed + s.unfinished == s.offered
    assert s.start_silence_p99_ms is not None
    return s.shed, s.late, s.start_silence_p99_ms


def test_the_deadline_policy_sheds_in_overload_and_bounds_the_start() -> None:
    """At 1.2 × capacity, real-time admission alone queues listeners for many seconds and
    sheds none; with the deadline policy refused requests are counted `shed` and the start
    silence p99 of the others stays near the SLO."""
    rate = 1.2 * JETSON.capacity_rps()
    shed, late, p99 = loop(None, rate)
    assert shed == 0
    assert p99 > 10_000.0
    shed, late_bounded, p99_bounded = loop(DeadlineSettings(guard_ms=200.0), rate)
    assert shed > 0
    assert late_bounded < late
    assert p99_bounded < 3000.0 * 1.2


def test_a_refusal_reaches_the_player_one_network_delay_after_the_decision() -> None:
    """A refused request's player hears it within a step plus the network delay, and the
    shed count, the players' and the policy's agree."""
    profile = dataclasses.replace(JETSON, network_jitter_ms=0.0)
    result = run_loop(
        LoopPlan(
            profile=profile,
            rate_rps=1.5 * profile.capacity_rps(),
            seed=2,
            duration_ms=60_000.0,
            policy=Policy(label="deadlines", realtime=True, deadlines=DeadlineSettings()),
        )
    )
    refused = [p for p in result.players if p.shed_ms is not None]
    assert refused
    assert len(refused) == result.score.shed
    at_arrival = [p.shed_latency_ms for p in refused if p.shed_latency_ms is not None]
    assert min(at_arrival) >= profile.network_ms
    assert all(p.outcome(60_000.0) == "shed" for p in refused)
    assert set(OUTCOMES) >= {p.outcome(60_000.0) for p in result.players}


def test_the_engine_refuses_at_submit_and_sheds_from_its_queue() -> None:
    """`TtsEngine` with the deadline policy: `submit` is False for a request that cannot
    start in time; one queued whose deadline passes is handed out by `refused()`."""
    from edgemon.policy.deadlines import Deadlines  # noqa: PLC0415
    from edgemon.simulate.engine import DeadlineHook  # noqa: PLC0415

    policy = Deadlines(DeadlineSettings(shed=True), max_num_seqs=1)
    engine = TtsEngine(JETSON, deadlines=DeadlineHook(policy), max_num_seqs=1)
    long_one = Request("long", 0.0, 100, 500)
    assert engine.submit(long_one, 0.0)
    step = engine.step(0.0)
    assert step is not None
    assert step.admitted == ("long",)
    # One seat, taken for 500 frames: a newcomer cannot start within 3 s.
    assert not engine.submit(Request("late", 10.0, 100, 50), 10.0)
    assert policy.shed_at_arrival == 1
    # With shedding at arrival off, a queued request is shed once its deadline passes.
    queued = Deadlines(DeadlineSettings(shed=True), max_num_seqs=1)
    engine = TtsEngine(JETSON, deadlines=DeadlineHook(queued), max_num_seqs=1)
    engine.submit(long_one, 0.0)
    engine.step(0.0)
    engine._waiting.append(Request("q", 0.0, 100, 50))  # queued behind it, as if admitted
    now = 0.0
    while not (gone := engine.refused()):
        step = engine.step(now)
        assert step is not None
        now = step.end_ms
    assert gone == ["q"]
    assert now < 3000.0
