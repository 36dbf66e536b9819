"""Deadlines for both kinds of listener: admit, queue or shed, from what a scheduler measures.

Every listener of a TTS box has a deadline. A playing stream must get its next chunk before
its buffer runs dry (edgemon's throttle protects those, and real-time admission keeps the
decode step within a frame). A waiting request must get its first audio before its start SLO
runs out: its **start deadline** is the latest instant it can be admitted and still start in
time,

    deadline = arrival + start_slo − guard − (prefill + first chunk + prebuffer)

where the prefill is its prompt tokens at the measured cost per token, after the prompts
admitted with it or still being prefilled (and a step for each token budget they spill
over); the first chunk is its frames at the measured decode step of the batch it joins (the
sustained batch, or the running one when that is larger); the prebuffer is what the player
buffers after its first audio arrives: a fixed part (`prebuffer_ms`: its cushion and the
delivery to it) and, for a player that waits until its second chunk is due
(`second_chunk_frames`), that chunk at the step the server announces (its recent steps that
decoded, a prefill beside running streams included) beyond the first chunk's audio;
`guard_ms` is kept in hand for what the prediction misses.

`Deadlines` turns that into decisions, each a plain value:

- **At arrival** (`arrive`): `admit` (a seat is free now and the gate does not hold),
  `queue`, or `shed`: refused at once, before any work, when the predicted admission instant
  is past the deadline and the request may not join beyond the sustained batch (an HTTP 503
  with `Retry-After` for a server).
- **Every step** (`plan`): which waiting requests to admit, in order (arrival order, `fcfs`,
  or earliest deadline first, `edf`), and which to shed. The holds are bounded: neither the
  gate (edgemon's throttle) nor real-time admission keeps a request past its deadline. A
  request that cannot otherwise start in time is admitted if that breaks no running stream:
  a seat of the sustained batch is free; or the batch is still below the decode-only
  real-time batch (`burst_limit`), no stream is at risk and recent steps keep up; or, beyond
  that, the spendable headroom of the running streams covers its cost. Else it is shed at
  once, as is a queued request whose predicted admission became late (the box slowed down)
  and one that would start late even if admitted now.
- **For the capacity object** (`capacity`): the real-time streams, running, waiting, the
  predicted wait of a new request before its first audio, and the refusals so far.

**The prediction.** A request waits for a seat of the sustained batch (`limit`: the
`RealtimeAdmission`'s, smaller still when prefills are counted, `amortize`; `max_num_seqs`
while it is unknown). Seats free as running requests finish: each
step decodes one frame of every running request, so a request with `r` frames left frees its
seat in `r` steps; a request admitted from the queue holds its seat for its frames (the mean
of finished requests, learned by `finished`). Seats are handed out in the queue's order, and
steps last the measured decode step at the batch. The caller tells what it knows of running
requests' remaining frames; a scheduler that cannot know them passes what it expects.

**Inputs** are what a real scheduler sees: its measured steps (`observe`; the decode-step
shape and scale come from the `RealtimeAdmission` it already feeds, which `Deadlines` only
reads), finished requests' lengths (`finished`), the running requests with their remaining
frames and prompt tokens still to prefill, the waiting queue with arrival times and prompt
lengths (`arrive` is told of every new request: it learns the prompt length from them), and
edgemon's throttle state (`Throttle`: whether the gate holds, and the spendable headroom
when known). Times are milliseconds on the caller's clock.

**After idling.** A box that has run nothing for `IDLE_PROBE_MS` admits its next request
whatever the prediction, so that a step measures it again. When the box last ran is taken
from the steps (`observe(..., end_ms=)`) and from the running requests the decisions are
shown.

Pure and clock-free: the simulated engine (`edgemon.simulate`) and the vLLM schedulers run
this same code. It imports no engine.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from edgemon.policy.announced import next_estimate
from edgemon.policy.estimates import PlayerEstimates
from edgemon.policy.lengths import LengthModel
from edgemon.policy.values import (
    EXPECTED_FRAMES,
    GAP_SLO_MS,
    GUARD_MS,
    OPEN,
    ORDERS,
    START_SLO_MS,
    CapacityFigures,
    DeadlineSettings,
    Order,
    Running,
    StepPlan,
    Throttle,
    Verdict,
    Waiting,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edgemon.policy.realtime import RealtimeAdmission

__all__ = [
    "EXPECTED_FRAMES",
    "GAP_SLO_MS",
    "GUARD_MS",
    "IDLE_PROBE_MS",
    "LEARN_ALPHA",
    "OPEN",
    "ORDERS",
    "START_SLO_MS",
    "STEP_ALPHA",
    "CapacityFigures",
    "DeadlineSettings",
    "Deadlines",
    "Learned",
    "Order",
    "Running",
    "StepPlan",
    "Throttle",
    "Verdict",
    "Waiting",
]

LEARN_ALPHA = 0.05
"""Weight of the newest observation in the learned prefill cost, prompt and request length,
once 1/`LEARN_ALPHA` have been seen; before that each is the mean of what was seen (the
prior, from the settings, stands only until the first)."""
IDLE_PROBE_MS = 30_000.0
"""How long a box must have run nothing before its next request is admitted whatever the
prediction (`Deadlines.arrive`): long enough that a loaded box's decisions never change (the
virtual sweeps are identical with 30 s; with 3 s, `cpu-vllm` lost 1–2 points of goodput to
requests admitted late), short enough to measure again within half a minute."""
OVER_LIMIT = 1
"""How many requests may run beyond the sustained batch on the running streams' headroom (a
request at its deadline, no seat free): more, and in overload every stream pays for them."""
STEP_ALPHA = 0.2
"""Weight of the newest step in the fallback step estimate (used while the shape is unknown)."""


class Deadlines:
    """The deadline policy of one scheduler; see the module doc.

    `admission`: the scheduler's `RealtimeAdmission` (read only: its owner feeds it), or None
    (no real-time limit: `max_num_seqs` bounds the batch). `max_num_seqs`: the engine's own
    bound on running requests, if any.
    """

    __slots__ = (
        "_busy_ms",
        "_players",
        "_prefill_ms_per_token",
        "_prompt_tokens",
        "_recent_ms",
        "_step_ms",
        "admission",
        "lengths",
        "max_num_seqs",
        "settings",
        "shed_at_arrival",
        "shed_queued",
    )

    def __init__(
        self,
        settings: DeadlineSettings | None = None,
        admission: RealtimeAdmission | None = None,
        *,
        max_num_seqs: int | None = None,
    ) -> None:
        self.settings = DeadlineSettings() if settings is None else settings
        self.admission = admission
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be ≥ 1, not {max_num_seqs}")
        self.max_num_seqs = max_num_seqs
        #: Request lengths, learned from finished requests' prompts and frames.
        self.lengths = LengthModel(self.settings.expected_frames)
        settings = self.settings
        self._players = PlayerEstimates(
            settings.first_chunk_frames,
            settings.second_chunk_frames,
            settings.prebuffer_ms,
            settings.frame_ms,
        )
        self._prefill_ms_per_token = Learned(self.settings.prefill_ms_per_token)
        self._prompt_tokens = Learned(0.0)
        self._step_ms: float | None = None
        self._recent_ms: float | None = None
        self._busy_ms: float | None = None  # when the box last ran: a step's end, or a
        # decision that saw a running request (for callers that do not tell `end_ms`)
        #: Requests refused at arrival, and queued requests refused since.
        self.shed_at_arrival = 0
        self.shed_queued = 0

    # ------------------------------------------------------------------ learning

    def observe(
        self, decodes: int, prefill_tokens: int, ms: float, *, end_ms: float | None = None
    ) -> None:
        """A step ran `decodes` decoding sequences and `prefill_tokens` prompt tokens in `ms`
        (ending at `end_ms` on the caller's clock, when the caller tells).

        Teaches the prefill cost per token (what a step with prompt tokens took beyond its
        decodes' predicted share), the recent duration of steps that decoded (what a server's
        `eta_ms` hints announce, on which a player's prebuffer depends: a prefill on an idle
        box is no step to a player), a fallback decode-step estimate, and when the box last
        ran something. The real-time admission is not fed here: its owner does that.
        """
        if not (math.isfinite(ms) and ms > 0) or (decodes <= 0 and prefill_tokens <= 0):
            return
        if end_ms is not None and (self._busy_ms is None or end_ms > self._busy_ms):
            self._busy_ms = end_ms
        self._recent_ms = next_estimate(self._recent_ms, ms, decodes)
        if prefill_tokens <= 0:
            previous = self._step_ms
            self._step_ms = ms if previous is None else previous + STEP_ALPHA * (ms - previous)
            return
        decode_ms = self._decode_ms(decodes) if decodes > 0 else self._base_ms()
        if decode_ms is None:
            return
        self._prefill_ms_per_token.learn(max(0.0, ms - decode_ms) / prefill_tokens)

    def finished(self, frames: int, prompt_tokens: int) -> None:
        """A request of `prompt_tokens` finished after `frames` frames (teaches the request
        lengths, `lengths`)."""
        self.lengths.learn(prompt_tokens, frames)

    @property
    def expected_frames(self) -> float:
        """The frames a request of the usual prompt is expected to take (learned from
        finished ones)."""
        prompt = self._prompt_tokens
        return self.lengths.expected(round(prompt.value) if prompt.seen else 1)

    def remaining(self, request: Running) -> float:
        """The frames `request` has left: as the caller knows them, else as predicted from its
        prompt, the frames it emitted and its cap (`lengths`)."""
        if request.remaining_frames is not None:
            return request.remaining_frames
        return self.lengths.remaining(
            request.prompt_tokens, request.emitted_frames, request.max_frames
        )

    def expected(self, request: Waiting) -> float:
        """The frames a waiting request will take: as the caller knows them, else predicted."""
        if request.frames is not None:
            return request.frames
        return self.lengths.expected(request.prompt_tokens)

    @property
    def prefill_ms_per_token(self) -> float:
        """A prompt token's prefill cost (learned from steps with prompt tokens)."""
        return self._prefill_ms_per_token.value

    @property
    def shed_total(self) -> int:
        """Every refusal so far, at arrival and queued."""
        return self.shed_at_arrival + self.shed_queued

    # ------------------------------------------------------------------ what is measured

    @property
    def limit(self) -> int | None:
        """The real-time batch bounded by `max_num_seqs` (None: no bound known); with
        `amortize`, the batch whose steps, prefills spread over requests' frames included,
        average at most the admission's allowed step."""
        admission = self.admission
        limit = None if admission is None else admission.limit
        if limit is not None and self.settings.amortize:
            limit = min(limit, self._amortized(limit))
        cap = self.max_num_seqs
        if limit is None:
            return cap
        return limit if cap is None else min(limit, cap)

    @property
    def burst_limit(self) -> int | None:
        """The decode-only real-time batch bounded by `max_num_seqs`: how far a request that
        cannot otherwise start in time may be admitted beyond `limit` while no stream is at
        risk (its decode step still fits; only the prefills' share is borrowed)."""
        admission = self.admission
        burst = None if admission is None else admission.limit
        cap = self.max_num_seqs
        if burst is None:
            return cap
        return burst if cap is None else min(burst, cap)

    def _amortized(self, limit: int) -> int:
        """The largest n ≥ 1 with scale·(a + b·n) + n · prefill / frames ≤ the allowed step."""
        admission = self.admission
        shape = None if admission is None else admission.shape()
        prompt = self._prompt_tokens
        if admission is None or shape is None or not prompt.seen:
            return limit
        a, b = shape
        share = self.prefill_ms(round(prompt.value)) / self.expected_frames
        per_request = admission.scale * b + share
        if per_request <= 0:
            return limit
        n = (admission.frame_ms - admission.scale * a) / per_request
        return max(1, math.floor(n)) if math.isfinite(n) else limit

    def _decode_ms(self, batch: int) -> float | None:
        """The measured decode step of `batch` sequences (None while unknown)."""
        admission = self.admission
        shape = None if admission is None else admission.shape()
        if admission is None or shape is None:
            return self._step_ms
        return admission.scale * (shape[0] + shape[1] * max(1, batch))

    def _base_ms(self) -> float | None:
        admission = self.admission
        shape = None if admission is None else admission.shape()
        if admission is None or shape is None:
            return None
        return admission.scale * shape[0]

    def step_ms(self, batch: int) -> float:
        """The decode step of `batch` sequences, as measured (a frame while nothing is)."""
        measured = self._decode_ms(batch)
        return self.settings.frame_ms if measured is None else measured

    def prefill_ms(self, prompt_tokens: int) -> float:
        """What a prompt of `prompt_tokens` adds to the step that prefills it."""
        return self.prefill_ms_per_token * max(0, prompt_tokens)

    def needs_ms(
        self, request: Waiting, batch: int, ahead_tokens: int = 0, *, alone: bool = False
    ) -> float:
        """What a request's start still needs once admitted into a batch of `batch`: its
        prefill (after `ahead_tokens` of prompts admitted with it, ahead of it, and the steps
        the token budget spreads them over), its first chunk's frames, the player's
        prebuffer (`alone`: no stream decodes while it is prefilled)."""
        settings = self.settings
        step = self.step_ms(batch)
        tokens = max(0, ahead_tokens) + max(0, request.prompt_tokens)
        budget = settings.token_budget
        spill = 0 if budget is None else max(0, math.ceil(tokens / budget) - 1)
        first_audio = settings.first_chunk_frames * settings.frame_ms
        prefill_steps = 0 if alone else spill + 1
        announced = self._announced_ms(step, self.prefill_ms(tokens), prefill_steps)
        waits = max(0.0, settings.second_chunk_frames * announced - first_audio)
        return (
            self.prefill_ms(tokens)
            + spill * step
            + settings.first_chunk_frames * step
            + waits
            + settings.prebuffer_ms
        )

    def _announced_ms(self, step: float, prefill: float, prefill_steps: int) -> float:
        """The step estimate a server announces when the first chunk is out
        (`edgemon.policy.announced`): the recent steps that decoded, then
        `prefill_steps` steps sharing `prefill` (none when no stream decodes in them: a
        player times its steps by its tokens), then the first chunk's decode steps."""
        estimate = step if self._recent_ms is None else self._recent_ms
        with_prefill = step + prefill / max(1, prefill_steps)
        for _ in range(prefill_steps):
            estimate = next_estimate(estimate, with_prefill, 1)
        for _ in range(self.settings.first_chunk_frames - 1):
            estimate = next_estimate(estimate, step, 1)
        return max(step, estimate)

    def deadline_ms(
        self,
        request: Waiting,
        batch: int | None = None,
        ahead_tokens: int = 0,
        *,
        alone: bool = False,
    ) -> float:
        """The latest instant `request` can be admitted and still start within the SLO
        (`batch`: the batch it joins, default the real-time batch; `ahead_tokens`: prompts
        admitted with it, ahead of it; `alone`: no stream decodes while it is prefilled)."""
        settings = self.settings
        size = self._batch(batch)
        return (
            request.arrival_ms
            + settings.start_slo_ms
            - settings.guard_ms
            - self.needs_ms(request, size, ahead_tokens, alone=alone)
        )

    def _batch(self, batch: int | None) -> int:
        if batch is not None:
            return batch
        limit = self.limit
        return 1 if limit is None else limit

    # ------------------------------------------------------------------ prediction

    def admission_steps(self, running: Sequence[Running], queue: Sequence[Waiting]) -> list[int]:
        """For each request of `queue`, in its order, the decode steps from now until a
        real-time seat is free for it (0: now)."""
        limit = self.limit
        if limit is None:
            return [0] * len(queue)
        finishes = [max(0, math.ceil(self.remaining(r))) for r in running]
        heapq.heapify(finishes)
        free = limit - len(running)
        now = 0
        out: list[int] = []
        for request in queue:
            while free <= 0 and finishes:
                now = max(now, heapq.heappop(finishes))
                free += 1
            free -= 1
            out.append(now)
            # Its prefill step, then its frames.
            heapq.heappush(finishes, now + max(1, math.ceil(self.expected(request))) + 1)
        return out

    def _ordered(self, waiting: Sequence[Waiting], batch: int) -> list[Waiting]:
        if self.settings.order == "fcfs":
            return list(waiting)
        return sorted(waiting, key=lambda w: (self.deadline_ms(w, batch), w.arrival_ms))

    def _joined(self, running: int) -> int:
        """The batch a request joins: the real-time batch, or the running one if larger."""
        limit = self.limit
        return max(running, limit or 1)

    def _wait_step_ms(self, running: int) -> float:
        """The step duration the queue waits on: the batch as it is, at least the limit."""
        return self.step_ms(self._joined(running))

    # ------------------------------------------------------------------ decisions

    def arrive(
        self,
        request: Waiting,
        now_ms: float,
        running: Sequence[Running],
        waiting: Sequence[Waiting],
        throttle: Throttle = OPEN,
    ) -> Verdict:
        """What to do with `request`, arriving at `now_ms` (not yet in `waiting`).

        `shed` (counted in `shed_total`) when its predicted admission is past its deadline
        and shedding is on; `admit` when a seat is free now, nothing waits ahead of it and
        the gate does not hold; `queue` otherwise.

        A box that has run nothing for `IDLE_PROBE_MS` (and does not hold) admits its next
        request whatever the prediction: its figures are from another moment, refusing
        spares no other listener, and the request's steps are how the policy learns the box's
        present speed. A policy that refused every arrival on figures a slower moment left
        behind (a co-tenant that went away while the box was idle) would never measure again.
        """
        self._prompt_tokens.learn(request.prompt_tokens)
        self._saw(now_ms, running)
        self._see(running)
        if self._probes(now_ms, running, throttle) and not waiting:
            return "admit"
        batch = self._joined(len(running))
        queue = self._ordered([*waiting, request], batch)
        position = next(i for i, w in enumerate(queue) if w is request)
        predicted = self.admission_steps(running, queue)
        steps = predicted[position]
        ahead = _prefilling(running) + sum(
            w.prompt_tokens for w, n in zip(queue[:position], predicted, strict=False) if n == steps
        )
        admit_at = now_ms + steps * self.step_ms(batch)
        late = admit_at > self.deadline_ms(request, batch, ahead, alone=not running)
        if late and self._may_burst(len(running) + position, throttle):
            return "queue"  # the next step admits it beyond the sustained batch
        if late and self._affordable(request, len(running) + position, running, throttle, now_ms):
            return "queue"  # its deadline admits it beyond the batch, on the streams' headroom
        if self.settings.shed and self.settings.shed_at_arrival and late:
            self.shed_at_arrival += 1
            return "shed"
        if steps == 0 and position == 0 and not waiting and not throttle.held:
            return "admit"
        return "queue"

    def plan(
        self,
        now_ms: float,
        running: Sequence[Running],
        waiting: Sequence[Waiting],
        throttle: Throttle = OPEN,
    ) -> StepPlan:
        """This step's admissions (in order) and refusals (counted in `shed_total`).

        In order: on a box idle for `IDLE_PROBE_MS` the first request is admitted whatever
        the prediction, as at arrival; a request that would start late even if admitted now
        (past its deadline by more than the guard) is shed; a request gets a free seat
        unless the gate holds; the gate's hold ends at the request's deadline. A request
        past its deadline with no seat is admitted beyond the real-time batch only if the
        running streams' spendable headroom covers its cost, else it is shed (queued, when
        shedding is off). A request whose predicted admission is past its deadline is shed
        now.
        """
        joined = self._joined(len(running))
        queue = self._ordered(waiting, joined)
        if not queue:
            return StepPlan()
        limit = self.limit
        seats = len(queue) if limit is None else limit - len(running)
        step_ms = self.step_ms(joined)
        predicted = self.admission_steps(running, queue)
        self._see(running)
        headroom = self._headroom(now_ms, running, throttle)
        batch = len(running)
        admit: list[str] = []
        shed: list[str] = []
        ahead = _prefilling(running)  # prompt tokens to prefill ahead of the next admission
        self._saw(now_ms, running)
        probe = self._probes(now_ms, running, throttle)  # then the first takes a free seat
        sheds = self.settings.shed and self.settings.shed_queued
        for request, steps in zip(queue, predicted, strict=True):
            deadline = self.deadline_ms(request, joined, ahead, alone=not running)
            due = now_ms >= deadline
            late = sheds and now_ms > deadline + self.settings.guard_ms
            if late and not (probe and not admit):
                shed.append(request.id)  # late even if admitted now: it frees its seat
                continue
            if seats > 0 and (not throttle.held or due):
                admit.append(request.id)
                seats -= 1
                batch += 1
                ahead += request.prompt_tokens
                continue
            infeasible = now_ms + steps * step_ms > deadline
            if (due or infeasible) and seats <= 0 and self._may_burst(batch, throttle):
                admit.append(request.id)
                batch += 1
                ahead += request.prompt_tokens
                continue
            if due and seats <= 0 and limit is not None and batch < limit + OVER_LIMIT:
                cost = self._over_limit_cost(request, batch, running)
                if headroom is not None and not throttle.held and headroom >= cost:
                    admit.append(request.id)
                    headroom -= cost
                    batch += 1
                    ahead += request.prompt_tokens
                    continue
            if due and sheds:
                shed.append(request.id)
            elif (
                infeasible
                and sheds
                and not self._affordable(request, batch, running, throttle, now_ms)
            ):
                shed.append(request.id)  # no seat in time, nor headroom to wait for
        self.shed_queued += len(shed)
        return StepPlan(admit=tuple(admit), shed=tuple(shed))

    def _saw(self, now_ms: float, running: Sequence[Running]) -> None:
        """Note when a request was last seen running."""
        if running:
            self._busy_ms = now_ms

    def _probes(self, now_ms: float, running: Sequence[Running], throttle: Throttle) -> bool:
        """Whether the box has been idle for `IDLE_PROBE_MS` (no hold): its figures are then
        from another moment, and its next request is admitted to measure it again."""
        busy = self._busy_ms
        idle = not running and (busy is None or now_ms - busy >= IDLE_PROBE_MS)
        return idle and not throttle.held

    def _may_burst(self, batch: int, throttle: Throttle) -> bool:
        """Whether one more request may join a batch of `batch` beyond the sustained one:
        within `burst_limit`, no hold, no stream at risk (spendable headroom not below 0
        when known), and the box keeping up lately (its recent steps that decoded, prefills
        beside them included, average within the admission's allowed step)."""
        burst = self.burst_limit
        if burst is None or batch >= burst or throttle.held:
            return False
        if throttle.headroom_ms is not None and throttle.headroom_ms < 0:
            return False
        admission, recent = self.admission, self._recent_ms
        return admission is None or recent is None or recent <= admission.frame_ms

    def _see(self, running: Sequence[Running]) -> None:
        """Show the player estimates the running streams, with the step announced now."""
        if self.settings.estimate_headroom:
            recent = self._recent_ms
            self._players.see(running, self.step_ms(len(running)) if recent is None else recent)

    def _headroom(
        self, now_ms: float, running: Sequence[Running], throttle: Throttle
    ) -> float | None:
        """The running streams' spendable headroom: edgemon's, from its throttle object, when
        known; else, with `estimate_headroom`, the server's estimate (`estimated_headroom_ms`)."""
        if not self.settings.estimate_headroom:
            return throttle.headroom_ms
        return self.estimated_headroom_ms(now_ms, running)

    def estimated_headroom_ms(self, now_ms: float, running: Sequence[Running]) -> float | None:
        """The running streams' spendable headroom as the server can estimate it: the least
        audio a player holds (`edgemon.policy.estimates`) less a frame kept in hand
        (None while no stream has sent a chunk)."""
        least = self._players.least_held_ms(now_ms, running)
        return None if least is None else least - self.settings.frame_ms

    def _affordable(
        self,
        request: Waiting,
        batch: int,
        running: Sequence[Running],
        throttle: Throttle,
        now_ms: float,
    ) -> bool:
        """Whether the running streams' headroom now covers admitting `request` beyond the
        real-time batch (`batch` ahead of it), as `plan` does at its deadline."""
        limit = self.limit
        if limit is None or batch >= limit + OVER_LIMIT or throttle.held:
            return False
        if not self.settings.estimate_headroom:
            return False
        headroom = self._headroom(now_ms, running, throttle)
        return headroom is not None and headroom >= self._over_limit_cost(request, batch, running)

    def _over_limit_cost(self, request: Waiting, batch: int, running: Sequence[Running]) -> float:
        """What one more request beyond the real-time batch costs each running stream's
        headroom: its prefill, then every step's overrun of a frame until a seat frees."""
        overrun = max(0.0, self.step_ms(batch + 1) - self.settings.frame_ms)
        soonest = min((self.remaining(r) for r in running), default=0.0)
        return self.prefill_ms(request.prompt_tokens) + overrun * soonest

    def capacity(self, running: Sequence[Running], waiting: Sequence[Waiting]) -> CapacityFigures:
        """The capacity object's figures now."""
        prompt = self._prompt_tokens
        usual = Waiting("", 0.0, round(prompt.value) if prompt.seen else 1)
        steps = self.admission_steps(running, [*waiting, usual])[-1]
        measured = self._decode_ms(self._batch(None)) is not None
        wait = None
        if measured:
            wait = steps * self._wait_step_ms(
                len(running)
            ) + self.settings.first_chunk_frames * self.step_ms(self._batch(None))
        return CapacityFigures(
            realtime_streams=None if self.admission is None else self.admission.limit,
            running=len(running),
            waiting=len(waiting),
            start_wait_ms=wait,
            shed_total=self.shed_total,
        )


class Learned:
    """A learned figure: the mean of what was seen, until 1/`LEARN_ALPHA` have been, then an
    EWMA of weight `LEARN_ALPHA`. `prior` stands until the first observation, so a new server
    uses its first measured prefill at once rather than creeping up from a guess of 0."""

    __slots__ = ("seen", "value")

    def __init__(self, prior: float) -> None:
        self.value = prior
        self.seen = 0

    def learn(self, observed: float) -> None:
        """Take one observation into the figure."""
        self.seen += 1
        self.value += max(LEARN_ALPHA, 1.0 / self.seen) * (observed - self.value)


def _prefilling(running: Sequence[Running]) -> int:
    """Prompt tokens the running requests still have to prefill."""
    return sum(max(0, r.prefill_tokens) for r in running)
