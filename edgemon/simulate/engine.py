"""A simulated TTS engine: a vLLM-like scheduler loop whose steps take what a profile says.

Pure and clock-injected: `step(now_ms)` plans one scheduler step at `now_ms` and returns what
it does (its duration from the profile's step-time model, the prefill tokens and decodes it
batches, the requests it admitted, the audio chunks that are complete when it ends). The
caller owns time: a virtual clock in tests, `asyncio.sleep(step.ms)` in the demo.

The scheduling follows vLLM V1's shape, reduced to what decides step times:

- running requests go first: a decode costs one token of the step's budget
  (`max_num_batched_tokens`) and emits one codec frame; a prefill under way (chunked prefill)
  takes as many prompt tokens as the budget still allows;
- then, unless the gate says throttle, waiting requests are admitted in arrival order while
  there is budget and a free sequence slot (`max_num_seqs`); an admitted request starts its
  prefill in the same step;
- the step that finishes a prompt also emits the request's first frame (the first sampled
  token); every later step of it emits one frame;
- frames become audio chunks as vLLM-Omni's Qwen3-TTS streaming cuts them, by the profile's
  `chunk_schedule` (a short first chunk, then 2-second chunks, or a ramp; the last size
  repeats), the rest as the final chunk.

The gate is a callable consulted at every step that has requests waiting; while it returns
True the step admits nothing (running work continues), as `EdgemonScheduler` does with
`ThrottleGate.should_throttle_prefills`; `admitted`, when given, is told of every step that
was not held and admitted a request or had none waiting (`ThrottleGate.admitted`, which ends
a `max_hold_ms` release). `seats`, if given, bounds the running set further at each step
(real-time admission: how many requests may run now); `fits`, if given, is asked about the
head of the queue before each admission (budget-aware admission); `max_num_seqs` replaces
the profile's (a static cap); `step_factor(now_ms)` stretches every step (a box that slows
down). A step with nothing to run returns None: the caller waits for the next arrival, or a
short poll when everything is held (no busy spinning).

`deadlines`, if given (a `DeadlineHook`: the policy of `edgemon.policy.deadlines` and
edgemon's throttle state), takes over admissions: at `submit` it may refuse a request that
cannot start within its SLO (`submit` returns False: shed at arrival), and at each step it
chooses which waiting requests to admit, in its order, and which to shed (`refused()` hands
those out); seats and `fits` are then not asked (the policy applies the real-time limit
itself, and the gate's answer bounded by each request's deadline). The token budget and
`max_num_seqs` still bound a step.

Each chunk carries an `eta_ms` hint: the frames until the next chunk times the engine's
running estimate of its step time (an EWMA). A server could send this along with the audio;
the players pass it on to the Reporter (docs/protocol.md `eta_ms`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.policy.announced import next_estimate
from edgemon.policy.deadlines import OPEN, Running, Throttle, Waiting
from edgemon.simulate.estimated import Stream
from edgemon.simulate.serving import OPEN_SERVING, Serving

if TYPE_CHECKING:
    from collections.abc import Callable

    from edgemon.policy.deadlines import Deadlines
    from edgemon.simulate.estimated import Pacing
    from edgemon.simulate.profiles import Profile
    from edgemon.simulate.workload import Request


@dataclass(frozen=True, slots=True)
class Chunk:
    """An audio chunk of a request, complete at `t_ms` (the end of the step that made it)."""

    request: str
    seq: int
    frames: int
    audio_ms: float
    final: bool
    t_ms: float
    eta_ms: float | None
    """Expected time until the next chunk (None on the final chunk)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One scheduler step that starts at `t_ms` and lasts `ms`."""

    t_ms: float
    ms: float
    prefill_tokens: int
    decode_seqs: int
    admitted: tuple[str, ...]
    held: bool
    """The gate said throttle while requests were waiting: none was admitted."""
    chunks: tuple[Chunk, ...]
    finished: tuple[str, ...]

    @property
    def end_ms(self) -> float:
        """When the step ends and its chunks are complete."""
        return self.t_ms + self.ms


@dataclass(frozen=True, slots=True)
class DeadlineHook:
    """The deadline policy an engine consults, and edgemon's throttle state as it sees it
    (read without side effects; the gate's own answer is asked once per step)."""

    policy: Deadlines
    throttle: Callable[[], Throttle] = lambda: OPEN


class Frames:
    """Counts one request's codec frames and cuts them into audio chunks as they come."""

    __slots__ = ("chunks", "emitted", "first_ms", "pending", "profile", "request", "total")

    def __init__(self, profile: Profile, request: str, total: int) -> None:
        self.profile = profile
        self.request = request
        self.total = total
        self.emitted = 0
        self.pending = 0
        self.chunks = 0
        #: When its first chunk was complete (None: not yet).
        self.first_ms: float | None = None

    @property
    def sent(self) -> int:
        """Frames in complete chunks."""
        return self.emitted - self.pending

    @property
    def next_frames(self) -> int:
        """Frames the next chunk still needs (the final one may need fewer)."""
        size = self.profile.chunk_size(self.chunks) - self.pending
        return max(0, min(size, self.total - self.emitted))

    @property
    def done(self) -> bool:
        """Every frame of the request was emitted."""
        return self.emitted >= self.total

    def add(self, end_ms: float, step_estimate_ms: float) -> Chunk | None:
        """Count one frame made by a step ending at `end_ms`; the chunk it completes, if any."""
        profile = self.profile
        self.emitted += 1
        self.pending += 1
        final = self.emitted >= self.total
        if not final and self.pending < profile.chunk_size(self.chunks):
            return None
        frames, self.pending = self.pending, 0
        if self.first_ms is None:
            self.first_ms = end_ms
        seq = self.chunks
        self.chunks += 1
        eta = None
        if not final:
            eta = min(profile.chunk_size(self.chunks), self.total - self.emitted) * step_estimate_ms
        return Chunk(
            request=self.request,
            seq=seq,
            frames=frames,
            audio_ms=frames * profile.frame_ms,
            final=final,
            t_ms=end_ms,
            eta_ms=eta,
        )


class _Running:
    """A request in the running set: its prefill progress and its frames (it ends at its
    end-of-speech, or at its client's cap if that comes first)."""

    __slots__ = ("frames", "prefilled", "request")

    def __init__(self, request: Request, profile: Profile) -> None:
        self.request = request
        self.prefilled = 0
        cap = request.max_frames
        total = request.frames if cap is None else min(request.frames, cap)
        self.frames = Frames(profile, request.id, total)


class TtsEngine:
    """The simulated engine of one box; see the module docstring."""

    __slots__ = (
        "_admitted",
        "_budget",
        "_deadlines",
        "_fits",
        "_gate",
        "_held",
        "_lengths_known",
        "_pacing",
        "_refused",
        "_running",
        "_seats",
        "_serving",
        "_step_factor",
        "_waiting",
        "max_num_seqs",
        "parked_steps",
        "profile",
        "step_estimate_ms",
    )

    def __init__(  # noqa: PLR0913 - keyword-only parts, each a policy's
        self,
        profile: Profile,
        *,
        gate: Callable[[], bool] | None = None,
        max_num_seqs: int | None = None,
        seats: Callable[[int], int | None] | None = None,
        step_factor: Callable[[float], float] | None = None,
        admitted: Callable[[], None] | None = None,
        fits: Callable[[Request, int], bool] | None = None,
        deadlines: DeadlineHook | None = None,
        lengths_known: bool = False,
        serving: Serving = OPEN_SERVING,
        pacing: Pacing | None = None,
    ) -> None:
        self.profile = profile
        #: vLLM's other flags: the API server's admission limits, the token budget, the
        #: long-prefill threshold.
        self._serving = serving
        self._budget = serving.max_num_batched_tokens or profile.max_num_batched_tokens
        #: The peers' pacing by estimated buffers (`edgemon.simulate.estimated`), if any, and
        #: the running streams it holds out of the current step.
        self._pacing = pacing
        self._held: frozenset[str] = frozenset()
        #: The deadline policy is shown each request's length (an oracle no server has);
        #: False: it sees the prompt, the frames emitted and the client's cap, as vLLM does.
        self._lengths_known = lengths_known
        self._gate = gate
        self.max_num_seqs = profile.max_num_seqs if max_num_seqs is None else max_num_seqs
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be ≥ 1, not {self.max_num_seqs}")
        self._seats = seats
        self._step_factor = step_factor
        #: Told after a step that was not held and admitted a request or had none waiting
        #: (`ThrottleGate.admitted`: it ends a `max_hold_ms` release).
        self._admitted = admitted
        #: Asked before each admission with the request and the running count: whether it
        #: fits (budget-aware admission); a refusal ends the step's admissions (FCFS).
        self._fits = fits
        self._deadlines = deadlines
        self._refused: list[str] = []
        self._waiting: deque[Request] = deque()
        self._running: list[_Running] = []
        #: The engine's running estimate of a step's duration (for the `eta_ms` hints).
        self.step_estimate_ms = profile.step.step_ms(0, 1)
        #: Steps running streams sat out, summed over the streams (the pacing's parking).
        self.parked_steps = 0

    @property
    def waiting(self) -> int:
        """Requests not yet admitted."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests admitted and not finished."""
        return len(self._running)

    def submit(self, request: Request, now_ms: float | None = None) -> bool:
        """Queue a request (it waits for admission); False if vLLM's admission limits or the
        deadline policy refused it (at `now_ms`, default its arrival)."""
        serving = self._serving
        if serving.limits_arrivals and serving.refuses(
            len(self._running) + len(self._waiting), self._backlog_tokens()
        ):
            return False
        hook = self._deadlines
        if hook is not None:
            now = request.arrival_ms if now_ms is None else now_ms
            verdict = hook.policy.arrive(
                self._waiting_view(request),
                now,
                self._running_views(now),
                self._waiting_views(),
                hook.throttle(),
            )
            if verdict == "shed":
                return False
        self._waiting.append(request)
        return True

    def _backlog_tokens(self) -> int:
        """The whole prompt of every request that has not produced its first frame yet."""
        waiting = sum(request.prompt_tokens for request in self._waiting)
        return waiting + sum(r.request.prompt_tokens for r in self._running if not r.frames.emitted)

    def _occupied(self) -> int:
        """Batch rows taken: running requests, less those the pacing parked."""
        pacing = self._pacing
        held = len(self._held) if pacing is not None and pacing.frees_seats else 0
        return len(self._running) - held

    def _running_views(self, now_ms: float) -> list[Running]:
        """The deadline policy's view of the running requests that take part in steps (a
        stream the pacing parked, freeing its row, does not; nor one edgemon's parking could
        park now)."""
        known = self._lengths_known
        pacing = self._pacing
        parked: frozenset[str] = frozenset()
        if pacing is not None and pacing.frees_seats:
            parked = self._held | pacing.spare(now_ms, self._streams())
        return [
            Running(
                r.request.id,
                r.frames.total - r.frames.emitted if known else None,
                r.request.prompt_tokens - r.prefilled,
                prompt_tokens=r.request.prompt_tokens,
                emitted_frames=r.frames.emitted,
                max_frames=r.request.max_frames,
                first_chunk_ms=r.frames.first_ms,
            )
            for r in self._running
            if r.request.id not in parked
        ]

    def _waiting_view(self, request: Request) -> Waiting:
        """The deadline policy's view of a waiting request."""
        frames = request.frames if self._lengths_known else None
        return Waiting(request.id, request.arrival_ms, request.prompt_tokens, frames)

    def _waiting_views(self) -> list[Waiting]:
        return [self._waiting_view(request) for request in self._waiting]

    def refused(self) -> list[str]:
        """The waiting requests the deadline policy refused since the last call."""
        out, self._refused = self._refused, []
        return out

    def _plan(self, now_ms: float, held: bool) -> list[Request]:
        """The deadline policy's admissions (in order); the refused leave the queue."""
        hook = self._deadlines
        assert hook is not None
        headroom = hook.throttle().headroom_ms
        plan = hook.policy.plan(
            now_ms,
            self._running_views(now_ms),
            self._waiting_views(),
            Throttle(held=held, headroom_ms=headroom),
        )
        by_id = {request.id: request for request in self._waiting}
        gone = set(plan.shed)
        if gone:
            self._waiting = deque(r for r in self._waiting if r.id not in gone)
            self._refused.extend(plan.shed)
        return [by_id[i] for i in plan.admit]

    def _report(self, admitted: list[str]) -> None:
        """After a step that was not held: tell `admitted` if it admitted or none waits."""
        if self._admitted is not None and (admitted or not self._waiting):
            self._admitted()

    def _seats_now(self) -> int:
        """How many requests may be running after this step's admissions."""
        seats = self.max_num_seqs
        if self._waiting and self._seats is not None:
            more = self._seats(len(self._running))
            if more is not None:
                seats = min(seats, len(self._running) + more)
        return seats

    def _admit(self, budget: int, framed: list[_Running], admitted: list[str]) -> int:
        """Admit waiting requests in order within the token `budget` and the seats; the
        prompt tokens they take this step (`framed` and `admitted` are appended to)."""
        seats = self._seats_now()
        fits = self._fits
        taken = 0
        while self._waiting and budget > taken and self._occupied() < seats:
            if fits is not None and not fits(self._waiting[0], len(self._running)):
                break
            taken += self._start(self._waiting.popleft(), budget - taken, framed, admitted)
        return taken

    def _admit_planned(
        self, chosen: list[Request], budget: int, framed: list[_Running], admitted: list[str]
    ) -> int:
        """Admit the deadline policy's choices in its order within the token `budget` and
        `max_num_seqs`; the prompt tokens they take this step."""
        taken = 0
        for request in chosen:
            if budget <= taken or self._occupied() >= self.max_num_seqs:
                break
            self._waiting.remove(request)
            taken += self._start(request, budget - taken, framed, admitted)
        return taken

    def _start(
        self, request: Request, budget: int, framed: list[_Running], admitted: list[str]
    ) -> int:
        """Move `request` to the running set and start its prefill; the tokens it takes."""
        run = _Running(request, self.profile)
        alone = not self._running and len(self._waiting) == 0
        take = self._serving.prefill_chunk(request.prompt_tokens, budget, alone=alone)
        run.prefilled = take
        self._running.append(run)
        admitted.append(request.id)
        if take == request.prompt_tokens:
            framed.append(run)
        return take

    def _streams(self) -> list[Stream]:
        """The running requests whose prefill is done, as the pacing sees them."""
        profile = self.profile
        frame_ms = profile.frame_ms
        return [
            Stream(
                r.request.id,
                r.request.arrival_ms,
                r.frames.first_ms,
                r.frames.sent * frame_ms,
                next_frames=r.frames.next_frames,
            )
            for r in self._running
            if r.prefilled >= r.request.prompt_tokens
        ]

    def _rows(self) -> int:
        """The batch rows requests may take: `max_num_seqs`, within the deadline policy's
        real-time batch when it has one."""
        hook = self._deadlines
        limit = None if hook is None else hook.policy.limit
        return self.max_num_seqs if limit is None else min(limit, self.max_num_seqs)

    def _continue(self, framed: list[_Running]) -> tuple[int, int, int]:
        """The running requests' share of a step: (prompt tokens, decodes, budget left);
        `framed` gets each request that emits a frame this step."""
        budget = self._budget
        prefill_tokens = decode_seqs = 0
        held, serving = self._held, self._serving
        alone = len(self._running) + len(self._waiting) <= 1
        for run in self._running:
            if budget <= 0:
                break
            if run.request.id in held:
                continue
            remaining = run.request.prompt_tokens - run.prefilled
            if remaining > 0:
                take = serving.prefill_chunk(remaining, budget, alone=alone)
                run.prefilled += take
                prefill_tokens += take
                budget -= take
                if take == remaining:
                    framed.append(run)
            else:
                decode_seqs += 1
                budget -= 1
                framed.append(run)
        return prefill_tokens, decode_seqs, budget

    def step(self, now_ms: float) -> Step | None:
        """Plan and account one step starting at `now_ms`; None when there is nothing to run."""
        profile = self.profile
        framed: list[_Running] = []
        if self._pacing is not None:
            self._held = self._pacing.held(
                now_ms, self._streams(), self._rows() - self._occupied(), waiting=self.waiting
            )
            self.parked_steps += len(self._held)
        prefill_tokens, decode_seqs, budget = self._continue(framed)
        held = bool(self._waiting) and self._gate is not None and self._gate()
        admitted: list[str] = []
        if self._deadlines is not None and self._waiting:
            chosen = self._plan(now_ms, held)
            prefill_tokens += self._admit_planned(chosen, budget, framed, admitted)
            held = held and not admitted
        elif not held:
            prefill_tokens += self._admit(budget, framed, admitted)
        if not held:
            self._report(admitted)
        if prefill_tokens == 0 and decode_seqs == 0:
            return None
        ms = profile.step.step_ms(prefill_tokens, decode_seqs)
        ms *= 1.0 if self._step_factor is None else self._step_factor(now_ms)
        self.step_estimate_ms = next_estimate(self.step_estimate_ms, ms, decode_seqs)
        end_ms = now_ms + ms
        estimate = self.step_estimate_ms
        chunks = [c for run in framed if (c := run.frames.add(end_ms, estimate)) is not None]
        if self._deadlines is not None:
            self._deadlines.policy.observe(decode_seqs, prefill_tokens, ms, end_ms=end_ms)
        return Step(
            t_ms=now_ms,
            ms=ms,
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            admitted=tuple(admitted),
            held=held,
            chunks=tuple(chunks),
            finished=self._finished(framed),
        )

    def _finished(self, framed: list[_Running]) -> tuple[str, ...]:
        """The requests whose last frame this step made: they leave the running set, and the
        deadline policy learns their lengths."""
        done = [run for run in framed if run.frames.done]
        if not done:
            return ()
        self._running = [run for run in self._running if not run.frames.done]
        for run in done:
            if self._deadlines is not None:
                self._deadlines.policy.finished(run.frames.total, run.request.prompt_tokens)
            if self._pacing is not None:
                self._pacing.ended(run.request.id)
        return tuple(run.request.id for run in done)
