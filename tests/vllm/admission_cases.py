"""The admission behaviours every gated scheduler must show, for any scheduler class.

Each test module of this tier imports these tests and defines a `flavour` fixture giving the
scheduler class under test (vLLM's in `.venv-vllm`, vLLM-Omni's in `.venv-omni`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from harness import FlagGate, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "decoding",
    "test_chunked_prefill_under_way_continues",
    "test_held_steps_admit_nothing_while_decodes_go_on",
    "test_idle_held_step_backs_off",
    "test_no_question_when_nothing_waits",
    "test_release_admits_in_original_order",
    "test_throttle_prefills_argument_passes_through",
]


def decoding(scheduler: Any, request_id: str, prompt_tokens: int = 10) -> None:
    """Add a request and step until it decodes."""
    scheduler.add_request(make_request(request_id, prompt_tokens))
    for _ in range(10):
        if request_id in run_step(scheduler).produced:
            return
    pytest.fail(f"{request_id} never started decoding")


def test_held_steps_admit_nothing_while_decodes_go_on(flavour: type[Any], tiny_model: Path) -> None:
    """While throttled, no waiting request is admitted in any step, and running decodes keep
    producing one token per step."""
    gate = FlagGate()
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=gate)
    decoding(scheduler, "run-a")
    decoding(scheduler, "run-b")
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


def test_release_admits_in_original_order(flavour: type[Any], tiny_model: Path) -> None:
    """On release, the held requests are admitted in the order they arrived."""
    gate = FlagGate()
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=gate, max_num_batched_tokens=512)
    decoding(scheduler, "run-a")
    gate.throttle = True
    order = [f"new-{i}" for i in (5, 1, 4, 2, 3)]
    for request_id in order:
        scheduler.add_request(make_request(request_id, 12))
    for _ in range(3):
        assert run_step(scheduler).admitted == []
    gate.throttle = False
    assert run_step(scheduler).admitted == order
    assert waiting_ids(scheduler) == []


def test_chunked_prefill_under_way_continues(flavour: type[Any], tiny_model: Path) -> None:
    """A long prompt whose prefill had started gets all its remaining chunks while throttled,
    then decodes; a request that came after it stays waiting."""
    gate = FlagGate()
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=gate, max_num_batched_tokens=64)
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


def test_idle_held_step_backs_off(flavour: type[Any], tiny_model: Path) -> None:
    """A held step with nothing running backs off once per step; a held step that runs a
    decode never does."""
    gate = FlagGate(throttle=True)
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=gate)
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


def test_throttle_prefills_argument_passes_through(flavour: type[Any], tiny_model: Path) -> None:
    """vLLM's own `throttle_prefills` argument still reaches its scheduler (it defers the
    admission while a decode runs)."""
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=FlagGate())
    decoding(scheduler, "run-a")
    scheduler.add_request(make_request("new", 10))
    assert run_step(scheduler, throttle_prefills=True).admitted == []
    assert run_step(scheduler, throttle_prefills=False).admitted == ["new"]


def test_no_question_when_nothing_waits(flavour: type[Any], tiny_model: Path) -> None:
    """With an empty waiting queue a step does not even ask the gate (nothing to hold)."""
    gate = FlagGate(throttle=True)
    scheduler = build_scheduler(flavour, tiny_model, edgemon_gate=gate)
    run_step(scheduler)
    assert gate.asked == 0
    scheduler.add_request(make_request("new", 10))
    run_step(scheduler)
    assert gate.asked == 1
