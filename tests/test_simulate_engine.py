"""The simulated TTS engine: step times from the profile's model, chunking, the gate."""

from __future__ import annotations

import dataclasses

import pytest

from edgemon.policy.announced import ALPHA
from edgemon.simulate.engine import TtsEngine
from edgemon.simulate.profiles import JETSON, PROFILES, StepModel
from edgemon.simulate.workload import Arrivals, Request

#: base 30 ms, 0.2 ms per prefill token, 4 ms per decode; budget 512 tokens; chunks 5, then 25.
PROFILE = JETSON


def test_step_model_is_linear_in_prefill_tokens_and_decodes() -> None:
    """step_ms = base + per token × prefill tokens + per seq × decodes, by hand."""
    model = StepModel(base_ms=30.0, per_prefill_token_ms=0.2, per_decode_seq_ms=4.0)
    assert model.step_ms(0, 0) == 30.0
    assert model.step_ms(100, 0) == pytest.approx(50.0)
    assert model.step_ms(512, 3) == pytest.approx(30.0 + 102.4 + 12.0)


def test_step_model_refuses_negative_costs() -> None:
    """A negative or non-finite constant is a ValueError naming it."""
    with pytest.raises(ValueError, match="per_decode_seq_ms"):
        StepModel(base_ms=1.0, per_prefill_token_ms=0.1, per_decode_seq_ms=-1.0)


def test_a_request_prefills_then_decodes_one_frame_per_step() -> None:
    """A 100-token prompt: the first step prefills it (30 + 100 × 0.2 = 50 ms) and emits the
    first frame; each later step is one decode (30 + 4 = 34 ms). The fifth frame completes
    the 400 ms first chunk; the seventh, the final 2-frame chunk."""
    engine = TtsEngine(PROFILE)
    engine.submit(Request("r0", 0.0, prompt_tokens=100, frames=7))
    t = 0.0
    steps = []
    while (step := engine.step(t)) is not None:
        steps.append(step)
        t = step.end_ms
    assert [s.ms for s in steps] == pytest.approx([50.0] + [34.0] * 6)
    assert [s.prefill_tokens for s in steps] == [100, 0, 0, 0, 0, 0, 0]
    assert [s.decode_seqs for s in steps] == [0, 1, 1, 1, 1, 1, 1]
    assert steps[0].admitted == ("r0",)
    chunks = [c for s in steps for c in s.chunks]
    assert [(c.seq, c.frames, c.audio_ms, c.final) for c in chunks] == [
        (0, 5, 400.0, False),
        (1, 2, 160.0, True),
    ]
    assert chunks[0].t_ms == pytest.approx(50.0 + 4 * 34.0)
    assert chunks[1].t_ms == pytest.approx(50.0 + 6 * 34.0)
    assert chunks[1].eta_ms is None
    assert steps[-1].finished == ("r0",)
    assert engine.running == 0


def test_the_eta_hint_is_frames_to_the_next_chunk_times_the_step_estimate() -> None:
    """The first chunk's hint: min(25, frames left) × the engine's EWMA of the steps that
    decoded. A prefill on an idle box decodes nothing, so it is no step of the estimate (a
    player, timing the box by its tokens, sees none: counting it made the simulated players
    prebuffer 2.1–2.3 s where the real engine's took 0.7–1.5 s)."""
    engine = TtsEngine(PROFILE)
    estimate = PROFILE.step.step_ms(0, 1)
    engine.submit(Request("r0", 0.0, prompt_tokens=100, frames=40))
    t = 0.0
    for ms, decodes in [(50.0, 0), (34.0, 1), (34.0, 1), (34.0, 1), (34.0, 1)]:
        step = engine.step(t)
        assert step is not None
        assert step.ms == pytest.approx(ms)
        assert step.decode_seqs == decodes
        if decodes:
            estimate += ALPHA * (ms - estimate)
        t = step.end_ms
    assert step is not None  # mypy: the loop above ran
    [chunk] = step.chunks
    assert chunk.eta_ms == pytest.approx(25 * estimate)


