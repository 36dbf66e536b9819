"""EdgemonScheduler on vLLM's real V1 Scheduler, driven step by step with a hand-set gate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations.vllm import EdgemonAsyncScheduler, EdgemonScheduler

from harness import FlagGate, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from pathlib import Path


FLAVOURS = [EdgemonScheduler, EdgemonAsyncScheduler]


def _gated(cls: type[Any], tiny_model: Path, gate: FlagGate, **kwargs: Any) -> Any:
    return build_scheduler(cls, tiny_model, edgemon_gate=gate, **kwargs)


def _decoding(scheduler: Any, request_id: str, prompt_tokens: int = 10) -> None:
    """Add a request and step until it decodes."""
    scheduler.add_request(make_request(request_id, prompt_tokens))
    for _ in range(10):
        if request_id in run_step(scheduler).produced:
            return
    pytest.fail(f"{request_id} never started decoding")


@pytest.mark.parametrize("cls", FLAVOURS)
def test_held_steps_admit_nothing_while_decodes_go_on(cls: type[Any], tiny_model: Path) -> None:
    """While throttled, no waiting request is admitted in any step, and running decodes keep
    producing one token per step."""
    gate = FlagGate()
    scheduler = _gated(cls, tiny_model, gate)
    _decoding(scheduler, "run-a")
    _decoding(scheduler, "run-b")
    gate.throttle = True
    for request_id in ("new-1", "new-2", "new-3"):
        scheduler.add_request(make_request(request_id, 12))
    for _ in range(8):
        step = run_step(scheduler)
        assert step.admitted == []
        assert set(step.scheduled) == {"run-a", "run-b"}
        assert step.produced == {"run-a": [7], "run-b": [7]}
    assert waiting_ids(scheduler) == ["new-1", "new-2", "new-3"]
    assert scheduler.edgemon_stats.held_steps == 8
    assert scheduler.edgemon_stats.idle_sleeps == 0


@pytest.mark.parametrize("cls", FLAVOURS)
def test_release_admits_in_original_order(cls: type[Any], tiny_model: Path) -> None:
    """On release, the held requests are admitted in the order they arrived."""
    gate = FlagGate()
    scheduler = _gated(cls, tiny_model, gate, max_num_batched_tokens=512)
    _decoding(scheduler, "run-a")
    gate.throttle = True
    order = [f"new-{i}" for i in (5, 1, 4, 2, 3)]
    for request_id in order:
        scheduler.add_request(make_request(request_id, 12))
    for _ in range(3):
        assert run_step(scheduler).admitted == []
    gate.throttle = False
    step = run_step(scheduler)
    assert step.admitted == order
    assert waiting_ids(scheduler) == []


@pytest.mark.parametrize("cls", FLAVOURS)
def test_chunked_prefill_under_way_continues(cls: type[Any], tiny_model: Path) -> None:
    """A long prompt whose prefill had started gets all its remaining chunks while throttled,
    then decodes; a request that came after it stays waiting."""
    gate = FlagGate()
    scheduler = _gated(cls, tiny_model, gate, max_num_batched_tokens=64)
    scheduler.add_request(make_request("long", 200))
    assert run_step(scheduler).scheduled == {"long": 64}
    gate.throttle = True
    scheduler.add_request(make_request("late", 10))
    chunks = []
    for _ in range(5):
        step = run_step(scheduler)
        assert "late" not in step.scheduled
        chunks.append(step.scheduled["long"])
    assert chunks == [64, 64, 8, 1, 1]
    assert waiting_ids(scheduler) == ["late"]


def test_preempted_requests_come_back_in_vllms_order(tiny_model: Path) -> None:
    """Requests a held step preempts (KV full) go back in front of the held ones in the very
    order vLLM's own scheduler leaves them, and are not re-admitted while held.

    (vLLM-Omni 0.30's restore reverses them: `prepend_requests` is `extendleft`.)"""
    traces = {}
    for cls, gate in ((Scheduler, None), (EdgemonScheduler, FlagGate())):
        kwargs = {} if gate is None else {"edgemon_gate": gate}
        # Two 32-token prompts (2 blocks each) and two 4-token ones (1 block each) fill the
        # 6 usable blocks; the next step both long ones need a third block: vLLM preempts the
        # last running request for each, p-4 then p-3.
        scheduler = build_scheduler(
            cls, tiny_model, num_blocks=7, max_num_batched_tokens=512, **kwargs
        )
        for request_id, prompt in (("p-1", 32), ("p-2", 32), ("p-3", 4), ("p-4", 4)):
            scheduler.add_request(make_request(request_id, prompt, max_tokens=200))
        steps = [run_step(scheduler)]
        scheduler.add_request(make_request("queued", 8))
        if gate is not None:
            gate.throttle = True
        while not steps[-1].preempted and len(steps) < 60:
            steps.append(run_step(scheduler))
        traces[cls] = ([s.preempted for s in steps], waiting_ids(scheduler))
    plain, gated = traces[Scheduler], traces[EdgemonScheduler]
    assert plain == gated
    assert plain[0][-1] == ["p-3", "p-4"], "the trace must preempt two requests in one step"
    assert plain[1] == ["p-3", "p-4", "queued"]


def test_idle_held_step_backs_off(tiny_model: Path) -> None:
    """A held step with nothing running backs off once per step; a held step that runs a
    decode never does."""
    gate = FlagGate(throttle=True)
    scheduler = _gated(EdgemonScheduler, tiny_model, gate)
    scheduler.add_request(make_request("held", 10))
    for _ in range(3):
        assert run_step(scheduler).scheduled == {}
    assert scheduler.edgemon_stats.idle_sleeps == 3
    gate.throttle = False
    run_step(scheduler)
    gate.throttle = True
    scheduler.add_request(make_request("held-2", 10))
    for _ in range(3):
        assert run_step(scheduler).produced == {"held": [7]}
    assert scheduler.edgemon_stats.held_steps == 6
    assert scheduler.edgemon_stats.idle_sleeps == 3


def test_throttle_prefills_argument_passes_through(tiny_model: Path) -> None:
    """vLLM's own `throttle_prefills` argument still reaches its scheduler (it defers the
    admission while a decode runs), held or not."""
    gate = FlagGate()
    scheduler = _gated(EdgemonScheduler, tiny_model, gate)
    _decoding(scheduler, "run-a")
    scheduler.add_request(make_request("new", 10))
    assert run_step(scheduler, throttle_prefills=True).admitted == []
    assert run_step(scheduler, throttle_prefills=False).admitted == ["new"]


def test_no_question_when_nothing_waits(tiny_model: Path) -> None:
    """With an empty waiting queue a step does not even ask the gate (nothing to hold)."""
    gate = FlagGate(throttle=True)
    scheduler = _gated(EdgemonScheduler, tiny_model, gate)
    run_step(scheduler)
    assert gate.asked == 0
    scheduler.add_request(make_request("new", 10))
    run_step(scheduler)
    assert gate.asked == 1
