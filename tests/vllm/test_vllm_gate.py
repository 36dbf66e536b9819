"""EdgemonScheduler with the real ThrottleGate on a real Mosquitto, and without any gate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.client import GateState, ThrottleGate
from edgemon.integrations.vllm import EdgemonScheduler

from harness import build_scheduler, make_request, run_step
from mqtt_probe import Probe, probe

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from brokers import Broker
    from ports import MosquittoServer

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine
DEVICE = "box-1"
THROTTLE = f"edgemon/v1/{DEVICE}/throttle"
STATUS = "edgemon/v1/_edgemon/edgemon-test/status"
GATE_ENV = ("EDGEMON_GATE_DEVICE", "EDGEMON_GATE_BROKER", "EDGEMON_GATE_MAX_HOLD_MS")


class Clock:
    """A monotonic clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _throttle(publisher: Probe, seq: int, *, on: bool) -> None:
    publisher.publish(
        THROTTLE,
        {"device": DEVICE, "throttle": on, "t_ms": 1.0e12 + seq, "seq": seq, "streams": []},
    )


def _active(state: GateState) -> bool:
    return state.active


@pytest.fixture
def no_gate_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's process has none of the gate's variables."""
    for name in GATE_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def throttling(private_broker: Broker) -> Iterator[Probe]:
    """A probe acting as edgemon: `online`, and the device throttled (seq 1), both retained."""
    host, port = private_broker.host, private_broker.port
    with probe(host, port) as publisher:
        publisher.publish(STATUS, {"state": "online", "version": "test", "t_ms": 1.0e12})
        _throttle(publisher, 1, on=True)
        yield publisher


def test_without_a_device_the_steps_are_vllms(tiny_model: Path, no_gate_env: None) -> None:
    """With no EDGEMON_GATE_DEVICE there is no gate, and every step (tokens scheduled, admitted,
    produced, finished, preempted) equals vLLM's own Scheduler's on the same request trace:
    arrivals over time, a chunked long prompt, KV pressure with preemptions, completions."""
    schedulers = [
        build_scheduler(cls, tiny_model, num_blocks=24, max_num_batched_tokens=48)
        for cls in (Scheduler, EdgemonScheduler)
    ]
    assert schedulers[1].edgemon_gate is None
    arrivals = {0: [("a", 20), ("long", 150)], 3: [("b", 40)], 5: [("c", 5), ("d", 70)]}
    arrivals |= {9: [("e", 33)], 14: [("f", 16), ("g", 17)]}
    traces: list[list[Any]] = [[], []]
    for step in range(120):
        for trace, scheduler in zip(traces, schedulers, strict=True):
            for request_id, prompt in arrivals.get(step, ()):
                scheduler.add_request(make_request(request_id, prompt, max_tokens=40))
            trace.append(run_step(scheduler))
    assert traces[0] == traces[1]
    assert any(s.preempted for s in traces[0]), "the trace must exercise preemption"
    assert sorted(r for s in traces[0] for r in s.finished) == [*"abcdefg", "long"]


def test_gate_from_the_environment_is_owned(
    tiny_model: Path, throttling: Probe, private_broker: Broker, monkeypatch: Any
) -> None:
    """Given EDGEMON_GATE_* the scheduler builds and opens its own gate, follows edgemon's
    throttle through it, and closes it at shutdown (after which nothing is held)."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.setenv("EDGEMON_GATE_MAX_HOLD_MS", "600000")
    scheduler = build_scheduler(EdgemonScheduler, tiny_model)
    gate = scheduler.edgemon_gate
    assert isinstance(gate, ThrottleGate)
    assert gate.device == DEVICE
    assert gate.max_hold_ms == 600_000
    assert gate.wait_until(_active, T)
    scheduler.add_request(make_request("held", 10))
    assert run_step(scheduler).admitted == []
    scheduler.shutdown()
    assert not gate.state.connected
    assert run_step(scheduler).admitted == ["held"]


