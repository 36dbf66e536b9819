"""Players: when each stream's chunks arrive, when playback starts, and what underran.

Pure. A `Player` is told each chunk's arrival on its own clock and keeps the score the way the
listener would (player model `conceal`, docs/semantics.md: slack = Σ audio − (t − start); audio that
is missing is concealed and the player clock runs on), independently of edgemon: the
benchmark's underrun figures come from here, never from the monitor it is judging.

Playback does not start at the first chunk: a short first chunk would run dry long before the
second one is decoded. The player starts `max(0, eta − first audio) + cushion` after the first
chunk arrives, the least prebuffer that covers the announced wait for the second chunk, plus a
cushion (which should exceed edgemon's margin, or every new stream starts at risk).

Each request ends with an **outcome** against two SLOs (`outcome`): `shed` (the box refused
it; `shed_ms` is when the refusal reached the player), `late` (its start silence exceeds the
start SLO, also while it still waits at the run's end), `gappy` (start met, its longest gap,
one concealed stretch, exceeds the gap SLO), `unfinished` (start and gaps met so far, the
final chunk not yet in at the run's end) or `good` (completed within both). Goodput is good
over offered (DistServe's measure: the share of requests served within every SLO).

`Delivery` models the network between engine and players: a seeded delay per chunk that never
reorders a stream's chunks.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edgemon.policy.deadlines import GAP_SLO_MS, START_SLO_MS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from edgemon.simulate.engine import Chunk

PLAYER_CUSHION_MS = 200.0
"""Prebuffer a player keeps beyond the announced wait for the second chunk."""
OUTCOMES = ("good", "late", "gappy", "shed", "unfinished")
"""What became of a request (see the module doc)."""


@dataclass(slots=True)
class Player:
    """One stream's player; times are milliseconds on the player's clock."""

    stream: str
    requested_ms: float
    cushion_ms: float = PLAYER_CUSHION_MS
    first_ms: float | None = None
    start_ms: float | None = None
    audio_ms: float = 0.0
    last_ms: float = 0.0
    chunks: int = 0
    final: bool = False
    underruns: int = 0
    underrun_ms: float = 0.0
    in_underrun: bool = False
    longest_gap_ms: float = 0.0
    """The longest single concealed stretch so far."""
    gap_ms: float = 0.0
    """The current (or last) concealed stretch."""
    shed_ms: float | None = None
    """When the box's refusal reached the player (None: not refused)."""
    arrivals: list[tuple[float, float]] = field(default_factory=list)
    """Each chunk's `(arrival, audio)` in ms, in order (what a dump writes)."""
    stood_ms: float = 0.0
    """How long the player stood still in all: pauses, its own stalls."""
    resumes_ms: float | None = None
    """When its latest pause or stall ends (None: it never stood still)."""
    began_ms: float | None = None
    """When playback first started: the end of the start silence, whatever later pauses and
    rebuffering stops do to the play start."""
    start_at_audio_ms: float | None = None
    """A prebuffering player starts once it holds this much audio, or at the final chunk
    (infinite: it buffers the whole stream); None: the default rule (the module doc)."""
    rebuffer_step_ms: float | None = None
    """A rebuffering player: when it runs dry it stops until it holds `start_at_audio_ms`
    plus this much per underrun so far (None: it conceals, the default)."""
    _stalled_since: float | None = field(default=None, repr=False)
    _stall_played_ms: float = field(default=0.0, repr=False)

    def hold(self, t_ms: float, duration_ms: float) -> bool:
        """The player stops consuming at `t_ms` for `duration_ms` (its listener paused, or
        it stalled): its play start moves later by that much. Ignored (False) unless it is
        playing audio then: not before its start, nor once played out or dry."""
        if self._stalled_since is not None:
            return False  # a rebuffering player stopped already
        if self.start_ms is None or t_ms < self.start_ms or self.slack_ms(t_ms) <= 0:
            return False
        self.start_ms += duration_ms
        self.stood_ms += duration_ms
        self.resumes_ms = t_ms + duration_ms
        return True

    @property
    def stopped(self) -> bool:
        """A rebuffering player stopped because it ran dry, and waits to hold enough again."""
        return self._stalled_since is not None

    def reported_start_ms(self, t_ms: float) -> float | None:
        """The play start its Reporter gives at `t_ms` (None: not started): a pause, or a
        rebuffering player's stop, under way counts up to `t_ms` only (the player does not know
        when it will end)."""
        if self.start_ms is None:
            return None
        if self._stalled_since is not None:
            return t_ms - self._stall_played_ms  # stopped: as if it started again now
        ahead = 0.0 if self.resumes_ms is None else max(0.0, self.resumes_ms - t_ms)
        return self.start_ms - ahead

    def refused(self, t_ms: float) -> None:
        """The box refused the request; the refusal arrived at `t_ms`."""
        if self.first_ms is not None:
            raise ValueError(f"{self.stream}: refused after audio arrived")
        self.shed_ms = t_ms

    @property
    def shed_latency_ms(self) -> float | None:
        """How long the refusal took from the request (None: not refused)."""
        return None if self.shed_ms is None else self.shed_ms - self.requested_ms

    def outcome(
        self, end_ms: float, *, start_slo_ms: float = START_SLO_MS, gap_slo_ms: float = GAP_SLO_MS
    ) -> str:
        """`good`, `late`, `gappy`, `shed` or `unfinished` at `end_ms` (see the module doc)."""
        if self.shed_ms is not None:
            return "shed"
        if self.start_silence_ms(end_ms) > start_slo_ms:
            return "late"
        if self.longest_gap_ms > gap_slo_ms:
            return "gappy"
        return "good" if self.final else "unfinished"

    @property
    def ttfa_ms(self) -> float | None:
        """Time to first audio: request to the first chunk's arrival."""
        return None if self.first_ms is None else self.first_ms - self.requested_ms

    def start_silence_ms(self, end_ms: float) -> float:
        """Silence before the first word: the request to the playback start (prebuffer
        included), counted up to `end_ms` while playback has not started by then (0 for a
        refused request: its listener was told at once)."""
        if self.shed_ms is not None:
            return 0.0
        start = end_ms if self.began_ms is None else min(self.began_ms, end_ms)
        return max(0.0, start - self.requested_ms)

    def receive(self, chunk: Chunk, t_ms: float) -> None:
        """The chunk arrived at `t_ms`."""
        if self.final:
            raise ValueError(f"{self.stream}: a chunk after the final one")
        self._before(chunk, t_ms)
        self.audio_ms += chunk.audio_ms
        self.arrivals.append((t_ms, chunk.audio_ms))
        self.last_ms = t_ms
        self.chunks += 1
        self.final = chunk.final
        if self.start_ms is None and self.start_at_audio_ms is not None:
            if self.final or self.audio_ms >= self.start_at_audio_ms:
                self.start_ms = self.began_ms = t_ms
        elif self._stalled_since is not None:
            self._restart(t_ms)
        if self.in_underrun and self.slack_ms(t_ms) > 0:
            self.in_underrun = False

    def _before(self, chunk: Chunk, t_ms: float) -> None:
        """What the player did up to the arrival of `chunk` at `t_ms`: the first chunk sets
        the default player's start; a started player may have run dry meanwhile."""
        if self.first_ms is None:
            self.first_ms = t_ms
            if self.start_at_audio_ms is None:
                wait = 0.0 if chunk.eta_ms is None else max(0.0, chunk.eta_ms - chunk.audio_ms)
                self.start_ms = self.began_ms = t_ms + wait + self.cushion_ms
        elif self.start_ms is not None:
            if self.rebuffer_step_ms is None:
                self._run_dry_until(t_ms)
            elif self._stalled_since is None and t_ms > self.start_ms + self.audio_ms:
                self._stalled_since = self.start_ms + self.audio_ms  # it stopped there
                self._stall_played_ms = self.audio_ms

    def _restart(self, t_ms: float) -> None:
        """A stopped rebuffering player starts again at `t_ms` if it holds enough (or has
        the final chunk); the stop counts as one underrun."""
        assert self._stalled_since is not None
        assert self.start_at_audio_ms is not None
        assert self.rebuffer_step_ms is not None
        held = self.audio_ms - self._stall_played_ms
        if not self.final and held < self.start_at_audio_ms + self.rebuffer_step_ms * (
            self.underruns + 1
        ):
            return
        gap = t_ms - self._stalled_since
        self.underruns += 1
        self.underrun_ms += gap
        self.gap_ms = gap
        self.longest_gap_ms = max(self.longest_gap_ms, gap)
        self.start_ms = t_ms - self._stall_played_ms
        self._stalled_since = None

    def slack_ms(self, t_ms: float) -> float:
        """Audio buffered ahead of the player at `t_ms` (negative: concealed audio)."""
        if self.start_ms is None:
            return 0.0
        if self._stalled_since is not None:
            return self.audio_ms - self._stall_played_ms
        return self.audio_ms - max(0.0, t_ms - self.start_ms)

    def settle(self, t_ms: float) -> None:
        """Account underrun time up to `t_ms` (the end of a run) without a chunk arriving."""
        if self.start_ms is None or self.final:
            return
        if self.rebuffer_step_ms is None:
            self._run_dry_until(t_ms)
            self.last_ms = max(self.last_ms, t_ms)
            return
        stopped = self._stalled_since
        if stopped is None and t_ms > self.start_ms + self.audio_ms:
            stopped = self.start_ms + self.audio_ms
        if stopped is not None:  # still stopped at the end: one underrun, to the end
            self.underruns += 1
            self.underrun_ms += t_ms - stopped
            self.longest_gap_ms = max(self.longest_gap_ms, t_ms - stopped)

    def played_ms(self, t_ms: float) -> float:
        """How long the stream has been playing by `t_ms` (its stream time)."""
        if self.start_ms is None or t_ms <= self.start_ms:
            return 0.0
        if self._stalled_since is not None:
            return self._stall_played_ms  # stopped: it played what it had
        end = self.start_ms + self.audio_ms if self.final else t_ms
        return max(0.0, min(t_ms, end) - self.start_ms)

    def _run_dry_until(self, t_ms: float) -> None:
        assert self.start_ms is not None
        dry_at = self.start_ms + self.audio_ms
        if t_ms > dry_at:
            dry = t_ms - max(dry_at, self.last_ms)
            self.underrun_ms += dry
            if not self.in_underrun:
                self.underruns += 1
                self.in_underrun = True
                self.gap_ms = 0.0
            self.gap_ms += dry
            if self.gap_ms > self.longest_gap_ms:
                self.longest_gap_ms = self.gap_ms


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-quantile (0–1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    """What the players of a run heard, computed on their own clocks.

    Silence is what a listener hears instead of speech. **Start silence**: from the request
    to the playback start, prebuffer included (a request still waiting at the run's end
    counts up to the end). **Gap silence**: the concealed time in the middle of a stream (its
    underruns; a stream still under way counts its gaps up to the end). **Total silence**:
    the two added together. Holding prefills can move silence from gaps to starts; it cannot
    make a box near capacity faster.
    """

    requests: int
    streams: int
    completed: int
    stream_minutes: float
    underruns: int
    underrun_s: float
    ttfa_p50_ms: float | None
    ttfa_p99_ms: float | None
    start_silence_s: float = 0.0
    start_silence_p50_ms: float | None = None
    start_silence_p99_ms: float | None = None
    """Over the requests the box did not refuse."""
    start_slo_ms: float = START_SLO_MS
    gap_slo_ms: float = GAP_SLO_MS
    good: int = 0
    late: int = 0
    gappy: int = 0
    shed: int = 0
    unfinished: int = 0
    shed_p99_ms: float | None = None
    """How long refusals took to reach the player (p99)."""
    longest_gap_p95_ms: float | None = None
    """The p95 over started streams of each one's longest gap (vLLM-Omni's continuity
    figure)."""

    @property
    def offered(self) -> int:
        """Requests made."""
        return self.requests

    @property
    def goodput(self) -> float:
        """Good over offered (0 with nothing offered)."""
        return self.good / self.requests if self.requests else 0.0

    @property
    def underruns_per_stream_minute(self) -> float:
        """Underruns per minute of stream playback."""
        return self.underruns / self.stream_minutes if self.stream_minutes else 0.0

    @property
    def gap_silence_s(self) -> float:
        """Concealed time mid-stream (the underrun seconds)."""
        return self.underrun_s

    @property
    def gaps(self) -> int:
        """Gaps begun mid-stream (the underruns)."""
        return self.underruns

    @property
    def total_silence_s(self) -> float:
        """Start silence plus gap silence."""
        return self.start_silence_s + self.underrun_s


def score(
    players: Iterable[Player],
    end_ms: float,
    *,
    requests: int | None = None,
    start_slo_ms: float = START_SLO_MS,
    gap_slo_ms: float = GAP_SLO_MS,
) -> Score:
    """Settle every player at `end_ms` and add up what they heard."""
    listed = list(players)
    for player in listed:
        player.settle(end_ms)
    ttfa = [p.ttfa_ms for p in listed if p.ttfa_ms is not None]
    silence = [p.start_silence_ms(end_ms) for p in listed if p.shed_ms is None]
    outcomes = Counter(
        p.outcome(end_ms, start_slo_ms=start_slo_ms, gap_slo_ms=gap_slo_ms) for p in listed
    )
    refusals = [p.shed_latency_ms for p in listed if p.shed_latency_ms is not None]
    longest = [p.longest_gap_ms for p in listed if p.start_ms is not None]
    return Score(
        requests=len(listed) if requests is None else requests,
        streams=len(ttfa),
        completed=sum(p.final for p in listed),
        stream_minutes=sum(p.played_ms(end_ms) for p in listed) / 60_000.0,
        underruns=sum(p.underruns for p in listed),
        underrun_s=sum(p.underrun_ms for p in listed) / 1000.0,
        ttfa_p50_ms=percentile(ttfa, 0.5),
        ttfa_p99_ms=percentile(ttfa, 0.99),
        start_silence_s=sum(silence) / 1000.0,
        start_silence_p50_ms=percentile(silence, 0.5),
        start_silence_p99_ms=percentile(silence, 0.99),
        start_slo_ms=start_slo_ms,
        gap_slo_ms=gap_slo_ms,
        good=outcomes["good"],
        late=outcomes["late"],
        gappy=outcomes["gappy"],
        shed=outcomes["shed"],
        unfinished=outcomes["unfinished"],
        shed_p99_ms=percentile(refusals, 0.99),
        longest_gap_p95_ms=percentile(longest, 0.95),
    )


@dataclass(slots=True)
class Delivery:
    """Network delay from engine to players: `median + Exp(jitter)`, never reordering a stream."""

    median_ms: float
    jitter_ms: float
    seed: int
    _rng: random.Random = field(init=False, repr=False)
    _last: dict[str, float] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(f"network/{self.seed}")  # noqa: S311 - a simulation

    def arrival_ms(self, chunk: Chunk, extra_ms: float = 0.0) -> float:
        """When `chunk` reaches its player (`extra_ms`: a slow network's added delay)."""
        jitter = self._rng.expovariate(1.0 / self.jitter_ms) if self.jitter_ms > 0 else 0.0
        t = max(chunk.t_ms + self.median_ms + jitter + extra_ms, self._last.get(chunk.request, 0.0))
        if chunk.final:
            self._last.pop(chunk.request, None)
        else:
            self._last[chunk.request] = t
        return t
