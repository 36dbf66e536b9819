"""The benchmark's engine (vLLM's real scheduler on the step-time model) and the demo's pure
simulated engine make the same decisions, step by step, gate or no gate."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from edgemon.integrations.vllm import EdgemonScheduler
from edgemon.simulate.engine import Step, TtsEngine
from edgemon.simulate.profiles import JETSON, Workload
from edgemon.simulate.workload import Arrivals

from harness import FlagGate, build_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _vllm_engine import VllmEngine

if TYPE_CHECKING:
    from collections.abc import Callable

#: Prompts and audio that fit the tiny model's 1024 tokens; a small token budget so that
#: prompts are prefilled in chunks beside running decodes.
PROFILE = dataclasses.replace(
    JETSON,
    max_num_batched_tokens=256,
    max_num_seqs=6,
    workload=Workload(
        text_median_tokens=15, text_max_tokens=100, clone_share=1.0, audio_max_s=24.0
    ),
)


def decisions(step: Step | None) -> Any:
    if step is None:
        return None
    chunks = [(c.request, c.seq, c.frames, c.final, c.t_ms, c.eta_ms) for c in step.chunks]
    return (step.prefill_tokens, step.decode_seqs, step.admitted, step.held, step.ms, chunks)


def drive(tiny_model: Path, throttle: Callable[[int], bool]) -> int:
    """Run both engines on one request stream; assert each step agrees; the steps taken."""
    gate = FlagGate()
    scheduler = build_scheduler(
        EdgemonScheduler,
        tiny_model,
        max_num_batched_tokens=PROFILE.max_num_batched_tokens,
        max_num_seqs=PROFILE.max_num_seqs,
        num_blocks=4000,
        edgemon_gate=gate,
    )
    real = VllmEngine(scheduler, PROFILE)
    pure = TtsEngine(PROFILE, gate=lambda: gate.throttle)
    pending = Arrivals(3.0, PROFILE.workload, seed=11).due(6_000.0)
    assert len(pending) > 10
    now, steps = 0.0, 0
    while pending or real.running or real.waiting:
        while pending and pending[0].arrival_ms <= now:
            request = pending.pop(0)
            real.submit(request)
            pure.submit(request)
        gate.throttle = throttle(steps)
        expected = pure.step(now)
        got = real.step(now)
        assert decisions(got) == decisions(expected), f"step {steps} at {now} ms"
        assert (real.waiting, real.running) == (pure.waiting, pure.running)
        steps += 1
        if expected is not None:
            now = expected.end_ms
        elif pending:
            now = max(now + 5.0, pending[0].arrival_ms)
        else:
            now += 5.0
    return steps


def test_vllm_and_the_simulated_engine_agree_step_by_step(tiny_model: Path) -> None:
    """No gate: the same prefill tokens, decodes, admissions, step times and chunks (with
    their eta hints) every step, until every request has finished."""
    assert drive(tiny_model, lambda _: False) > 100


def test_they_agree_while_the_gate_holds_prefills(tiny_model: Path) -> None:
    """The gate throttling in bursts of 40 steps out of every 100: both hold the same
    steps and admit the same requests afterwards."""
    assert drive(tiny_model, lambda step: step % 100 < 40) > 100
