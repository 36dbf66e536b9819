"""EdgemonScheduler on vLLM's real V1 Scheduler, driven step by step with a hand-set gate."""

from __future__ import annotations

import re
import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

import vllm
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


#: The vLLM minor series whose scheduler has streaming-input sessions (`kv_holding_waiting`).
SESSIONS_SINCE = (0, 32)


def vllm_minor() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    match = re.match(r"(\d+)\.(\d+)", vllm.__version__)
    assert match is not None, vllm.__version__
    return int(match[1]), int(match[2])


def test_streaming_session_input_is_not_held(tiny_model: Path) -> None:
    """A streaming-input session already owns its KV blocks and waits in vLLM's
    `kv_holding_waiting` between input chunks: its next chunk is a continuation, admitted
    while the throttle holds a new request back. A vLLM from 0.32 on without that queue has
    renamed it: a failure, not a skip (the versions before have no such sessions)."""

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
    if vllm_minor() < SESSIONS_SINCE:
        assert not hasattr(scheduler, "kv_holding_waiting")
        pytest.skip(f"vLLM {vllm.__version__} has no streaming-input sessions")
    assert hasattr(scheduler, "kv_holding_waiting"), (
        f"vLLM {vllm.__version__} has no kv_holding_waiting: renamed under edgemon?"
    )
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


class _DriftingScheduler(Scheduler):  # type: ignore[misc]  # vLLM is untyped for mypy here
    """A vLLM whose queue handling changed under edgemon (the fault the drift guard is for):
    it also admits from the queue it was built with, whatever `waiting` is at the step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.own_queue = self.waiting

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.waiting is not self.own_queue and self.own_queue:
            self.waiting.add_request(self.own_queue.pop_request())
        return super().schedule(*args, **kwargs)


class _DriftingEdgemon(EdgemonScheduler, _DriftingScheduler):
    """edgemon's scheduler on that vLLM."""


def test_the_drift_guard_disables_the_gate(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A held step that admitted a held request anyway: one error in the log, and the gate is
    disabled (the next steps are vLLM's own); the lost request is not lost."""
    gate = FlagGate(throttle=True)
    scheduler = build_scheduler(_DriftingEdgemon, tiny_model, edgemon_gate=gate)
    scheduler.add_request(make_request("held-1", 10))
    scheduler.add_request(make_request("held-2", 10))
    with caplog.at_level("ERROR", logger="edgemon.integrations"):
        assert run_step(scheduler).admitted == ["held-1"]
        assert run_step(scheduler).admitted == ["held-2"]
    assert scheduler.edgemon_stats.disabled
    assert [r.getMessage() for r in caplog.records if "no longer works" in r.getMessage()] == [
        (
            "edgemon: a step that held the waiting requests admitted ['held-1'] anyway: this "
            "vLLM's scheduler no longer works as edgemon's scheduler expects; the gate is disabled "
            "(requests are admitted as vLLM's own scheduler would)"
        )
    ]


def test_a_failure_while_requeueing_loses_no_request(
    tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The held queue's `prepend_requests` fails (an injected fault) in a held step that
    preempted two requests: vLLM sees no exception, the held request and the preempted ones
    are all still waiting (the preempted at the back), and the error is counted and logged."""
    gate = FlagGate()
    scheduler = build_scheduler(
        EdgemonScheduler, tiny_model, num_blocks=7, max_num_batched_tokens=512, edgemon_gate=gate
    )
    for request_id, prompt, tokens in (("p-1", 32, 3), ("p-2", 32, 200), ("p-3", 4, 200),
                                       ("p-4", 4, 200)):  # fmt: skip
        scheduler.add_request(make_request(request_id, prompt, max_tokens=tokens))
    run_step(scheduler)
    scheduler.add_request(make_request("queued", 8))

    class BrokenPrepend(type(scheduler.waiting)):  # type: ignore[misc]
        def prepend_requests(self, requests: Any) -> None:
            raise RuntimeError("injected")

    broken = BrokenPrepend()
    for request in scheduler.waiting:
        broken.add_request(request)
    scheduler.waiting = broken
    gate.throttle = True
    with caplog.at_level("ERROR", logger="edgemon.integrations"):
        step = run_step(scheduler)
    assert step.preempted == ["p-3", "p-4"]
    assert waiting_ids(scheduler) == ["queued", "p-3", "p-4"]
    assert scheduler.edgemon_stats.errors == 1
    assert len([r for r in caplog.records if r.name == "edgemon.integrations"]) == 1


def test_an_error_in_the_gate_admits_as_vllm_would(tiny_model: Path) -> None:
    """A gate that raises: the step admits what waits, as vLLM's own would, and the error is
    counted."""

    class Broken:
        def should_throttle_prefills(self) -> bool:
            raise RuntimeError("gate broken")

    scheduler = build_scheduler(EdgemonScheduler, tiny_model, edgemon_gate=Broken())
    scheduler.add_request(make_request("new", 10))
    assert run_step(scheduler).admitted == ["new"]
    assert scheduler.edgemon_stats.errors == 1
