"""vLLM's real V1 scheduler as a simulated TTS engine: vLLM decides, a step-time model times.

`VllmEngine` has the `Engine` shape of `edgemon.simulate.realtime` (`submit`, `step`,
`waiting`, `running`), so the real-time `Box` drives it exactly as it drives the pure
`TtsEngine`. Each `step()` runs one `schedule()` and one `update_from_output()` through the
vLLM tier's harness (`tests/vllm/harness.py`, which must be importable: the caller puts
`tests/vllm` on `sys.path`), counts the prompt tokens and decodes vLLM batched, and returns the
step with the profile's duration and the audio chunks its sampled tokens (one codec frame
each) complete. `tests/vllm/test_closed_loop_engine.py` checks that it and `TtsEngine` agree
step by step.

With the deadline policy (the scheduler's `edgemon_deadlines`), `submit` returns False for a
request refused at once (by the shedding middleware's judgement, `view`, or by the policy at
arrival) and `refused()` hands out the queued requests the scheduler ended since the last
step: the real-time `Box` counts both as `shed` when it learns of them.

A request vLLM preempts loses its KV and comes back as a re-prefill of prompt and output so
far; its output part is counted as decodes here (the benchmark's KV cache is large enough that
vLLM never preempts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgemon.integrations._vllm_report import SHED_STOP_REASON
from edgemon.policy.announced import next_estimate
from edgemon.policy.deadlines import START_SLO_MS
from edgemon.simulate.engine import Frames, Step

from harness import make_request, run_step

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.shedding.middleware import CapacityView
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.workload import Request


class VllmEngine:
    """vLLM's scheduler as the simulated engine: it decides, the step-time model times it."""

    def __init__(
        self,
        scheduler: Any,
        profile: Profile,
        *,
        step_factor: Callable[[float], float] | None = None,
        origin: list[float] | None = None,
        view: CapacityView | None = None,
        slo_ms: float = START_SLO_MS,
    ) -> None:
        """`step_factor(ms since origin[0])` stretches steps (a scenario's slowdown); `view`
        refuses at arrival what the shedding middleware would (start SLO `slo_ms`)."""
        self.scheduler = scheduler
        self.profile = profile
        self.step_factor = step_factor
        self.origin = origin or [0.0]
        #: When the step being scheduled begins, on the model's timeline (ms): a clock for a
        #: scheduler that times its own steps (real-time admission), free of the driver's
        #: overshoots, as the virtual loop's steps are.
        self.now_ms = 0.0
        self.step_estimate_ms = profile.step.step_ms(0, 1)
        self.view = view
        self.slo_ms = slo_ms
        self._refused: list[str] = []
        self._told: set[str] = set()  # refused at submit: their final output is no news
        self._frames: dict[str, Frames] = {}
        self._prompts: dict[str, int] = {}

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    def submit(self, request: Request) -> bool:
        """Queue `request`; False if it was refused at once: by the shedding middleware's
        judgement (`view`, from the capacity object on the broker) or by the scheduler's
        deadline policy at arrival."""
        view = self.view
        if view is not None and view.judge(self.slo_ms) is not None:
            view.refused()
            return False
        made = make_request(
            request.id,
            request.prompt_tokens,
            max_tokens=request.frames,
            arrival_time=(self.origin[0] + request.arrival_ms) / 1000.0,
        )
        self.scheduler.add_request(made)
        if made.is_finished():
            self._told.add(request.id)
            return False
        self._frames[request.id] = Frames(self.profile, request.id, request.frames)
        self._prompts[request.id] = request.prompt_tokens
        return True

    def refused(self) -> list[str]:
        """The queued requests the scheduler ended since the last call (their start deadline
        could no longer be met)."""
        out, self._refused = self._refused, []
        return out

    def step(self, now_ms: float) -> Step | None:
        self.now_ms = now_ms
        scheduler = self.scheduler
        if not scheduler.has_unfinished_requests():
            return None
        computed = {r.request_id: r.num_computed_tokens for r in scheduler.running}
        held_before = scheduler.edgemon_stats.held_steps
        done = run_step(scheduler)
        held = scheduler.edgemon_stats.held_steps > held_before
        for request_id, (_, reason) in done.reasons.items():
            if reason == SHED_STOP_REASON and request_id not in self._told:
                self._refused.append(request_id)
            self._told.discard(request_id)
        if not done.scheduled:
            return None
        prefill_tokens = decode_seqs = 0
        for request_id, tokens in done.scheduled.items():
            before = computed.get(request_id, 0)
            prompt = self._prompts[request_id]
            if before < prompt:
                prefill_tokens += min(tokens, prompt - before)
            else:
                decode_seqs += 1
        ms = self.profile.step.step_ms(prefill_tokens, decode_seqs)
        if self.step_factor is not None:
            ms *= self.step_factor(now_ms - self.origin[0])
        self.step_estimate_ms = next_estimate(self.step_estimate_ms, ms, decode_seqs)
        end_ms = now_ms + ms
        chunks = []
        for request_id in done.produced:
            chunk = self._frames[request_id].add(end_ms, self.step_estimate_ms)
            if chunk is not None:
                chunks.append(chunk)
        for request_id in done.finished:
            self._frames.pop(request_id, None)
            self._prompts.pop(request_id, None)
        return Step(
            t_ms=now_ms,
            ms=ms,
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            admitted=tuple(done.admitted),
            held=held,
            chunks=tuple(chunks),
            finished=tuple(done.finished),
        )
