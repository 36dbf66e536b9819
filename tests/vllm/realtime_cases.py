"""Real-time admission on a real scheduler, for any scheduler class with it.

Each test module imports these tests and defines a `flavour` fixture giving the class (vLLM's
in `.venv-vllm`, vLLM-Omni's in `.venv-omni`). An injected clock plays the model: each step
lasts what the jetson profile's step-time model says for what it batched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.integrations.realtime import RealtimeAdmission

from harness import FlagGate, Step, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = [
    "ModelClock",
    "steps",
    "test_admits_up_to_the_measured_real_time_batch_then_follows_a_slowdown",
]

BASE_MS, PER_SEQ_MS, PER_TOKEN_MS = 30.0, 4.0, 0.2  # the jetson profile: N* = 12


class ModelClock:
    """The model runner's time: each step lasts what the step-time model says for what it
    batched (times `factor`, a box that slowed down)."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.factor = 1.0

    def __call__(self) -> float:
        return self.now_s

    def ran(self, step: Step) -> None:
        """Advance by `step`'s modelled duration."""
        tokens = sum(step.scheduled.values())
        requests = len(step.scheduled)
        prefill = tokens - requests + len(step.admitted)
        ms = BASE_MS + PER_SEQ_MS * requests + PER_TOKEN_MS * max(0, prefill)
        self.now_s += ms * self.factor / 1000.0


def steps(scheduler: Any, clock: ModelClock, count: int) -> Iterator[Step]:
    """`count` steps, one at a time, the clock advancing by each one's modelled time."""
    for _ in range(count):
        step = run_step(scheduler)
        clock.ran(step)
        yield step


def test_admits_up_to_the_measured_real_time_batch_then_follows_a_slowdown(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """Batches of 4 then 8 decodes teach the step shape; the limit is then N* = 12 (30 + 4n ≤
    80): of 10 more requests 4 are admitted, the other 6 wait in their order. When every step
    takes 1.3 times as long, the limit falls to 7 and nothing is admitted until fewer than 7
    run."""
    clock = ModelClock()
    admission = RealtimeAdmission(80.0)
    scheduler = build_scheduler(
        flavour,
        tiny_model,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        edgemon_gate=FlagGate(),
        edgemon_realtime=admission,
        edgemon_clock=clock,
    )
    for i in range(4):
        scheduler.add_request(make_request(f"a-{i}", 8, max_tokens=400))
    list(steps(scheduler, clock, 12))
    for i in range(4):
        scheduler.add_request(make_request(f"b-{i}", 8, max_tokens=60 + 10 * i))
    list(steps(scheduler, clock, 12))
    assert admission.limit == 12
    later = [f"c-{i}" for i in range(10)]
    for request_id in later:
        scheduler.add_request(make_request(request_id, 8, max_tokens=400))
    (step,) = steps(scheduler, clock, 1)
    assert step.admitted == later[:4]
    assert len(scheduler.running) == 12
    assert waiting_ids(scheduler) == later[4:]
    assert scheduler.edgemon_limited_steps == 1
    list(steps(scheduler, clock, 10))
    assert waiting_ids(scheduler) == later[4:]

    clock.factor = 1.3
    during = [(step.admitted, len(scheduler.running)) for step in steps(scheduler, clock, 120)]
    assert admission.limit == 7
    assert [(admitted, n) for admitted, n in during if admitted and n > 7] == []
    assert waiting_ids(scheduler) == later[4:]  # 12 running (b-* finish at 60–90 tokens: 8)
