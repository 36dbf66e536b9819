"""EdgemonScheduler on vLLM's real V1 Scheduler, driven step by step with a hand-set gate."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from edgemon.integrations.plugin import register_omni_pipelines
from edgemon.integrations.vllm import EdgemonAsyncScheduler, EdgemonScheduler

from admission_cases import *  # noqa: F403 - the shared admission tests run here too
from harness import FlagGate, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(params=[EdgemonScheduler, EdgemonAsyncScheduler], ids=lambda cls: cls.__name__)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """The scheduler class under test: both flavours."""
    cls: type[Any] = request.param
    return cls


def test_preempted_requests_come_back_in_vllms_order(tiny_model: Path) -> None:
    """Requests a held step preempts (KV full) go back in front of the held ones in the very
    order vLLM's own scheduler leaves them, and are not re-admitted while held.

    (vLLM-Omni 0.30's restore reverses them: `prepend_requests` is `extendleft`.)"""
    traces = {}
    for cls, gate in ((Scheduler, None), (EdgemonScheduler, FlagGate())):
        kwargs: dict[str, Any] = {} if gate is None else {"edgemon_gate": gate}
        # Two 32-token prompts (2 blocks each) and two 4-token ones (1 block each) fill the
        # 6 usable blocks; the next step both long ones need a third block: vLLM preempts the
        # last running request for each, p-4 then p-3. p-1 ends two steps later and frees 3.
        scheduler = build_scheduler(
            cls, tiny_model, num_blocks=7, max_num_batched_tokens=512, **kwargs
        )
        for request_id, prompt, tokens in (
            ("p-1", 32, 3),
            ("p-2", 32, 200),
            ("p-3", 4, 200),
            ("p-4", 4, 200),
        ):
            scheduler.add_request(make_request(request_id, prompt, max_tokens=tokens))
        run_step(scheduler)
        scheduler.add_request(make_request("queued", 8))
        if gate is not None:
            gate.throttle = True
        preempted = run_step(scheduler).preempted
        order = waiting_ids(scheduler)
        later = [run_step(scheduler).admitted for _ in range(3)]
        traces[cls] = (preempted, order, later)
    plain, gated = traces[Scheduler], traces[EdgemonScheduler]
    assert plain[:2] == gated[:2] == (["p-3", "p-4"], ["p-3", "p-4", "queued"])
    assert plain[2] == [[], ["queued", "p-3", "p-4"], []], "vLLM re-admits once p-1 is done"
    assert gated[2] == [[], [], []]


def test_streaming_session_input_is_not_held(tiny_model: Path) -> None:
    """A streaming-input session already owns its KV blocks and waits in vLLM's
    `kv_holding_waiting` between input chunks: its next chunk is a continuation, admitted
    while the throttle holds a new request back."""

    def session_chunk(prompt_tokens: int) -> Request:
        return Request(
            request_id="session",
            prompt_token_ids=[9] * prompt_tokens,
            sampling_params=SamplingParams(max_tokens=2),
            pooling_params=None,
            resumable=True,
        )

    gate = FlagGate()
    scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=gate)
    if not hasattr(scheduler, "kv_holding_waiting"):
        pytest.skip("kv_holding_waiting is new in vLLM 0.32")
    scheduler.add_request(session_chunk(10))
    run_step(scheduler)
    run_step(scheduler)  # the first input chunk's turn ends: the session waits for input
    assert [r.request_id for r in scheduler.kv_holding_waiting] == ["session"]
    gate.throttle = True
    scheduler.add_request(make_request("new", 10))
    scheduler.add_request(session_chunk(6))
    step = run_step(scheduler)
    assert step.scheduled == {"session": 6}
    assert waiting_ids(scheduler) == ["new"]
    assert scheduler.edgemon_stats.held_steps == 1


def test_omni_plugin_does_nothing_without_vllm_omni() -> None:
    """In a vLLM without vLLM-Omni, edgemon's general plugin (run by vLLM in every process) is
    a no-op that imports no vLLM-Omni."""
    if find_spec("vllm_omni") is not None:
        pytest.skip("vLLM-Omni is installed here")
    register_omni_pipelines()
    assert "edgemon.integrations.vllm_omni" not in sys.modules
