"""Scenarios (slowdown, burst, network), policies, and the lasting release in the virtual
loop: each does what its flag says, and nothing when it is off."""

from __future__ import annotations

import dataclasses

import pytest

from edgemon.policy.deadlines import DeadlineSettings
from edgemon.simulate.engine import TtsEngine
from edgemon.simulate.hold_gate import HoldGate
from edgemon.simulate.loop import LoopPlan, run_loop
from edgemon.simulate.policies import policy
from edgemon.simulate.profiles import JETSON
from edgemon.simulate.scenarios import RequestSource, scenario
from edgemon.simulate.workload import Arrivals, Request


def test_a_slowdown_stretches_steps_in_the_last_window_of_each_period() -> None:
    """1.5:20:60: steady for 40 s, ×1.5 from 40 to 60 s, steady again from 60 s."""
    scene = scenario("slowdown", slowdown="1.5:20:60")
    assert scene.describe() == "slowdown 1.5:20:60"
    assert [scene.step_factor(t * 1000.0) for t in (0, 39.999, 40, 59.999, 60, 100)] == [
        1.0, 1.0, 1.5, 1.5, 1.0, 1.5,
    ]  # fmt: skip
    engine = TtsEngine(JETSON, step_factor=scene.step_factor)
    engine.submit(Request("r", 0.0, prompt_tokens=100, frames=50))
    steady = engine.step(0.0)
    slow = engine.step(45_000.0)
    assert steady is not None
    assert slow is not None
    assert steady.ms == JETSON.step.step_ms(100, 0)
    assert slow.ms == pytest.approx(1.5 * JETSON.step.step_ms(0, 1))


def test_bursts_add_k_requests_every_t_seconds_to_the_same_poisson_requests() -> None:
    """5:10 over 35 s: the Poisson requests of the seed, plus 5 at 10, 20 and 30 s, in time
    order; without a burst the source hands out exactly what `Arrivals` does."""
    scene = scenario("burst", burst="5:10")
    with_bursts = RequestSource(1.0, JETSON.workload, seed=3, burst=scene.burst).due(35_000.0)
    poisson = Arrivals(1.0, JETSON.workload, seed=3).due(35_000.0)
    plain = RequestSource(1.0, JETSON.workload, seed=3).due(35_000.0)
    assert plain == poisson
    extra = [r for r in with_bursts if r.id.startswith("b")]
    assert [r.arrival_ms for r in extra] == [10_000.0] * 5 + [20_000.0] * 5 + [30_000.0] * 5
    assert [r for r in with_bursts if not r.id.startswith("b")] == poisson
    times = [r.arrival_ms for r in with_bursts]
    assert times == sorted(times)


def test_a_network_episode_delays_deliveries_inside_its_windows_only() -> None:
    """300:5:30: chunks sent between 25 and 30 s (mod 30) reach players 300 ms later."""
    scene = scenario("network", network="300:5:30")
    assert [scene.network_ms(t * 1000.0) for t in (0, 24.9, 25, 29.9, 30, 55)] == [
        0.0, 0.0, 300.0, 300.0, 0.0, 300.0,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("open", {"gated": False, "max_num_seqs": None, "realtime": False}),
        ("cap:11", {"max_num_seqs": 11}),
        ("gate:80:2000", {"gated": True, "margin_ms": 80.0, "max_hold_ms": 2000.0}),
        ("lasting:40:500", {"gated": True, "lasting": True, "max_hold_ms": 500.0}),
        ("realtime:1.2+gate:80:1000", {"realtime": True, "realtime_frames": 1.2}),
        (
            "edgemon",
            {
                "realtime": True,
                "realtime_frames": 1.0,
                "gated": False,
                "budget": None,
                "deadlines": DeadlineSettings(
                    order="fcfs", shed=True, guard_ms=400.0, estimate_headroom=True
                ),
            },
        ),
        (
            "realtime+lasting:80:1100+deadline:edf:queue:250:decode",
            {
                "gated": True,
                "lasting": True,
                "deadlines": DeadlineSettings(
                    order="edf", shed=False, guard_ms=250.0, amortize=False
                ),
            },
        ),
    ],
)
def test_policies_parse_into_what_the_engine_applies(text: str, fields: dict[str, object]) -> None:
    """Each policy text sets exactly the engine's knobs it names; `edgemon` is real-time
    admission with the deadline policy (arrival order, shedding, 400 ms kept in hand, the
    players' headroom estimated)."""
    parsed = policy(text, JETSON)
    assert parsed.label == text
    for name, value in fields.items():
        assert getattr(parsed, name) == value