def test_a_prefill_beside_decodes_is_a_step_of_the_estimate() -> None:
    """A prompt prefilled while another stream decodes stalls that stream's frames: the step
    is in the estimate, prefill and all."""
    engine = TtsEngine(PROFILE)
    engine.submit(Request("a", 0.0, prompt_tokens=100, frames=40))
    first = engine.step(0.0)
    assert first is not None
    before = engine.step_estimate_ms
    engine.submit(Request("b", first.end_ms, prompt_tokens=400, frames=40))
    step = engine.step(first.end_ms)
    assert step is not None
    assert (step.prefill_tokens, step.decode_seqs) == (400, 1)
    assert engine.step_estimate_ms == pytest.approx(before + ALPHA * (step.ms - before))


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    """600 tokens with a 512-token budget: 30 + 512 × 0.2 = 132.4 ms without a frame, then
    30 + 88 × 0.2 = 47.6 ms with the first frame; a decode running beside it costs 1 token
    of the budget and 4 ms."""
    engine = TtsEngine(PROFILE)
    engine.submit(Request("long", 0.0, prompt_tokens=600, frames=10))
    first = engine.step(0.0)
    assert first is not None
    assert first.prefill_tokens == 512
    assert first.ms == pytest.approx(132.4)
    assert first.chunks == ()
    second = engine.step(first.end_ms)
    assert second is not None
    assert second.prefill_tokens == 88
    assert second.ms == pytest.approx(47.6)

    engine = TtsEngine(PROFILE)
    engine.submit(Request("short", 0.0, prompt_tokens=10, frames=10))
    engine.step(0.0)
    engine.submit(Request("long", 0.0, prompt_tokens=600, frames=10))
    both = engine.step(10.0)
    assert both is not None
    assert (both.decode_seqs, both.prefill_tokens) == (1, 511)
    assert both.ms == pytest.approx(30.0 + 511 * 0.2 + 4.0)


def test_while_the_gate_throttles_no_request_is_admitted_and_decodes_go_on() -> None:
    """Gate True: the waiting request stays queued, the running one decodes (34 ms steps),
    and the step says it held; gate False again: the next step admits it."""
    throttle = [False]
    engine = TtsEngine(PROFILE, gate=lambda: throttle[0])
    engine.submit(Request("a", 0.0, prompt_tokens=50, frames=100))
    assert engine.step(0.0) is not None
    throttle[0] = True
    engine.submit(Request("b", 1.0, prompt_tokens=50, frames=100))
    for _ in range(3):
        step = engine.step(100.0)
        assert step is not None
        assert (step.held, step.admitted, step.decode_seqs, step.ms) == (True, (), 1, 34.0)
    assert engine.waiting == 1
    throttle[0] = False
    step = engine.step(200.0)
    assert step is not None
    assert (step.held, step.admitted) == (False, ("b",))
    assert step.ms == pytest.approx(30.0 + 50 * 0.2 + 4.0)


def test_everything_held_and_nothing_running_is_no_step() -> None:
    """With only held requests there is nothing to run: None, so the caller can wait."""
    engine = TtsEngine(PROFILE, gate=lambda: True)
    engine.submit(Request("a", 0.0, prompt_tokens=50, frames=10))
    assert engine.step(0.0) is None
    assert engine.waiting == 1
    assert TtsEngine(PROFILE).step(0.0) is None


def test_admission_stops_at_max_num_seqs() -> None:
    """No more than `max_num_seqs` requests run at once; the rest wait in order."""
    profile = dataclasses.replace(PROFILE, max_num_seqs=2)
    engine = TtsEngine(profile)
    for i in range(4):
        engine.submit(Request(f"r{i}", 0.0, prompt_tokens=10, frames=50))
    step = engine.step(0.0)
    assert step is not None
    assert step.admitted == ("r0", "r1")
    assert (engine.running, engine.waiting) == (2, 2)


def test_arrivals_are_seeded_and_in_order() -> None:
    """One seed gives the same requests; their times increase; the rate is about right."""
    one = Arrivals(2.0, PROFILE.workload, seed=7).due(600_000.0)
    two = Arrivals(2.0, PROFILE.workload, seed=7).due(600_000.0)
    assert one == two
    times = [r.arrival_ms for r in one]
    assert times == sorted(times)
    assert 1000 < len(one) < 1400
    load = PROFILE.workload
    longest = (
        load.template_tokens + load.text_max_tokens + load.reference_tokens(load.reference_max_s)
    )
    assert all(load.template_tokens < r.prompt_tokens <= longest for r in one)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_keeps_up_at_light_load(name: str) -> None:
    """A profile's estimated capacity is positive, and one decode alone is faster than real
    time (otherwise no stream could ever keep up on it)."""
    profile = PROFILES[name]
    assert profile.capacity_rps() > 0
    assert profile.step.step_ms(0, 1) < profile.frame_ms
    assert profile.source
