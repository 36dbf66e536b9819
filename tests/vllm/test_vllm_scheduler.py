"""EdgemonScheduler on vLLM's real V1 Scheduler, driven step by step with a hand-set gate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", exc_type=ImportError)

from vllm.v1.core.sched.scheduler import Scheduler

from edgemon.integrations.vllm import EdgemonAsyncScheduler, EdgemonScheduler

from admission_cases import *  # noqa: F403 - the shared admission tests run here too
from harness import FlagGate, build_scheduler, make_request, run_step, waiting_ids

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture(params=[EdgemonScheduler, EdgemonAsyncScheduler], ids=lambda cls: cls.__name__)
def flavour(request: pytest.FixtureRequest) -> type[Any]:
    """The scheduler class under test: both flavours."""
    return request.param


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