def test_a_bad_setting_stops_the_start(
    tiny_model: Path, no_gate_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad EDGEMON_GATE_* value makes building the scheduler (the engine's start) fail with
    an error naming the variable, rather than an engine that silently never throttles."""
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_MAX_HOLD_MS", "two seconds")
    with pytest.raises(ValueError, match="EDGEMON_GATE_MAX_HOLD_MS"):
        build_scheduler(EdgemonScheduler, tiny_model)


def test_max_hold_lets_one_step_through(
    tiny_model: Path, throttling: Probe, private_broker: Broker
) -> None:
    """With the throttle on for good, a hold that reached max_hold_ms (on the gate's clock)
    lets exactly one step admit what waits; the next step holds again."""
    host, port = private_broker.host, private_broker.port
    clock = Clock()
    with ThrottleGate(f"mqtt://{host}:{port}", DEVICE, max_hold_ms=1_000, clock=clock) as gate:
        assert gate.wait_until(_active, T)
        scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=gate)
        scheduler.add_request(make_request("first", 10))
        assert run_step(scheduler).admitted == []
        clock.now += 0.999
        assert run_step(scheduler).admitted == []
        scheduler.add_request(make_request("second", 10))
        clock.now += 0.001
        assert run_step(scheduler).admitted == ["first", "second"]
        scheduler.add_request(make_request("third", 10))
        for _ in range(3):
            assert run_step(scheduler).admitted == []
        stats = gate.stats
    assert stats.max_hold_releases == 1
    assert stats.holds == 2


def test_fails_open_when_edgemon_goes_offline(
    tiny_model: Path, throttling: Probe, private_broker: Broker
) -> None:
    """edgemon's `offline` status (its last will) releases the hold at once, throttle or not;
    `online` again with the throttle still on holds again."""
    host, port = private_broker.host, private_broker.port
    with ThrottleGate(f"mqtt://{host}:{port}", DEVICE, max_hold_ms=600_000) as gate:
        assert gate.wait_until(_active, T)
        scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=gate)
        scheduler.add_request(make_request("held", 10))
        assert run_step(scheduler).admitted == []
        throttling.publish(STATUS, {"state": "offline", "version": "test", "t_ms": 1.0e12})
        assert gate.wait_until(lambda s: not s.edgemon_online, T)
        assert run_step(scheduler).admitted == ["held"]
        throttling.publish(STATUS, {"state": "online", "version": "test", "t_ms": 1.0e12})
        assert gate.wait_until(_active, T)
        scheduler.add_request(make_request("held-again", 10))
        assert run_step(scheduler).admitted == []


def test_fails_open_when_the_broker_goes_away(
    tiny_model: Path, mosquitto_server: MosquittoServer
) -> None:
    """Losing the broker releases the hold; the scheduler admits while it is gone."""
    with probe(mosquitto_server.host, mosquitto_server.port) as publisher:
        publisher.publish(STATUS, {"state": "online", "version": "test", "t_ms": 1.0e12})
        _throttle(publisher, 1, on=True)
    with ThrottleGate(mosquitto_server.url, DEVICE, max_hold_ms=600_000) as gate:
        assert gate.wait_until(_active, T)
        scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=gate)
        scheduler.add_request(make_request("held", 10))
        assert run_step(scheduler).admitted == []
        mosquitto_server.stop()
        assert gate.wait_until(lambda s: not s.connected, T)
        assert run_step(scheduler).admitted == ["held"]


def test_a_release_lasts_until_a_step_admits(
    tiny_model: Path, throttling: Probe, private_broker: Broker
) -> None:
    """A max_hold_ms release whose first steps cannot admit (the batch is full: one running
    request, max_num_seqs 1) stays open, with the gate's clock standing still, until a step
    admits the waiting request; then the next request is held again."""
    host, port = private_broker.host, private_broker.port
    clock = Clock()
    with ThrottleGate(f"mqtt://{host}:{port}", DEVICE, max_hold_ms=1_000, clock=clock) as gate:
        assert gate.wait_until(_active, T)
        scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=gate, max_num_seqs=1)
        scheduler.add_request(make_request("running", 10, max_tokens=6))
        assert run_step(scheduler).admitted == []  # the first hold begins
        clock.now += 1.0
        assert run_step(scheduler).admitted == ["running"]
        scheduler.add_request(make_request("late", 10))
        assert run_step(scheduler).admitted == []  # the second hold begins
        clock.now += 1.0
        admitted = [run_step(scheduler).admitted for _ in range(8)]
        assert ["late"] in admitted, admitted  # once "running" is done, without a new hold
        assert admitted[: admitted.index(["late"])] == [[]] * admitted.index(["late"])
        scheduler.add_request(make_request("third", 10))
        assert run_step(scheduler).admitted == []
        stats = gate.stats
    assert (stats.holds, stats.max_hold_releases) == (3, 2)
