"""Real-time admission: admit no request beyond the concurrency the box can decode in real time.

A TTS stream keeps up with its player only while a decode step (one codec frame per stream)
takes less than a frame of audio (80 ms for Qwen3-TTS's 12.5 Hz codec). Each further stream
makes every step longer, so there is a largest batch N* whose step still fits a frame; beyond
it every stream falls behind at once. A static ``max_num_seqs = N*`` enforces this while the
box keeps its speed; when the box slows down (thermal throttling, a power mode, another job on
the GPU), N* falls and a static cap cannot follow.

`RealtimeAdmission` measures instead of assuming. The scheduler tells it every step it ran
(`observe`: decodes, prefill tokens, duration). From the steps that only decoded it keeps:

- the **shape** of step time against batch size, ``a + b·n`` (weighted least squares with a
  slow forgetting factor: it needs steps of several batch sizes, which a busy box provides);
- a fast **scale**: the recent measured steps over that shape (an EWMA), which follows a
  slowdown within a few steps.

`limit` is then the largest n with ``scale · (a + b·n) ≤ frame_ms`` (at least 1; `frame_ms`
is the step allowed: the schedulers give one frame), and
`admissible(running)` how many more requests may be admitted now. Until steps of at least two
batch sizes were seen, or when a batch costs nothing more per stream, there is no limit.

**A starvation bound.** With `max_wait_ms` set, a full batch still lets one request in when
the oldest waiting one has waited that long (`admissible(running, oldest_wait_ms=...)`), so
no request waits forever behind a batch that never shrinks. The deadline policy
(`edgemon.policy.deadlines`) bounds each request by its own start deadline instead.

Pure and clock-free (the caller measures durations): the vLLM schedulers and the simulation
(`edgemon.simulate`) run this same code.
"""

from __future__ import annotations

import math

FRAME_MS = 80.0
"""Audio of one Qwen3-TTS codec frame (12.5 Hz)."""
SHAPE_HALF_LIFE_STEPS = 2000
"""Decode steps after which an observation weighs half in the step-time shape."""
SCALE_ALPHA = 0.2
"""Weight of the newest step in the scale (how fast a slowdown is followed)."""
MIN_SPREAD = 0.25
"""Least weighted variance of batch sizes before the shape is trusted."""


class RealtimeAdmission:
    """Measured real-time concurrency; see the module doc."""

    __slots__ = (
        "_forget",
        "_s",
        "_sm",
        "_sn",
        "_snm",
        "_snn",
        "frame_ms",
        "max_wait_ms",
        "scale",
        "scale_alpha",
        "steps",
    )

    def __init__(
        self,
        frame_ms: float = FRAME_MS,
        *,
        half_life_steps: float = SHAPE_HALF_LIFE_STEPS,
        scale_alpha: float = SCALE_ALPHA,
        max_wait_ms: float | None = None,
    ) -> None:
        if not (math.isfinite(frame_ms) and frame_ms > 0):
            raise ValueError(f"frame_ms must be a finite number > 0, not {frame_ms!r}")
        if not (math.isfinite(half_life_steps) and half_life_steps >= 1):
            raise ValueError(f"half_life_steps must be ≥ 1, not {half_life_steps!r}")
        if not 0 < scale_alpha <= 1:
            raise ValueError(f"scale_alpha must be 0 < x ≤ 1, not {scale_alpha!r}")
        if max_wait_ms is not None and not (math.isfinite(max_wait_ms) and max_wait_ms >= 0):
            raise ValueError(f"max_wait_ms must be a finite number ≥ 0, not {max_wait_ms!r}")
        self.frame_ms = float(frame_ms)
        #: The starvation bound: a request that waited this long is let in beyond the limit.
        self.max_wait_ms = max_wait_ms
        self.scale_alpha = scale_alpha
        self._forget = 0.5 ** (1.0 / half_life_steps)
        self._s = self._sn = self._snn = self._sm = self._snm = 0.0
        #: The measured steps over the shape, lately (1 while the shape is unknown).
        self.scale = 1.0
        #: Decode-only steps observed.
        self.steps = 0

    def observe(self, decodes: int, prefill_tokens: int, ms: float) -> None:
        """A step ran `decodes` decoding sequences and `prefill_tokens` prompt tokens in `ms`.

        Only decode-only steps teach anything (a prefill's cost is another matter); steps
        with no decode, or a duration that is not a positive finite number, are ignored.
        """
        if decodes <= 0 or prefill_tokens > 0 or not (math.isfinite(ms) and ms > 0):
            return
        self.steps += 1
        k = self._forget
        n = float(decodes)
        self._s = self._s * k + 1.0
        self._sn = self._sn * k + n
        self._snn = self._snn * k + n * n
        self._sm = self._sm * k + ms
        self._snm = self._snm * k + n * ms
        shape = self.shape()
        if shape is not None:
            predicted = shape[0] + shape[1] * n
            if predicted > 0:
                self.scale += self.scale_alpha * (ms / predicted - self.scale)

    def shape(self) -> tuple[float, float] | None:
        """`(a, b)` of the step-time shape `a + b·n` in ms, or None until it is known."""
        s = self._s
        if s <= 0:
            return None
        mean_n = self._sn / s
        variance = self._snn / s - mean_n * mean_n
        if variance < MIN_SPREAD:
            return None
        b = (self._snm / s - mean_n * self._sm / s) / variance
        a = self._sm / s - b * mean_n
        return a, b

    @property
    def limit(self) -> int | None:
        """The largest batch whose decode step fits a frame now (≥ 1); None while unknown."""
        shape = self.shape()
        if shape is None:
            return None
        a, b = shape
        if b <= 0:
            return None
        n = (self.frame_ms / self.scale - a) / b
        return max(1, math.floor(n)) if math.isfinite(n) else None

    def admissible(self, running: int, oldest_wait_ms: float | None = None) -> int | None:
        """How many more requests may be admitted with `running` admitted (None: no bound).

        `oldest_wait_ms`: how long the oldest waiting request has waited; at `max_wait_ms` or
        more, at least one may be admitted (the starvation bound).
        """
        limit = self.limit
        if limit is None:
            return None
        more = max(0, limit - running)
        bound = self.max_wait_ms
        if more == 0 and bound is not None and oldest_wait_ms is not None:
            return 1 if oldest_wait_ms >= bound else 0
        return more
