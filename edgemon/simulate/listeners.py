"""What listeners and their players do that the server cannot see: pauses, Wi-Fi stalls and
the player's own stalls.

Pure and seeded per run and stream (`Listening.plan`), so every policy of a run
meets the same listeners. A scenario has at most one kind:

- **pause** `SHARE:MIN_S:MAX_S` (default 0.3:5:60): a share of listeners pause once, at a
  uniform point between a fifth and four fifths of their stream's audio, for a time drawn
  log-uniformly between MIN_S and MAX_S, and resume; the HTTP stream stays open. Assumed, not
  measured: no public figure was found of how often a listener pauses synthesized speech;
  players in the browser expose the pauses (`AudioPlaybackStats`, the media element's `pause`
  events), which is how a Reporter measures them;
- **wifi** `MIN_S:MAX_S:EVERY_S` (default 0.5:2:20): each player's link stalls for a time
  drawn uniformly between MIN_S and MAX_S, at exponential intervals of mean EVERY_S; what the
  engine sent meanwhile arrives at once when the link comes back. Sendspin players saw Wi-Fi
  hiccups of 1–2 s (aiosendspin #341);
- **device** `MIN_S:MAX_S:EVERY_S` (default 0.2:1:15): the player itself stalls (its CPU is
  busy: a busy phone, a small speaker decoding something else), at exponential intervals of
  mean EVERY_S of playback, and consumes nothing meanwhile. Assumed, not measured;
- **prebuffer** `SHORT_S:LONG_S:STEP_S` (default 0.2:0.6:0.3): players of three kinds, a third
  each: one starts once it holds SHORT_S of audio; one once it holds LONG_S, and after each
  underrun stops until it holds LONG_S plus STEP_S per underrun so far (Open-LLM-VTuber-Web #32
  waits for 0.6 s); one buffers the whole stream before it plays. A player that has not
  started yet reports `play_start_ms` 2^53 (not yet), then its start.

A pause and a device stall hold the player's clock: its play start moves later by the stall,
which its Reporter says with the next chunk's `play_start_ms` (docs/protocol.md). Neither is a
gap: the listener chose the silence, or the player made it; only underruns count against the
box.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

LISTENER_SCENARIOS = ("pause", "wifi", "device", "prebuffer")
DEFAULT_PAUSE = "0.3:5:60"
DEFAULT_WIFI = "0.5:2:20"
DEFAULT_DEVICE = "0.2:1:15"
DEFAULT_PREBUFFER = "0.2:0.6:0.3"


@dataclass(frozen=True, slots=True)
class ListenerPlan:
    """One stream's listener: when its player stops consuming, and when its link stalls."""

    holds: tuple[tuple[float, float], ...] = ()
    """`(played_ms, duration_ms)`: after playing `played_ms` of audio the player stops
    consuming for `duration_ms` (a pause, or a device stall), in order."""
    stalls: tuple[tuple[float, float], ...] = ()
    """`(from_ms, until_ms)` on the run's clock: the player's link delivers nothing, in order."""
    start_at_audio_ms: float | None = None
    """The player starts once it holds this much audio (None: the default player)."""
    rebuffer_step_ms: float | None = None
    """A rebuffering player's added prebuffer per underrun (None: it conceals)."""

    def delivered_ms(self, t_ms: float) -> float:
        """When something sent to the player to arrive at `t_ms` arrives."""
        for begin, end in self.stalls:
            if begin <= t_ms < end:
                return end
            if begin > t_ms:
                break
        return t_ms


NO_PLAN = ListenerPlan()
"""A listener who does nothing the server cannot see."""


@dataclass(frozen=True, slots=True)
class Listening:
    """A scenario's listeners (see the module doc): `kind` with its three numbers."""

    kind: str
    first: float
    second: float
    third: float
    horizon_ms: float = field(default=4 * 3_600_000.0)
    """How far a link's stalls are drawn (beyond any run)."""

    def describe(self) -> str:
        """The parameters, as the flag that gives them."""
        return f"{self.kind} {self.first:g}:{self.second:g}:{self.third:g}"

    def plan(self, seed: int, stream: str, audio_ms: float, requested_ms: float) -> ListenerPlan:
        """The listener of `stream` in the run of `seed`: its audio lasts `audio_ms`, its
        request was made at `requested_ms`."""
        rng = random.Random(f"listener/{self.kind}/{seed}/{stream}")  # noqa: S311 - a simulation
        if self.kind == "pause":
            return self._pause(rng, audio_ms)
        if self.kind == "prebuffer":
            return self._prebuffer(rng)
        if self.kind == "device":
            return ListenerPlan(holds=tuple(self._recurring(rng, 0.0, audio_ms)))
        end = requested_ms + self.horizon_ms
        return ListenerPlan(stalls=tuple(self._recurring(rng, requested_ms, end, span=True)))

    def _pause(self, rng: random.Random, audio_ms: float) -> ListenerPlan:
        """One pause, for a `first` share of listeners."""
        if rng.random() >= self.first:
            return NO_PLAN
        at = rng.uniform(0.2, 0.8) * audio_ms
        low, high = math.log(self.second * 1000.0), math.log(self.third * 1000.0)
        return ListenerPlan(holds=((at, math.exp(rng.uniform(low, high))),))

    def _prebuffer(self, rng: random.Random) -> ListenerPlan:
        """One of the three players, a third each."""
        kind = rng.randrange(3)
        if kind == 0:
            return ListenerPlan(start_at_audio_ms=self.first * 1000.0)
        if kind == 1:
            return ListenerPlan(
                start_at_audio_ms=self.second * 1000.0, rebuffer_step_ms=self.third * 1000.0
            )
        return ListenerPlan(start_at_audio_ms=math.inf)

    def _recurring(
        self, rng: random.Random, begin_ms: float, end_ms: float, *, span: bool = False
    ) -> list[tuple[float, float]]:
        """Stalls at exponential intervals of mean `third` s from `begin_ms` to `end_ms`, each
        lasting between `first` and `second` s: `(at, duration)`, or `(from, until)` with
        `span`."""
        out: list[tuple[float, float]] = []
        t = begin_ms
        while True:
            t += rng.expovariate(1.0 / (self.third * 1000.0))
            if t >= end_ms:
                return out
            duration = rng.uniform(self.first, self.second) * 1000.0
            out.append((t, t + duration) if span else (t, duration))
            if span:
                t += duration


def listening(name: str, text: str) -> Listening:
    """The listeners of scenario `name` from its flag's `text` (ValueError naming what is
    wrong)."""
    flag = f"--{name}"
    parts = text.split(":")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        values = []
    if len(values) != 3 or not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{flag} takes 3 numbers > 0 separated by ':', not {text!r}")
    first, second, third = values
    if name == "prebuffer":
        if first > second:
            raise ValueError(f"{flag}: SHORT_S must be at most LONG_S")
    elif name == "pause":
        if first > 1:
            raise ValueError(f"{flag}: SHARE is a share of listeners, at most 1, not {first:g}")
        if second > third:
            raise ValueError(f"{flag}: MIN_S must be at most MAX_S")
    elif first > second:
        raise ValueError(f"{flag}: MIN_S must be at most MAX_S")
    return Listening(name, first, second, third)