def test_lasting_release_lasts_until_a_step_admits() -> None:
    """After max_hold the one-step release ends at the next question; the lasting one stays
    released until `admitted()`, then a new hold begins."""
    one, lasting = HoldGate(100.0), HoldGate(100.0, lasting=True)
    for gate in (one, lasting):
        gate.set(True, 0.0)
        assert gate.should_throttle(0.0)
        assert not gate.should_throttle(100.0)
    assert one.should_throttle(101.0)
    assert not lasting.should_throttle(101.0)
    assert not lasting.should_throttle(500.0)
    lasting.admitted()
    assert lasting.should_throttle(501.0)
    assert lasting.holds == 2


def test_a_static_cap_and_real_time_admission_bound_the_running_set() -> None:
    """In the virtual loop near capacity: `cap:9` never runs more than 9; real-time admission
    on the jetson profile (N* = 12) never more than 12 once it has measured its steps; open
    runs more than 12 at times."""
    rate = 0.95 * JETSON.capacity_rps()
    base = LoopPlan(profile=JETSON, rate_rps=rate, seed=2, duration_ms=60_000.0)
    peaks = {}
    for name, plan in (
        ("open", base),
        ("cap", dataclasses.replace(base, policy=policy("cap:9", JETSON))),
        ("realtime", dataclasses.replace(base, policy=policy("realtime", JETSON))),
    ):
        result = run_loop(plan)
        peaks[name] = result.peak_running
    assert peaks["cap"] == 9
    assert peaks["open"] > 12
    assert peaks["realtime"] <= 12


def test_contention_slows_steps_by_the_measured_factor_inside_its_windows() -> None:
    """contention 20:60:0.5 on a profile that measured ×1.6 at half the core and ×3 at 0.8:
    steps ×1.6 from 40 to 60 s of every minute, steady otherwise; shares in between are
    interpolated, extended along the last segment beyond them, and a profile with nothing
    measured takes a fair share's 1 / (1 − share)."""
    measured = dataclasses.replace(JETSON, contention=((0.5, 1.6), (0.8, 3.0)))
    factor = measured.contention_factor(0.5)
    scene = scenario("contention", contention="20:60:0.5", factor=factor)
    assert scene.describe() == "contention 1.6:20:60"
    assert [scene.step_factor(t * 1000.0) for t in (0, 39.999, 40, 59.999, 60, 100)] == [
        1.0, 1.0, 1.6, 1.6, 1.0, 1.6,
    ]  # fmt: skip
    assert measured.contention_factor(0.25) == pytest.approx(1.3)
    assert measured.contention_factor(0.65) == pytest.approx(2.3)
    assert measured.contention_factor(0.9) == pytest.approx(3.0 + 0.1 * 1.4 / 0.3)
    assert JETSON.contention_factor(0.5) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("text", "factor", "words"),
    [
        ("20:60", 1.5, "--contention W:P:SHARE"),
        ("20:60:1", 1.5, "below 1"),
        ("70:60:0.5", 1.5, "--contention"),
        ("20:60:0.5", None, "measured step slowdown"),
        ("20:60:0.5", 0.5, "measured step slowdown"),
    ],
)
def test_contention_flags_say_what_is_wrong(text: str, factor: float | None, words: str) -> None:
    """A share of 1 or more, a window beyond its period, a missing number or no measured
    factor (≥ 1) is refused, naming it."""
    with pytest.raises(ValueError, match=words):
        scenario("contention", contention=text, factor=factor)
