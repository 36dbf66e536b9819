"""The deadline policy's values: its settings, the requests and throttle it is shown, and the
decisions and capacity figures it returns (`edgemon.policy.deadlines` uses them and exports
them again: import them from there).

Plain values and the default SLOs; pure, no engine imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from edgemon.policy.realtime import FRAME_MS

Verdict = Literal["admit", "queue", "shed"]
"""What happens to a request at arrival."""
Order = Literal["fcfs", "edf"]
"""The admission order among waiting requests: arrival order, or earliest deadline first."""
ORDERS: tuple[Order, ...] = ("fcfs", "edf")

START_SLO_MS = 3000.0
"""Default start SLO: request to playback start, prebuffer included."""
GAP_SLO_MS = 100.0
"""Default continuity SLO: the longest single gap (vLLM-Omni's continuity threshold)."""
GUARD_MS = 400.0
"""What the shipped policy keeps in hand of every start budget, for what the prediction misses
(a burst of prefills, the players' delivery jitter); 300–600 ms measured within a point of
goodput, 400 ms keeps the start p99 within the SLO at every point measured (README "Does it
help?"). The simulation's `edgemon` policy and the vLLM schedulers both take it."""
EXPECTED_FRAMES = 100.0
"""A request's frames until some have finished (8 s of audio at 80 ms a frame)."""
PREBUFFER_MS = 200.0
"""What a listener's first audio still needs, fixed part, once the engine made it: the
cushion of a player that prebuffers as docs/client.md recommends (200 ms) and the delivery
on the box's own network (a few milliseconds). The simulated players use the same."""
SECOND_CHUNK_FRAMES = 25
"""The frames of the second chunk, which such a player waits for before it starts (it starts
with the second chunk announced): vLLM-Omni's ``codec_chunk_frames`` for Qwen3-TTS, 25."""
Mode = Literal["off", "hold", "shed"]
"""How a server applies the policy: `off` predicts only (the capacity object's start wait),
`hold` admits as its plans say (holds end at each request's start deadline), `shed` also
refuses what cannot start in time."""
MODES: tuple[Mode, ...] = ("off", "hold", "shed")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineSettings:
    """What the policy is told rather than measures."""

    start_slo_ms: float = START_SLO_MS
    """The start SLO: request to playback start, prebuffer included."""
    prebuffer_ms: float = 0.0
    """The fixed part of what the player buffers after its first audio arrives (its cushion),
    plus the delivery to it."""
    first_chunk_frames: int = 5
    """Frames of a stream's first audio chunk."""
    second_chunk_frames: int = 0
    """Frames of the second chunk, for a player that prebuffers until it is due (it starts
    once the first chunk's audio covers the rest of that wait); 0: it does not wait."""
    frame_ms: float = FRAME_MS
    """Audio of one frame (the decode step a stream needs to keep up)."""
    order: Order = "fcfs"
    shed: bool = True
    """Refuse what cannot start in time; False: queue it (its hold still ends at its deadline)."""
    shed_at_arrival: bool = True
    """With `shed`: refuse at arrival what cannot start in time."""
    shed_queued: bool = True
    """With `shed`: refuse a queued request once it cannot start in time."""
    guard_ms: float = 0.0
    """Taken off every start budget, for what the prediction misses."""
    expected_frames: float = EXPECTED_FRAMES
    """A request's frames until `Deadlines.finished` has taught better."""
    prefill_ms_per_token: float = 0.0
    """A prompt token's prefill cost until `Deadlines.observe` has measured one."""
    token_budget: int | None = None
    """Prompt tokens one step may prefill (vLLM's `max_num_batched_tokens`): prefills beyond
    it spill into further steps, each a step later; None: no bound."""
    estimate_headroom: bool = False
    """Without edgemon's headroom (its throttle object), estimate the running streams' from
    the chunks they sent, as the server can (`Deadlines.estimated_headroom_ms`)."""
    amortize: bool = True
    """Count prefills in the batch that keeps up: each request's prefill, spread over its
    frames, lengthens the average step, so the batch whose steps average a frame is smaller
    than the one whose decode-only step fits a frame."""

    def __post_init__(self) -> None:
        for name in ("start_slo_ms", "prebuffer_ms", "frame_ms", "guard_ms", "expected_frames"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, not {value!r}")
        if self.frame_ms <= 0 or self.expected_frames <= 0:
            raise ValueError("frame_ms and expected_frames must be > 0")
        if self.first_chunk_frames < 1:
            raise ValueError(f"first_chunk_frames must be ≥ 1, not {self.first_chunk_frames}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be ≥ 1, not {self.token_budget}")
        if self.second_chunk_frames < 0:
            raise ValueError(f"second_chunk_frames must be ≥ 0, not {self.second_chunk_frames}")
        if not (math.isfinite(self.prefill_ms_per_token) and self.prefill_ms_per_token >= 0):
            raise ValueError("prefill_ms_per_token must be a finite number ≥ 0")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {self.order!r}")


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the waiting queue. `frames`: its length, for a caller that knows it
    (None, as on a real server: predicted from its prompt)."""

    id: str
    arrival_ms: float
    prompt_tokens: int
    frames: float | None = None


@dataclass(frozen=True, slots=True)
class Running:
    """A request in the running set: the frames it has left, for a caller that knows them
    (None, as on a real server: predicted from its prompt, the frames it emitted and its
    cap), and the prompt tokens it still has to prefill (chunked prefill under way)."""

    id: str
    remaining_frames: float | None
    prefill_tokens: int = 0
    prompt_tokens: int = 0
    emitted_frames: int = 0
    max_frames: int | None = None
    """The most frames it may emit (its `max_tokens`), when the client set one."""
    first_chunk_ms: float | None = None
    """When its first chunk was complete (None: not yet, or not known)."""


@dataclass(frozen=True, slots=True)
class Throttle:
    """edgemon's throttle as the scheduler sees it.

    `held`: the gate holds new prefills now. `headroom_ms`: the running streams' spendable
    headroom (the least headroom less its margin, from the throttle object), None if unknown.
    """

    held: bool = False
    headroom_ms: float | None = None


OPEN = Throttle()
"""No throttle: the gate does not hold, headroom unknown."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step's decisions: the requests to admit, in order, and those to shed now."""

    admit: tuple[str, ...] = ()
    shed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CapacityFigures:
    """The policy's figures for the capacity object a scheduler publishes (the object itself,
    as read: `edgemon.capacity_object.Capacity`)."""

    realtime_streams: int | None
    """The batch the engine can decode in real time now (None while unknown)."""
    running: int
    waiting: int
    start_wait_ms: float | None
    """Predicted wait of a new request before its first audio: admission, prefill excluded,
    plus its first chunk (None while the step time is unknown)."""
    shed_total: int

    def as_dict(self) -> dict[str, float | int | None]:
        """The capacity object's fields (the caller adds `t_ms`)."""
        return {
            "realtime_streams": self.realtime_streams,
            "running": self.running,
            "waiting": self.waiting,
            "start_wait_ms": None if self.start_wait_ms is None else round(self.start_wait_ms, 1),
            "shed_total": self.shed_total,
        }
