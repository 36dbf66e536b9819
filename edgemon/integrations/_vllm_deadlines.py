"""The deadline policy (`edgemon.policy.deadlines`) fed from a vLLM V1 scheduler.

`DeadlineDriver` is the part of edgemon's vLLM schedulers that turns what the scheduler sees
into the policy's inputs and the policy's answers into queue operations:

- **Inputs**, as the real scheduler has them: each step's duration (from one ``schedule()``
  to the next, as real-time admission measures it; a step after which nothing runs is not
  timed, since the engine may then idle until the next request) with what it batched
  (decodes and prompt tokens, from its ``SchedulerOutput``); the running requests and their
  prompts, the tokens (one codec frame each) they emitted and their ``max_tokens``, from which
  the policy predicts what each has left (`edgemon.policy.lengths`); the waiting
  queue with each request's ``arrival_time`` (the API server's wall clock, seconds) and
  prompt length; the lengths of requests that finished; and whether edgemon's gate holds
  this step.
- **Answers.** At arrival, a request the policy refuses is ended at once; every step the
  policy's plan says which waiting requests to admit, in its order (vLLM then sees a waiting
  queue of only those), and which to end (their start deadline cannot be met any more).
  Requests are ended through `GatedScheduler.edgemon_end_waiting` (``finish_reason``
  ``abort``, ``stop_reason`` ``edgemon:start_deadline``).
- **Modes** (``EDGEMON_DEADLINES``): ``off`` (the default: the policy only predicts, for the
  capacity object's ``start_wait_ms``; admissions are the gate's and real-time admission's as
  before), ``hold`` (the plan admits: holds end at each request's start deadline; nothing is
  ended) and ``shed`` (the plan admits and ends what cannot start in time).

Pure of vLLM imports: the scheduler passes its requests in.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgemon.policy.deadlines import Deadlines, DeadlineSettings, Running, Throttle, Waiting

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edgemon.environ import EngineEnviron
    from edgemon.policy.deadlines import StepPlan
    from edgemon.policy.realtime import RealtimeAdmission
    from edgemon.policy.values import Mode

__all__ = ["DeadlineDriver", "composition", "deadline_settings"]


def composition(output: Any) -> tuple[int, int] | None:
    """What a vLLM ``SchedulerOutput`` batched: (requests, prompt tokens beyond one per
    request, plus one per new request), or None for a step that scheduled nothing."""
    requests = len(output.num_scheduled_tokens)
    if requests == 0:
        return None
    return requests, output.total_num_scheduled_tokens - requests + len(output.scheduled_new_reqs)


def split_resumed(waiting: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """The waiting requests that have not started (no output yet), and those vLLM preempted
    after they started."""
    fresh: list[Any] = []
    back: list[Any] = []
    for request in waiting:
        (back if request.num_output_tokens else fresh).append(request)
    return fresh, back


def deadline_settings(
    environ: EngineEnviron, *, token_budget: int | None = None
) -> DeadlineSettings:
    """The policy's settings from the engine's variables: the start SLO, the guard, what the
    players' prebuffer adds to a start, the frame, shedding as the mode says; and the
    scheduler's prompt-token budget per step."""
    return DeadlineSettings(
        start_slo_ms=environ.slo_start_ms,
        guard_ms=environ.deadline_guard_ms,
        prebuffer_ms=environ.deadline_prebuffer_ms,
        second_chunk_frames=environ.deadline_second_chunk_frames,
        frame_ms=environ.frame_ms,
        shed=environ.deadlines == "shed",
        token_budget=token_budget,
        estimate_headroom=True,
    )


