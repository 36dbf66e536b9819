"""Real-time admission on a real scheduler, for any scheduler class with it.

Each test module imports these tests and defines a `flavour` fixture giving the class (vLLM's
in `.venv-vllm`, vLLM-Omni's in `.venv-omni`). An injected clock plays the model: each step
lasts what the jetson profile's step-time model says for what it batched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from edgemon.client import ThrottleGate
from edgemon.policy.realtime import RealtimeAdmission

from harness import FlagGate, Step, build_scheduler, make_request, run_step, waiting_ids
from mqtt_probe import probe

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from brokers import Broker

__all__ = [
    "ModelClock",
    "roomy",
    "steps",
    "test_a_max_hold_release_lasts_while_real_time_admission_keeps_requests_out",
    "test_admits_up_to_the_measured_real_time_batch_then_follows_a_slowdown",
]

BASE_MS, PER_SEQ_MS, PER_TOKEN_MS = 30.0, 4.0, 0.2  # the jetson profile: N* = 12


T = 30.0  # generous: a loaded machine
DEVICE = "box-1"


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


def roomy(
    cls: type[Any], tiny_model: Path, clock: ModelClock, admission: RealtimeAdmission, **kwargs: Any
) -> Any:
    """A scheduler of `cls` with room for 32 requests (512 tokens a step), an open gate,
    `admission` and the steps timed by `clock`."""
    return build_scheduler(
        cls,
        tiny_model,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        edgemon_gate=FlagGate(),
        edgemon_realtime=admission,
        edgemon_clock=clock,
        **kwargs,
    )


def test_admits_up_to_the_measured_real_time_batch_then_follows_a_slowdown(
    tiny_model: Path, flavour: type[Any]
) -> None:
    """Batches of 4 then 8 decodes teach the step shape; the limit is then N* = 12 (30 + 4n ≤
    80): of 10 more requests 4 are admitted, the other 6 wait in their order. When every step
    takes 1.3 times as long, the limit falls to 7 and nothing is admitted until fewer than 7
    run."""
    clock = ModelClock()
    admission = RealtimeAdmission(80.0)
    scheduler = roomy(flavour, tiny_model, clock, admission)
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


class GateClock:
    """The gate's monotonic clock, moved by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.integration
def test_a_max_hold_release_lasts_while_real_time_admission_keeps_requests_out(
    tiny_model: Path, flavour: type[Any], private_broker: Broker
) -> None:
    """The real ThrottleGate throttling for good (max_hold_ms 1 s on its own clock) and a
    real-time limit of 1 (frame 36 ms: 30 + 4n fits one stream). While one request runs, real
    time keeps the next one out, yet the gate is asked: its hold begins, and the release that
    max_hold_ms gives lasts through the steps that cannot admit (no new hold, the gate's clock
    standing still) until the running request is done and a step admits the waiting one.
    Then the next request is held again. So the engine does what `edgemon.simulate` models."""
    host, port = private_broker.host, private_broker.port
    with probe(host, port) as edgemon:
        edgemon.publish(
            "edgemon/v1/_edgemon/edgemon-test/status",
            {"state": "online", "version": "test", "t_ms": 1.0e12},
        )
        edgemon.publish(
            f"edgemon/v1/{DEVICE}/throttle",
            {"device": DEVICE, "throttle": True, "t_ms": 1.0e12, "seq": 1, "streams": []},
        )
        gate_clock = GateClock()
        gate = ThrottleGate(f"mqtt://{host}:{port}", DEVICE, max_hold_ms=1_000, clock=gate_clock)
        with gate:
            assert gate.wait_until(lambda state: state.active, T)
            admission = RealtimeAdmission(36.0)
            for decodes in (1, 3) * 4:
                admission.observe(decodes, 0, BASE_MS + PER_SEQ_MS * decodes)
            assert admission.limit == 1
            clock = ModelClock()
            scheduler = build_scheduler(
                flavour,
                tiny_model,
                edgemon_gate=gate,
                edgemon_realtime=admission,
                edgemon_clock=clock,
            )
            scheduler.add_request(make_request("running", 8, max_tokens=6))
            assert next(steps(scheduler, clock, 1)).admitted == []  # the first hold begins
            gate_clock.now += 1.0
            assert next(steps(scheduler, clock, 1)).admitted == ["running"]
            scheduler.add_request(make_request("late", 8))
            assert next(steps(scheduler, clock, 1)).admitted == []  # the second hold begins
            gate_clock.now += 1.0
            admitted = [step.admitted for step in steps(scheduler, clock, 10)]
            assert ["late"] in admitted, admitted  # once "running" is done, without a new hold
            first = admitted.index(["late"])
            assert first > 1, admitted  # steps that could not admit came before it
            assert admitted[:first] == [[]] * first
            scheduler.add_request(make_request("third", 8))
            assert next(steps(scheduler, clock, 1)).admitted == []
            stats = gate.stats
    assert (stats.holds, stats.max_hold_releases) == (3, 2)
