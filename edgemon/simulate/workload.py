"""TTS requests arriving at a box: a seeded Poisson process of texts, their prompts and audio.

Pure and deterministic: `Arrivals(rate, workload, seed)` yields the same requests for the same
seed, on any clock. Two engines fed from two `Arrivals` with one seed see identical requests,
which is how the demo and the benchmark compare the loop open and closed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgemon.simulate.profiles import FRAME_MS

if TYPE_CHECKING:
    from edgemon.simulate.profiles import Workload


@dataclass(frozen=True, slots=True)
class Request:
    """One TTS request: when it arrives (ms after the run's start), its prompt, the frames
    it will speak before its end-of-speech token, and the cap its client sends
    (`max_tokens`; None: none)."""

    id: str
    arrival_ms: float
    prompt_tokens: int
    frames: int
    max_frames: int | None = None

    @property
    def audio_ms(self) -> float:
        """The audio this request will produce."""
        return self.frames * FRAME_MS


def draw(rng: random.Random, workload: Workload, request_id: str, arrival_ms: float) -> Request:
    """One request of `workload` arriving at `arrival_ms`, drawn from `rng`."""
    load = workload
    text = min(
        load.text_max_tokens, rng.lognormvariate(math.log(load.text_median_tokens), load.text_sigma)
    )
    text_tokens = max(1, round(text))
    per_token = rng.lognormvariate(math.log(load.frames_per_token), load.frames_sigma)
    audio_frames = min(text_tokens * per_token, load.audio_max_s * 1000.0 / FRAME_MS)
    prompt = load.template_tokens + text_tokens
    if rng.random() < load.clone_share:
        reference_s = rng.lognormvariate(math.log(load.reference_median_s), load.reference_sigma)
        prompt += load.reference_tokens(min(reference_s, load.reference_max_s))
    return Request(
        id=request_id,
        arrival_ms=arrival_ms,
        prompt_tokens=prompt,
        frames=max(1, round(audio_frames)),
        max_frames=load.max_frames,
    )


class Arrivals:
    """Requests at `rate_rps` per second, in arrival order; `due(t_ms)` hands out what is due."""

    __slots__ = ("_count", "_next", "_rng", "rate_rps", "workload")

    def __init__(self, rate_rps: float, workload: Workload, *, seed: int) -> None:
        if not (math.isfinite(rate_rps) and rate_rps > 0):
            raise ValueError("rate_rps must be a finite number > 0")
        self.rate_rps = rate_rps
        self.workload = workload
        self._rng = random.Random(f"arrivals/{seed}")  # noqa: S311 - a simulation
        self._count = 0
        self._next = self._draw(0.0)

    @property
    def next_ms(self) -> float:
        """When the next request arrives."""
        return self._next.arrival_ms

    def due(self, t_ms: float) -> list[Request]:
        """Every request arriving at or before `t_ms`, in order."""
        out: list[Request] = []
        while self._next.arrival_ms <= t_ms:
            out.append(self._next)
            self._next = self._draw(self._next.arrival_ms)
        return out

    def _draw(self, after_ms: float) -> Request:
        gap_ms = self._rng.expovariate(self.rate_rps) * 1000.0
        request = draw(self._rng, self.workload, f"r{self._count}", after_ms + gap_ms)
        self._count += 1
        return request