class DeadlineDriver:
    """The deadline policy of one vLLM scheduler; see the module doc."""

    __slots__ = ("_first_chunk", "_last", "_wall", "mode", "policy")

    def __init__(
        self, policy: Deadlines, mode: Mode, *, wall: Callable[[], float] | None = None
    ) -> None:
        self.policy = policy
        self.mode = mode
        self._wall = wall or time.time
        self._last: tuple[float, int, int] | None = None  # when, decodes, prompt tokens
        self._first_chunk: dict[str, float] = {}  # request -> when its first chunk was out

    @classmethod
    def from_environ(
        cls,
        environ: EngineEnviron,
        admission: RealtimeAdmission | None,
        max_num_seqs: int | None,
        *,
        token_budget: int | None = None,
        wall: Callable[[], float] | None = None,
    ) -> DeadlineDriver:
        """As the engine's variables say (``EDGEMON_DEADLINES``, ``EDGEMON_SLO_START_MS``,
        ``EDGEMON_DEADLINE_*``)."""
        settings = deadline_settings(environ, token_budget=token_budget)
        policy = Deadlines(settings, admission, max_num_seqs=max_num_seqs)
        return cls(policy, environ.deadlines, wall=wall)

    @property
    def plans(self) -> bool:
        """Whether the policy decides admissions (modes ``hold`` and ``shed``)."""
        return self.mode != "off"

    def now_ms(self) -> float:
        """Now on the requests' arrival clock, in ms."""
        return self._wall() * 1000.0

    # ------------------------------------------------------------------ inputs
    def running(self, requests: Iterable[Any]) -> list[Running]:
        """The running requests: their prompts, the frames (tokens) each has emitted and its
        cap (``max_tokens``: a client's generous cap, or vLLM's default), from which the
        policy predicts what each has left (a cap alone predicts nothing); and when each first
        had its first chunk's frames (noted here when first seen so: a step late at most)."""
        first = self.policy.settings.first_chunk_frames
        now = self.now_ms()
        seen, self._first_chunk = self._first_chunk, {}
        shown: list[Running] = []
        for r in requests:
            started = None
            if r.num_output_tokens >= first:
                started = self._first_chunk[r.request_id] = seen.get(r.request_id, now)
            shown.append(
                Running(
                    r.request_id,
                    None,
                    max(0, r.num_prompt_tokens - r.num_computed_tokens),
                    prompt_tokens=r.num_prompt_tokens,
                    emitted_frames=r.num_output_tokens,
                    max_frames=r.max_tokens,
                    first_chunk_ms=started,
                )
            )
        return shown

    @staticmethod
    def waiting(requests: Iterable[Any]) -> list[Waiting]:
        """The waiting requests: arrival (ms on the wall clock) and prompt length."""
        return [
            Waiting(r.request_id, r.arrival_time * 1000.0, r.num_prompt_tokens) for r in requests
        ]

    def stepped(self, output: Any) -> None:
        """A ``schedule()`` produced `output`: the previous step's duration is known now."""
        now = self.now_ms()
        last = self._last
        if last is not None:
            self.policy.observe(last[1], last[2], now - last[0], end_ms=now)
        batched = composition(output)
        self._last = None if batched is None else (now, *batched)

    def idle(self) -> None:
        """Nothing runs any more: the engine may now wait for the next request, and that wait
        is no step, so the step that just ended is not timed by the next ``schedule()``."""
        self._last = None

    def finished(self, requests: Iterable[Any]) -> None:
        """Teach the policy the lengths of `requests` that finished (a step's running ones)."""
        for request in requests:
            if request.is_finished():
                self.policy.finished(request.num_output_tokens, request.num_prompt_tokens)

    # ------------------------------------------------------------------ answers
    def arrive(self, request: Any, running: Iterable[Any], waiting: Iterable[Any]) -> bool:
        """Whether the policy refuses `request` at arrival (`waiting`: those ahead of it)."""
        mine = Waiting(request.request_id, request.arrival_time * 1000.0, request.num_prompt_tokens)
        fresh, back = split_resumed(waiting)
        verdict = self.policy.arrive(
            mine, self.now_ms(), self.running([*running, *back]), self.waiting(fresh)
        )
        return verdict == "shed"

    def plan(self, running: Iterable[Any], waiting: Iterable[Any], *, held: bool) -> StepPlan:
        """This step's admissions and refusals. A waiting request that already produced
        output (vLLM preempted it) started long ago: it is no candidate for a start
        deadline; it is admitted first (`resumed`, as vLLM's own order has it) and holds a
        seat like a running request."""
        fresh, back = split_resumed(waiting)
        plan = self.policy.plan(
            self.now_ms(),
            self.running([*running, *back]),
            self.waiting(fresh),
            Throttle(held=held),
        )
        if not back:
            return plan
        return replace(plan, admit=(*(r.request_id for r in back), *plan.admit))

    def start_wait_ms(self, running: Iterable[Any], waiting: Iterable[Any]) -> float | None:
        """The predicted wait of a new request before its first audio (None while unknown)."""
        fresh, back = split_resumed(waiting)
        figures = self.policy.capacity(self.running([*running, *back]), self.waiting(fresh))
        return figures.start_wait_ms
