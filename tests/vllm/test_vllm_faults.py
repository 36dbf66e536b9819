"""Faults injected into vLLM's real scheduler: a field vLLM renamed, a queue that raises.

edgemon's part of a step never stops vLLM: the step goes on as vLLM's own would, every request
stays where vLLM expects it, and the error is counted (``edgemon_stats.errors``) and logged
once. Each case runs on vLLM's scheduler and, where vLLM-Omni imports, on its talker's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from edgemon.integrations._deadlines import VllmDeadlines
from edgemon.integrations.vllm_realtime import EdgemonRealtimeScheduler
from edgemon.policy.deadlines import Deadlines, DeadlineSettings
from edgemon.policy.realtime import RealtimeAdmission

from harness import (
    FlagGate,
    build_scheduler,
    make_request,
    rename_field,
    run_step,
    talker_classes,
    waiting_ids,
)

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

LOGGER = "edgemon.integrations"


def _realtime_classes() -> list[type[Any]]:
    try:
        from edgemon.integrations.vllm_omni_realtime import (  # noqa: PLC0415
            EdgemonOmniRealtimeScheduler,
        )
    except ImportError:
        return [EdgemonRealtimeScheduler]
    return [EdgemonRealtimeScheduler, EdgemonOmniRealtimeScheduler]


@pytest.fixture(params=talker_classes(), ids=lambda cls: cls.__name__)
def talker(request: pytest.FixtureRequest) -> type[Any]:
    """edgemon's gated scheduler: vLLM's, and vLLM-Omni's talker where it imports."""
    cls: type[Any] = request.param
    return cls


@pytest.fixture(params=_realtime_classes(), ids=lambda cls: cls.__name__)
def realtime(request: pytest.FixtureRequest) -> type[Any]:
    """edgemon's real-time scheduler: vLLM's, and vLLM-Omni's talker where it imports."""
    cls: type[Any] = request.param
    return cls


def _vllm_class(cls: type[Any]) -> type[Any]:
    """The vLLM (or vLLM-Omni) scheduler class edgemon's `cls` is built on."""
    return next(c for c in cls.__mro__ if c.__module__.startswith(("vllm.", "vllm_omni.")))


def _renamed(cls: type[Any], field: str) -> type[Any]:
    """`cls` on a vLLM release whose ``SchedulerOutput`` renamed `field` (harness.RENAMED)."""
    vllm_class = _vllm_class(cls)

    class Renamed(vllm_class):  # type: ignore[misc, valid-type]  # vLLM is untyped here
        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            owner = output if field == "scheduled_new_reqs" else output.scheduled_cached_reqs
            rename_field(owner, field)
            return output

    if cls is vllm_class:
        return Renamed
    return type(f"{cls.__name__}OnRenamedVllm", (cls, Renamed), {})


class _ReleasingGate:
    """A gate in a `max_hold_ms` release: it holds nothing until a step admits (`admitted`)."""

    def __init__(self) -> None:
        self.releasing = True

    def should_throttle_prefills(self) -> bool:
        return False

    def admitted(self) -> None:
        self.releasing = False


class _TwoAtATime(RealtimeAdmission):
    """Real-time admission that allows two running requests (no measuring needed)."""

    def admissible(self, running: int, oldest_wait_ms: float | None = None) -> int | None:
        return max(0, 2 - running)


def _trace(scheduler: Any, requests: Iterable[tuple[str, int]], count: int) -> list[Any]:
    for request_id, tokens in requests:
        scheduler.add_request(make_request(request_id, 10, max_tokens=tokens))
    trace = []
    for _ in range(count):
        step = run_step(scheduler)
        trace.append((step.scheduled, step.admitted, step.finished))
    return trace


def _one_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().split(",")[0] for r in caplog.records if r.name == LOGGER]


