"""vLLM's CPU engine (`LLM`) with edgemon's scheduler plugged in by name: a real forward pass
on dummy weights of a tiny local model, nothing downloaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from edgemon.client import ThrottleGate

from mqtt_probe import probe

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokers import Broker

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # vLLM's own start-up touches a deprecated torch alias; not ours to fix.
    pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning"),
]

T = 30.0  # generous: a loaded machine
DEVICE = "cpu-box"
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


def _generate(llm: Any) -> list[list[int]]:
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=ids) for ids in PROMPTS],
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )
    return [list(output.outputs[0].token_ids) for output in outputs]


def test_engine_runs_with_the_scheduler_held_and_released(
    edgemon_llm: Callable[..., Any], private_broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LLM(scheduler_cls="edgemon.integrations.vllm.EdgemonScheduler")` builds edgemon's
    scheduler in the engine core with its gate from the environment. Throttled for good, a
    generation still completes (each 300 ms hold lets one step through) after held steps;
    released, the same prompts give the same greedy tokens; shutdown closes the gate."""
    host, port = private_broker.host, private_broker.port
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    monkeypatch.setenv("EDGEMON_GATE_DEVICE", DEVICE)
    monkeypatch.setenv("EDGEMON_GATE_BROKER", f"mqtt://{host}:{port}")
    monkeypatch.setenv("EDGEMON_GATE_MAX_HOLD_MS", "300")
    throttle = f"edgemon/v1/{DEVICE}/throttle"
    with probe(host, port) as edgemon:
        edgemon.publish("edgemon/v1/_edgemon/e1/status", {"state": "online", "t_ms": 1.0e12})
        edgemon.publish(throttle, {"device": DEVICE, "throttle": True, "t_ms": 1.0e12, "seq": 1})
        llm = edgemon_llm(4)
        core = llm.llm_engine.engine_core.engine_core
        scheduler = core.scheduler
        gate = scheduler.edgemon_gate
        assert isinstance(gate, ThrottleGate)
        assert gate.wait_until(lambda s: s.active, T)
        held_tokens = _generate(llm)
        held = scheduler.edgemon_stats
        assert held.held_steps > 0
        assert gate.stats.max_hold_releases > 0
        edgemon.publish(throttle, {"device": DEVICE, "throttle": False, "t_ms": 1.0e12, "seq": 2})
        assert gate.wait_until(lambda s: s.throttle is False, T)
        assert _generate(llm) == held_tokens
        assert scheduler.edgemon_stats.held_steps == held.held_steps
        core.shutdown()
    assert all(len(tokens) == 8 for tokens in held_tokens)
    assert not gate.state.connected


def test_an_ended_waiting_request_reaches_the_output_processor(
    edgemon_llm: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through vLLM's own engine (core, output processor): a waiting request edgemon ends
    comes out finished, with finish_reason abort, stop_reason edgemon:start_deadline and no
    token (what vLLM's OpenAI server turns into its response); the running one completes."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("EDGEMON_GATE_DEVICE", raising=False)
    llm = edgemon_llm(1)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, detokenize=False)
    for name, ids in (("running", PROMPTS[0]), ("waiting", PROMPTS[1])):
        engine.add_request(name, TokensPrompt(prompt_token_ids=ids), params)
    core = engine.engine_core.engine_core
    engine.step()
    waiting = [request.request_id for request in core.scheduler.waiting]
    assert len(waiting) == 1
    assert core.scheduler.edgemon_end_waiting(waiting) == waiting
    finished: dict[str, Any] = {}
    for _ in range(20):
        finished |= {out.request_id: out.outputs[0] for out in engine.step() if out.finished}
        if not engine.has_unfinished_requests():
            break
    core.shutdown()
    ended = finished["waiting"]
    assert (ended.finish_reason, ended.stop_reason, list(ended.token_ids)) == (
        "abort",
        "edgemon:start_deadline",
        [],
    )
    assert finished["running"].finish_reason == "length"
    assert len(finished["running"].token_ids) == 6
