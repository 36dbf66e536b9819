"""Budget-aware admission: admit a waiting request only if its cost fits the
device's spendable headroom.

edgemon's throttle object says, besides `throttle`, how much the device's streams can still
lose: the spendable headroom, ``min over live streams of (headroom − margin)`` at its `t_ms`
(negative while the throttle is on). A scheduler that knows it can admit a request while
its predicted cost fits: the request's prefill (it lengthens the step every running stream
waits on) plus one more decode in each of the next `ahead_frames` steps (until those streams'
next chunks). It measures the costs itself, from the steps it runs:

- per decoding sequence: the slope of step time against batch size of the decode-only steps
  (`RealtimeAdmission`'s fit, times its current scale);
- per prefill token: what a step with prompt tokens took beyond that fit, per token (EWMA).

The budget is only as fresh as the last throttle object: edgemon publishes one on every
throttle change, not otherwise. Between two objects the scheduler spends what it admits and
(`BudgetSetting.mode`):

- `refill` (the default): credits each step it measures with what the streams gained by it
  (one frame of audio for the step's duration, ``frame_ms − step_ms``);
- `stale`: credits nothing (the budget only shrinks until the next throttle object);
- `fresh`: not a design edgemon can run, an upper bound: the budget is read from edgemon's
  monitor before every step, as if edgemon published it continuously (about one message per
  step, where edgemon publishes one per throttle change).

Without a published budget, or before the costs are known, everything fits (fail-open: the
gate's rule alone, exactly as without this object).

Pure and clock-free: the simulated engine (`edgemon.simulate.loop`) runs it. Measured in
`benchmarks/closed_loop.py --policy ...+budget`: it did not win (README "Does it help?").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from edgemon.policy.realtime import FRAME_MS, RealtimeAdmission

AHEAD_FRAMES = 12.0
"""Decodes a new request is charged for by default: half a 25-frame chunk, the mean wait
until a stream's next chunk."""

BudgetMode = Literal["refill", "stale", "fresh"]
BUDGET_MODES: tuple[BudgetMode, ...] = ("refill", "stale", "fresh")


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetSetting:
    """How budget-aware admission predicts and spends (policy `budget:FRAMES:ALLOW_MS:MODE`)."""

    ahead_frames: float = AHEAD_FRAMES
    """Decodes a new request adds before the streams' next chunks (half a 25-frame chunk)."""
    allowance_ms: float = 0.0
    """A cost may exceed the budget by this much and still fit."""
    mode: BudgetMode = "refill"


PREFILL_ALPHA = 0.2
"""Weight of the newest step in the per-token prefill cost."""
MIN_PREFILL_TOKENS = 16
"""A step teaches the prefill cost only with at least this many prompt tokens."""


class SpendableBudget:
    """The spendable headroom as a scheduler can know it; see the module doc."""

    __slots__ = ("_fit", "budget_ms", "frame_ms", "prefill_ms_per_token", "refused", "setting")

    def __init__(self, setting: BudgetSetting, *, frame_ms: float = FRAME_MS) -> None:
        self.setting = setting
        self.frame_ms = frame_ms
        self._fit = RealtimeAdmission(frame_ms)
        #: What may still be spent, as of now (None: unknown, everything fits).
        self.budget_ms: float | None = None
        #: Measured cost of one prompt token in a step (None until a prefill was seen).
        self.prefill_ms_per_token: float | None = None
        #: Admissions this object refused.
        self.refused = 0

    def published(self, budget_ms: float | None) -> None:
        """A throttle object arrived carrying `budget_ms` (None: the field is absent)."""
        self.budget_ms = budget_ms

    def observe(self, decodes: int, prefill_tokens: int, ms: float) -> None:
        """A step ran (as `RealtimeAdmission.observe`); the costs learn from it and, with
        `refill`, the budget gains what the step's frame bought."""
        if not (math.isfinite(ms) and ms > 0):
            return
        self._fit.observe(decodes, prefill_tokens, ms)
        if prefill_tokens >= MIN_PREFILL_TOKENS:
            decode_ms = self._decode_ms(decodes)
            if decode_ms is not None:
                per_token = max(0.0, ms - decode_ms) / prefill_tokens
                known = self.prefill_ms_per_token
                self.prefill_ms_per_token = (
                    per_token if known is None else known + PREFILL_ALPHA * (per_token - known)
                )
        if self.setting.mode == "refill" and self.budget_ms is not None and decodes > 0:
            self.budget_ms += self.frame_ms - ms

    def _decode_ms(self, decodes: int) -> float | None:
        shape = self._fit.shape()
        if shape is None:
            return None
        a, b = shape
        return self._fit.scale * (a + b * decodes)

    def cost_ms(self, prompt_tokens: int) -> float | None:
        """The predicted cost of admitting a request of `prompt_tokens`, or None if unknown."""
        shape = self._fit.shape()
        per_token = self.prefill_ms_per_token
        if shape is None or per_token is None:
            return None
        per_decode = max(0.0, self._fit.scale * shape[1])
        return per_token * prompt_tokens + per_decode * self.setting.ahead_frames

    def spend(self, prompt_tokens: int) -> None:
        """A request of `prompt_tokens` was admitted whatever the budget said."""
        cost = self.cost_ms(prompt_tokens)
        if self.budget_ms is not None and cost is not None:
            self.budget_ms -= cost

    def admit(self, prompt_tokens: int) -> bool:
        """Whether a request of `prompt_tokens` fits now; if so its cost is spent."""
        budget = self.budget_ms
        cost = self.cost_ms(prompt_tokens)
        if budget is None or cost is None:
            return True
        if cost > budget + self.setting.allowance_ms:
            self.refused += 1
            return False
        self.budget_ms = budget - cost
        return True
