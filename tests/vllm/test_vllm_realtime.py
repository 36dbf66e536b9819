"""Real-time admission on vLLM's real V1 scheduler: it measures its steps (an injected clock
plays the model's step times) and admits no request beyond the batch that fits a frame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from realtime_cases import *  # noqa: F403 - the shared real-time admission tests run here
from realtime_cases import ModelClock, steps
from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations.vllm import EdgemonScheduler
from edgemon.integrations.vllm_realtime import (
    EdgemonRealtimeAsyncScheduler,
    EdgemonRealtimeScheduler,
)
from edgemon.policy.realtime import RealtimeAdmission

from harness import FlagGate, build_scheduler, make_request, run_step

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(
    params=[EdgemonRealtimeScheduler, EdgemonRealtimeAsyncScheduler], ids=lambda c: c.__name__
)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """Both flavours."""
    cls: type[Any] = request.param
    return cls


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


def test_the_frame_comes_from_the_environment(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real-time scheduler's admission allows the frame ``EDGEMON_REALTIME_FRAME_MS``
    says (80 ms, one codec frame, when unset); `EdgemonScheduler` builds none; a frame that is
    not a number of milliseconds ≥ 0 stops the start naming the variable."""
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    monkeypatch.delenv("EDGEMON_REALTIME_FRAME_MS", raising=False)
    default = build_scheduler(EdgemonRealtimeScheduler, tiny_model).edgemon_realtime
    assert default is not None
    assert default.frame_ms == pytest.approx(80.0)
    assert build_scheduler(EdgemonScheduler, tiny_model).edgemon_realtime is None
    monkeypatch.setenv("EDGEMON_REALTIME_FRAME_MS", "100")
    custom = build_scheduler(EdgemonRealtimeScheduler, tiny_model).edgemon_realtime
    assert custom is not None
    assert custom.frame_ms == pytest.approx(100.0)
    monkeypatch.setenv("EDGEMON_REALTIME_FRAME_MS", "fast")
    with pytest.raises(ValueError, match=r"^EDGEMON_REALTIME_FRAME_MS: 'fast' is not"):
        build_scheduler(EdgemonRealtimeScheduler, tiny_model)
