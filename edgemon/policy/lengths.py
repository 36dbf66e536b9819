"""How long a request will speak, predicted from what a server sees: its prompt.

A TTS request ends at its end-of-speech token. No server knows when that comes: clients
rarely set `max_tokens`, and when they do it is a generous cap, not the length. What a
server does know is the prompt, and the audio of finished requests. Speech is roughly
proportional to its text, so `LengthModel` learns, from finished requests,

    log frames = a + b · log prompt tokens + ε

(least squares with a slow forgetting factor, as `RealtimeAdmission` learns the step shape)
and keeps the recent residuals ε as they are, not as a fitted spread. A request of `p` prompt
tokens that has emitted `e` frames has

    remaining(p, e) = E[F − e | F > e],  F = exp(a + b · log p + ε)

over the kept residuals: the mean remaining life of the requests like it that got that far.
A request that outlived every one of them is expected to go on for a tenth of what it has
said. With a voice-clone reference in the prompt (codes that add tokens but no audio) the
fit's slope falls below 1 and the residuals widen: the prediction stays unbiased, only less
sharp. A caller that knows a request's cap (`max_frames`) bounds the prediction by it; a cap
alone predicts nothing.

Before any request has finished, a request is expected to take `prior_frames`.

Pure and clock-free: the simulated engine and the vLLM schedulers run this same code.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque

PRIOR_FRAMES = 100.0
"""A request's frames until some have finished (8 s of audio at 80 ms a frame)."""
KEPT = 256
"""Finished requests whose residuals are kept."""
HALF_LIFE = 500.0
"""Finished requests after which one weighs half in the fit."""
MIN_FINISHED = 8
"""Finished requests before the fit is trusted (until then: their mean length)."""
OUTLIVED_SHARE = 0.1
"""What a request that outlived every kept one is expected still to say, as a share of what
it said."""


class LengthModel:
    """Predicted request lengths in frames; see the module doc."""

    __slots__ = (
        "_cum",
        "_dirty",
        "_early",
        "_forget",
        "_kept",
        "_ratios",
        "_s",
        "_sx",
        "_sxx",
        "_sxy",
        "_sy",
        "finished",
        "prior_frames",
    )

    def __init__(self, prior_frames: float = PRIOR_FRAMES, *, half_life: float = HALF_LIFE) -> None:
        if not (math.isfinite(prior_frames) and prior_frames > 0):
            raise ValueError(f"prior_frames must be a finite number > 0, not {prior_frames!r}")
        self.prior_frames = float(prior_frames)
        self._forget = 0.5 ** (1.0 / half_life)
        self._s = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._kept: deque[float] = deque()  # residual ratios, in the order they came
        self._ratios: list[float] = []  # the same, sorted
        self._cum: list[float] = []  # suffix sums of `_ratios`, built when asked
        self._dirty = False
        self._early: list[tuple[float, float]] = []  # (log prompt, log frames) until fitted
        #: Requests learned from.
        self.finished = 0

    def learn(self, prompt_tokens: int, frames: int) -> None:
        """A request of `prompt_tokens` finished after `frames` frames."""
        if frames <= 0:
            return
        x, y = math.log(max(1, prompt_tokens)), math.log(frames)
        k = self._forget
        self._s = self._s * k + 1.0
        self._sx = self._sx * k + x
        self._sy = self._sy * k + y
        self._sxx = self._sxx * k + x * x
        self._sxy = self._sxy * k + x * y
        self.finished += 1
        if self.finished < MIN_FINISHED:
            self._early.append((x, y))
            return
        if self._early:  # the fit is trusted from now: the first ones become residuals of it
            early, self._early = self._early, []
            for early_x, early_y in early:
                self._keep(math.exp(early_y - self._log_median(early_x)))
        self._keep(math.exp(y - self._log_median(x)))

    def _keep(self, ratio: float) -> None:
        kept, ratios = self._kept, self._ratios
        kept.append(ratio)
        bisect.insort(ratios, ratio)
        if len(kept) > KEPT:
            del ratios[bisect.bisect_left(ratios, kept.popleft())]
        self._dirty = True

    def _fitted(self) -> bool:
        return self.finished >= MIN_FINISHED

    def _slope(self) -> tuple[float, float]:
        """`(a, b)` of the fit; the mean alone while the prompts barely vary."""
        s = self._s
        mean_x, mean_y = self._sx / s, self._sy / s
        variance = self._sxx / s - mean_x * mean_x
        b = 0.0 if variance < 1e-6 else (self._sxy / s - mean_x * mean_y) / variance
        return mean_y - b * mean_x, b

    def _log_median(self, x: float) -> float:
        a, b = self._slope()
        return a + b * x

    def typical(self, prompt_tokens: int) -> float:
        """The median length of a request of `prompt_tokens`, in frames."""
        if not self._fitted():
            return self._mean_seen()
        return math.exp(self._log_median(math.log(max(1, prompt_tokens))))

    def _mean_seen(self) -> float:
        """The mean length of the requests seen before the fit is trusted (the prior before
        any)."""
        early = self._early
        if not early:
            return self.prior_frames
        return sum(math.exp(y) for _, y in early) / len(early)

    def expected(self, prompt_tokens: int) -> float:
        """The mean length of a request of `prompt_tokens`, in frames."""
        return self.remaining(prompt_tokens, 0)

    def remaining(
        self, prompt_tokens: int, emitted: float, max_frames: float | None = None
    ) -> float:
        """The frames a request of `prompt_tokens` that has emitted `emitted` is expected still
        to emit (≥ 1), at most `max_frames − emitted` when the caller knows a cap."""
        emitted = max(0.0, emitted)
        if not self._fitted():
            mean = self._mean_seen()
            left = mean - emitted if emitted < mean else OUTLIVED_SHARE * emitted
        else:
            left = self._mean_residual_life(self.typical(prompt_tokens), emitted)
        if max_frames is not None:
            left = min(left, max_frames - emitted)
        return max(1.0, left)

    def _mean_residual_life(self, median: float, emitted: float) -> float:
        ratios = self._ratios
        if self._dirty:
            self._cum = list(itertools.accumulate(reversed(ratios)))[::-1]
            self._dirty = False
        first = bisect.bisect_right(ratios, emitted / median)
        if first >= len(ratios):
            return OUTLIVED_SHARE * emitted
        mean_ratio = self._cum[first] / (len(ratios) - first)
        return median * mean_ratio - emitted
