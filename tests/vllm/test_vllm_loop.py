"""The loop closed on real parts: a Reporter feeds `edgemon run` (a process) on Mosquitto, and
vLLM's real scheduler, with edgemon's subclass and its gate from the environment, obeys."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from edgemon.client import GateState, Reporter
from edgemon.integrations.vllm import EdgemonScheduler

from admission_cases import decoding
from harness import build_scheduler, make_request, run_step
from processes import edgemon_run

if TYPE_CHECKING:
    from pathlib import Path

    from brokers import Broker

pytestmark = pytest.mark.integration

T = 30.0  # generous: a loaded machine
DEVICE = "vllm-box"


def _held(state: GateState) -> bool:
    return state.active


def _released(state: GateState) -> bool:
    return state.connected and state.throttle is False


def test_scheduler_holds_while_a_reported_stream_runs_dry(
    tiny_model: Path, private_broker: Broker, tmp_path: Path, monkeypatch: Any
) -> None:
    """A stream gets one 1.5 s chunk and nothing more: edgemon throttles the device when its
    headroom falls below the margin, and from the next step on the scheduler admits nothing
    new while the running stream keeps decoding; the stream's end releases the throttle and
    the held request is admitted. The delay from the throttle object's `t_ms` to the first
    held step is printed (the Reporter stamps this host's clock)."""
    host, port = private_broker.host, private_broker.port
    url = f"mqtt://{host}:{port}"
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", url)
    monkeypatch.setenv("EDGEMON_GATE_MAX_HOLD_MS", "600000")
    with edgemon_run(private_broker, tmp_path), Reporter(url, DEVICE) as reporter:
        scheduler = build_scheduler(EdgemonScheduler, tiny_model)
        gate = scheduler.edgemon_gate
        try:
            assert gate is not None
            assert gate.wait_until(lambda s: s.connected and s.edgemon_online, T)
            decoding(scheduler, "talking")
            reporter.start("dry")
            reporter.chunk("dry", audio_ms=1_500, eta_ms=0)
            assert reporter.flush(T)
            assert gate.wait_until(_held, T)
            scheduler.add_request(make_request("next", 10))
            step = run_step(scheduler)
            held_ms = time.time() * 1000
            assert step.admitted == []
            assert step.produced == {"talking": [7]}
            t_ms = gate.state.t_ms
            assert t_ms is not None
            for _ in range(5):
                step = run_step(scheduler)
                assert step.admitted == []
                assert step.produced == {"talking": [7]}
            reporter.end("dry")
            assert gate.wait_until(_released, T)
            assert run_step(scheduler).admitted == ["next"]
        finally:
            scheduler.shutdown()
    print(f"throttle t_ms -> first held step: {held_ms - t_ms:.1f} ms")
    assert scheduler.edgemon_stats.held_steps == 6