def _fail_once(queue: Any, method: str, *, after: int = 0) -> Any:
    """A copy of vLLM's waiting `queue` whose `method` raises once, on its call number
    `after` + 1 (each earlier call does its work, so the fault strikes midway)."""
    calls = [0]

    def faulty(self: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == after + 1:
            if args:  # a bulk call: the first request only, then the fault
                getattr(super(Faulty, self), method)([next(iter(args[0]))])
            raise RuntimeError("injected")
        return getattr(super(Faulty, self), method)(*args)

    Faulty = type("Faulty", (type(queue),), {method: faulty})
    copy = Faulty()
    for request in queue:
        copy.add_request(request)
    return copy


def _release_trace(scheduler: Any, gate: _ReleasingGate | None) -> list[Any]:
    """Two requests fill the batch (max_num_seqs 2); a third arrives as the gate's release
    begins and waits for a seat: the steps that cannot admit it read what they admitted."""
    trace = _trace(scheduler, [("r-1", 6), ("r-2", 6)], 2)
    if gate is not None:
        gate.releasing = True
    return trace + _trace(scheduler, [("r-3", 3)], 10)


@pytest.mark.parametrize("field", ["resumed_req_ids", "scheduled_new_reqs"])
def test_a_renamed_output_field_leaves_each_step_to_vllm(
    tiny_model: Path, talker: type[Any], field: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A vLLM that renamed a field edgemon reads after a step (what it admitted, what it
    batched), during a `max_hold_ms` release: every step is exactly vLLM's own, and the
    errors are counted and logged once."""
    vllm_own = build_scheduler(_renamed(_vllm_class(talker), field), tiny_model, max_num_seqs=2)
    expected = _release_trace(vllm_own, None)
    gate = _ReleasingGate()
    gate.releasing = False
    scheduler = build_scheduler(
        _renamed(talker, field), tiny_model, max_num_seqs=2, edgemon_gate=gate
    )
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert _release_trace(scheduler, gate) == expected
    assert scheduler.edgemon_stats.errors >= 2
    assert len(_one_log(caplog)) == 1


def test_a_renamed_field_under_real_time_admission_leaves_the_steps_to_vllm(
    tiny_model: Path, realtime: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Real-time admission cannot read what a step batched (a renamed field): it measures
    nothing and limits nothing, so the steps are vLLM's own; counted, logged once."""
    requests = [(f"r-{i}", 4) for i in range(5)]
    expected = _trace(
        build_scheduler(_renamed(_vllm_class(realtime), "scheduled_new_reqs"), tiny_model),
        requests,
        10,
    )
    scheduler = build_scheduler(
        _renamed(realtime, "scheduled_new_reqs"),
        tiny_model,
        edgemon_gate=FlagGate(),
        edgemon_realtime=RealtimeAdmission(),
    )
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert _trace(scheduler, requests, 10) == expected
    assert scheduler.edgemon_stats.errors > 0
    assert len(_one_log(caplog)) == 1


def test_a_queue_failing_midway_through_a_limited_step_loses_no_request(
    tiny_model: Path, realtime: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Real-time admission lets two of three waiting requests into the step, and the queue
    fails halfway through taking them out: the one already taken goes back in front, and the
    step is vLLM's own (all three admitted, in order); counted and logged once."""
    scheduler = build_scheduler(
        realtime, tiny_model, edgemon_gate=FlagGate(), edgemon_realtime=_TwoAtATime()
    )
    for i in range(3):
        scheduler.add_request(make_request(f"r-{i}", 10))
    scheduler.waiting = _fail_once(scheduler.waiting, "remove_requests")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        step = run_step(scheduler)
    assert step.admitted == ["r-0", "r-1", "r-2"]
    assert scheduler.edgemon_stats.errors == 1
    assert _one_log(caplog) == ["edgemon: an error in real-time admission"]


def test_a_queue_failing_midway_through_a_planned_step_loses_no_request(
    tiny_model: Path, talker: type[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline policy plans the step, and vLLM's queue fails halfway through removing
    the planned requests: the one removed goes back, nothing is lost, and the step is vLLM's
    own; counted and logged once."""
    policy = Deadlines(DeadlineSettings(start_slo_ms=3000.0), None, max_num_seqs=8)
    scheduler = build_scheduler(
        talker,
        tiny_model,
        edgemon_gate=FlagGate(),
        edgemon_deadlines=VllmDeadlines(policy, "hold"),
    )
    for i in range(3):
        scheduler.add_request(make_request(f"r-{i}", 10))
    scheduler.waiting = _fail_once(scheduler.waiting, "remove_requests")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        step = run_step(scheduler)
    assert sorted(step.admitted) == ["r-0", "r-1", "r-2"]
    assert waiting_ids(scheduler) == []
    assert scheduler.edgemon_stats.errors == 1
    assert _one_log(caplog) == ["edgemon: an error in choosing the planned requests"]
