"""The deadline policy (`edgemon.policy.deadlines`) shown a vLLM scheduler's requests.

`VllmDeadlines` is the part of edgemon's vLLM driver (`edgemon.integrations._driver`) that
turns what the scheduler sees into the policy's inputs and the policy's answers into ids:

- **Inputs**, as the real scheduler has them: the running requests and their prompts, the
  tokens (one codec frame each) they emitted and their ``max_tokens``, from which the policy
  predicts what each has left (`edgemon.policy.lengths`); the waiting queue with each
  request's ``arrival_time`` (the API server's wall clock, seconds) and prompt length; the
  lengths of requests that finished; and whether edgemon's gate holds this step. (The
  steps' durations reach the policy from the driver's step timer.)
- **Answers.** At arrival, whether to refuse a request; every step, the policy's plan: which
  waiting requests to admit, in its order, and which to end (their start deadline cannot be
  met any more); for the capacity object, the predicted start wait.
- **Modes** (``EDGEMON_DEADLINES``): ``off`` (the default: the policy only predicts, for the
  capacity object's ``start_wait_ms``; admissions are the gate's and real-time admission's),
  ``hold`` (the plan admits: holds end at each request's start deadline; nothing is ended)
  and ``shed`` (the plan admits and ends what cannot start in time).

Pure of vLLM imports and clock-free: the driver passes the requests and `now_ms` in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from edgemon.policy.deadlines import Deadlines, DeadlineSettings, Running, Throttle, Waiting

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.environ import EngineEnviron
    from edgemon.policy.deadlines import StepPlan
    from edgemon.policy.realtime import RealtimeAdmission
    from edgemon.policy.values import Mode

__all__ = ["VllmDeadlines", "deadline_settings"]


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


def split_resumed(waiting: Iterable[Any]) -> tuple[list[Any], list[Any]]:
    """The waiting requests that have not started (no output yet), and those vLLM preempted
    after they started."""
    fresh: list[Any] = []
    back: list[Any] = []
    for request in waiting:
        (back if request.num_output_tokens else fresh).append(request)
    return fresh, back


class VllmDeadlines:
    """The deadline policy of one vLLM scheduler; see the module doc."""

    __slots__ = ("_first_chunk", "mode", "policy")

    def __init__(self, policy: Deadlines, mode: Mode) -> None:
        #: The policy (`edgemon.policy.deadlines.Deadlines`): its counts of what it refused.
        self.policy = policy
        #: ``off``, ``hold`` or ``shed``.
        self.mode = mode
        self._first_chunk: dict[str, float] = {}  # request -> when its first chunk was out

    @classmethod
    def from_environ(
        cls,
        environ: EngineEnviron,
        admission: RealtimeAdmission | None,
        max_num_seqs: int | None,
        *,
        token_budget: int | None = None,
    ) -> VllmDeadlines:
        """As the engine's variables say (``EDGEMON_DEADLINES``, ``EDGEMON_SLO_START_MS``,
        ``EDGEMON_DEADLINE_*``), reading `admission`'s real-time limit."""
        settings = deadline_settings(environ, token_budget=token_budget)
        return cls(Deadlines(settings, admission, max_num_seqs=max_num_seqs), environ.deadlines)

    @property
    def plans(self) -> bool:
        """Whether the policy decides admissions (modes ``hold`` and ``shed``)."""
        return self.mode != "off"

    # ------------------------------------------------------------------ inputs
    def running(self, requests: Iterable[Any], now_ms: float) -> list[Running]:
        """The running requests: their prompts, the frames (tokens) each has emitted and its
        cap (``max_tokens``: a client's generous cap, or vLLM's default), from which the
        policy predicts what each has left (a cap alone predicts nothing); and when each
        first had its first chunk's frames (noted here when first seen so, at `now_ms`: a step
        late at most)."""
        first = self.policy.settings.first_chunk_frames
        seen = self._first_chunk
        shown: list[Running] = []
        for r in requests:
            started = None
            if r.num_output_tokens >= first:
                started = seen.setdefault(r.request_id, now_ms)
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

    def finished(self, requests: Iterable[Any]) -> None:
        """Teach the policy the lengths of `requests` that finished (a step's running ones, or
        those vLLM ended), and forget when their first chunk was out."""
        for request in requests:
            if request.is_finished():
                self._first_chunk.pop(request.request_id, None)
                self.policy.finished(request.num_output_tokens, request.num_prompt_tokens)

    # ------------------------------------------------------------------ answers
    def arrive(
        self,
        request: Any,
        now_ms: float,
        running: Iterable[Any],
        waiting: Iterable[Any],
        *,
        apart: frozenset[str] = frozenset(),
    ) -> bool:
        """Whether the policy refuses `request` at arrival (`waiting`: those ahead of it;
        `apart`: running requests that take no part in steps, parked or as good as)."""
        mine = Waiting(request.request_id, request.arrival_time * 1000.0, request.num_prompt_tokens)
        shown, fresh, _ = self._views(now_ms, running, waiting, apart)
        return self.policy.arrive(mine, now_ms, shown, fresh) == "shed"

    def plan(
        self,
        now_ms: float,
        running: Iterable[Any],
        waiting: Iterable[Any],
        *,
        held: bool,
        apart: frozenset[str] = frozenset(),
    ) -> StepPlan:
        """This step's admissions and refusals (`apart`: as for `arrive`). A waiting request
        that already produced output (vLLM preempted it) started long ago: it is no candidate
        for a start deadline; it is admitted first (`resumed`, as vLLM's own order has it) and
        holds a seat like a running request."""
        shown, fresh, back = self._views(now_ms, running, waiting, apart)
        plan = self.policy.plan(now_ms, shown, fresh, Throttle(held=held))
        if not back:
            return plan
        return replace(plan, admit=(*(r.request_id for r in back), *plan.admit))

    def start_wait_ms(
        self, now_ms: float, running: Iterable[Any], waiting: Iterable[Any]
    ) -> float | None:
        """The predicted wait of a new request before its first audio (None while unknown)."""
        shown, fresh, _ = self._views(now_ms, running, waiting)
        return self.policy.capacity(shown, fresh).start_wait_ms

    def _views(
        self,
        now_ms: float,
        running: Iterable[Any],
        waiting: Iterable[Any],
        apart: frozenset[str] = frozenset(),
    ) -> tuple[list[Running], list[Waiting], list[Any]]:
        """What the policy sees: the running requests (less those `apart`) and the preempted
        ones (which hold a seat), the waiting ones that have not started; and the preempted
        vLLM requests."""
        fresh, back = split_resumed(waiting)
        shown = self.running([*running, *back], now_ms)
        if apart:
            shown = [view for view in shown if view.id not in apart]
        return shown, self.waiting(fresh), back
