"""Real-time admission on vLLM's real V1 scheduler: it measures its steps (an injected clock
plays the model's step times) and admits no request beyond the batch that fits a frame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations.realtime import RealtimeAdmission
from edgemon.integrations.vllm_realtime import (
    EdgemonRealtimeAsyncScheduler,
    EdgemonRealtimeScheduler,
    admission_from_environ,
)

from harness import FlagGate, Step, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

BASE_MS, PER_SEQ_MS, PER_TOKEN_MS = 30.0, 4.0, 0.2  # the jetson profile: N* = 12


class ModelClock:
    """The model runner's time: each step lasts what the step-time model says for what it
    batched (times `factor`, a box that slowed down)."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.factor = 1.0

    def __call__(self) -> float:
        return self.now_s

    def ran(self, step: Step, scheduler: Any) -> None:
        """Advance by `step`'s modelled duration."""
        tokens = sum(step.scheduled.values())
        requests = len(step.scheduled)
        prefill = tokens - requests + len(step.admitted)
        ms = BASE_MS + PER_SEQ_MS * requests + PER_TOKEN_MS * max(0, prefill)
        self.now_s += ms * self.factor / 1000.0
        del scheduler


@pytest.fixture(
    params=[EdgemonRealtimeScheduler, EdgemonRealtimeAsyncScheduler], ids=lambda c: c.__name__
)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """Both flavours."""
    cls: type[Any] = request.param
    return cls


def steps(scheduler: Any, clock: ModelClock, count: int) -> Iterator[Step]:
    """`count` steps, one at a time, the clock advancing by each one's modelled time."""
    for _ in range(count):
        step = run_step(scheduler)
        clock.ran(step, scheduler)
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


def test_without_real_time_admission_it_is_vllms_own_scheduling(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`EDGEMON_REALTIME_FRAME_MS=0` and no gate: step by step what vLLM's Scheduler does."""
    monkeypatch.setenv("EDGEMON_REALTIME_FRAME_MS", "0")
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    traces = []
    for cls in (Scheduler, EdgemonRealtimeScheduler):
        scheduler = build_scheduler(cls, tiny_model, max_num_seqs=4, max_num_batched_tokens=64)
        for i in range(7):
            scheduler.add_request(make_request(f"r-{i}", 20 + 7 * i, max_tokens=5 + i))
        trace = []
        for _ in range(30):
            step = run_step(scheduler)
            trace.append((step.scheduled, step.admitted, step.finished))
        traces.append(trace)
        if cls is EdgemonRealtimeScheduler:
            assert scheduler.edgemon_realtime is None
    assert traces[0] == traces[1]


def test_the_gate_still_holds_everything(tiny_model: Path) -> None:
    """With the gate throttling, no request is admitted whatever real time allows."""
    clock = ModelClock()
    gate = FlagGate(throttle=True)
    scheduler = build_scheduler(
        EdgemonRealtimeScheduler,
        tiny_model,
        edgemon_gate=gate,
        edgemon_realtime=RealtimeAdmission(80.0),
        edgemon_clock=clock,
    )
    scheduler.add_request(make_request("r", 8))
    assert [step.admitted for step in steps(scheduler, clock, 3)] == [[], [], []]
    gate.throttle = False
    assert next(steps(scheduler, clock, 1)).admitted == ["r"]


@pytest.mark.parametrize("value", ["-1", "fast", "nan", "inf"])
def test_a_bad_frame_setting_is_refused_naming_the_variable(value: str) -> None:
    """A frame that is not a number of milliseconds ≥ 0 is refused at start-up."""
    with pytest.raises(ValueError, match="EDGEMON_REALTIME_FRAME_MS"):
        admission_from_environ({"EDGEMON_REALTIME_FRAME_MS": value})
    admission = admission_from_environ({})
    assert admission is not None
    assert admission.frame_ms == 80.0
